"""`python -m lib_dist.demo`: four ranks on ipyparallel engines all-reduce a tensor, and show
their messages. (`make demo` runs the grader's demo instead, `python -m grader demo`.)

Starts a 4-rank cluster, checks torch.distributed's all_reduce against the sum computed
here, runs a ring all-reduce built from point-to-point messages, prints each rank's traffic
and the alpha-beta model's time for it, and writes a Chrome trace to open in Perfetto.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lib_dist.cluster import Cluster
from lib_dist.comm import AlphaBeta, Communicator
from lib_dist.comm.algorithms import ring


def native_all_reduce(comm: Communicator, n: int) -> torch.Tensor:
    t = torch.arange(n, dtype=torch.float32) * (comm.rank + 1)
    return comm.all_reduce(t)


def ring_all_reduce(comm: Communicator, n: int) -> torch.Tensor:
    """Reduce-scatter then all-gather around the ring: 2(N-1) messages of n/N per rank."""
    t = torch.arange(n, dtype=torch.float32) * (comm.rank + 1)
    ring(comm, t)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--out", type=Path, default=Path("build/demo"))
    args = parser.parse_args()
    n, world = args.elements, args.ranks
    expected = torch.arange(n, dtype=torch.float32) * sum(range(1, world + 1))

    with tqdm(total=3, desc="demo", unit="step", bar_format="{l_bar}{bar:20}{r_bar}") as bar:
        start = time.perf_counter()
        bar.set_postfix_str(f"starting {world} engines")
        with Cluster(world, timeout=60) as cluster:
            ready = time.perf_counter() - start
            bar.update()
            bar.set_postfix_str("torch.distributed all_reduce")
            native = cluster.run(native_all_reduce, n)
            bar.update()
            bar.set_postfix_str("ring all-reduce over isend/recv")
            ring = cluster.run(ring_all_reduce, n)
            bar.update()
            trace = cluster.trace
            ranks = cluster.ranks
            backend = cluster.backend

    print(f"\n{world} ranks ready in {ready:.2f} s ({backend}); engines, pids and devices:")
    for rank, info in enumerate(ranks):
        print(f"  rank {rank}: engine {info['engine']}, pid {info['pid']}, {info['device']}")
    for name, results in (("all_reduce (torch.distributed)", native), ("ring all-reduce", ring)):
        ok = all(torch.equal(r, expected) for r in results)
        print(f"{name}: every rank holds the sum of {n:,} elements: {'yes' if ok else 'NO'}")
        if not ok:
            raise SystemExit(1)
    print("\nTraffic of the ring all-reduce, per rank:")
    print(trace.format_summary())
    per_rank = 2 * (world - 1) / world * n * 4
    print(f"theory: 2(N-1) = {2 * (world - 1)} messages and 2(N-1)/N * n * 4 B = "
          f"{per_rank:,.0f} B sent per rank")
    model = AlphaBeta(alpha=5e-6, beta=12.5e9)
    print(f"alpha-beta model (alpha 5 us, beta 100 Gbit/s): {trace.modeled_time(model) * 1e3:.3f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ring_trace.json"
    trace.to_chrome_trace(path)
    print(f"Chrome trace: {path} (open it in https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
