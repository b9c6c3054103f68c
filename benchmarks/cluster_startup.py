"""Seconds from nothing to a ready process group: engines up, torch imported, group joined.

Compares lib_dist's `Cluster` with plain ipyparallel doing the same job with its defaults
(`ipp.Cluster(n).start_and_connect_sync()`, then importing torch and joining a gloo group on
every engine), in the same process, median of `--runs` runs each, and prints the ratio.

    python benchmarks/cluster_startup.py [--runs 3] [--sizes 2 4]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import ipyparallel as ipp

from lib_dist.cluster import Cluster
from lib_dist.cluster import engine


def lib_dist_ready(n: int) -> float:
    start = time.perf_counter()
    cluster = Cluster(n).start()
    elapsed = time.perf_counter() - start
    assert cluster.run(lambda comm: comm.world_size) == [n] * n
    cluster.stop()
    return elapsed


def plain_ipyparallel_ready(n: int) -> float:
    start = time.perf_counter()
    cluster = ipp.Cluster(n=n, log_level=logging.ERROR)
    client = cluster.start_and_connect_sync()
    ids = sorted(client.ids)
    client[ids].apply_sync(lambda: bool(__import__("torch.distributed")))
    port = client[ids[0]].apply_sync(engine.open_store, n, 60.0)
    joins = [client[e].apply_async(engine.join, r, n, "127.0.0.1", port, "cpu", 60.0)
             for r, e in enumerate(ids)]
    [j.get(60) for j in joins]
    elapsed = time.perf_counter() - start
    client.close()
    cluster.stop_cluster_sync()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    print(f"{'engines':>7}  {'lib_dist s':>10}  {'plain ipp s':>11}  {'ratio':>5}")
    for n in args.sizes:
        ours = statistics.median(lib_dist_ready(n) for _ in range(args.runs))
        plain = statistics.median(plain_ipyparallel_ready(n) for _ in range(args.runs))
        print(f"{n:>7}  {ours:>10.2f}  {plain:>11.2f}  {ours / plain:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
