"""All-reduce on engine clusters: the course's rings against gloo's, as time ratios per size.

All-reduces of a float32 tensor, on 2 and 4 ranks of a lib_dist `Cluster`:

- ring: lab 3's `ring_all_reduce`, the instructor's solution loaded from solutions/ with
  `lib_dist.extend.definitions` (2(N-1) messages of n/N elements over `comm.isend`/`irecv`,
  which go through shared memory: the engines share this host);
- ring/sockets: the same function over torch.distributed's isend/irecv, gloo's loopback
  sockets, what `comm` would use between hosts (or with LIB_DIST_MESSAGES=backend);
- naive: `lib_dist.comm.algorithms.gather_broadcast` (every rank to rank 0 and back);
- lib_dist: `comm.all_reduce`, lib_dist's default, whose tuner picks an algorithm per size;
- gloo: `torch.distributed.all_reduce`, the baseline, and the same once more ("gloo again"):
  its ratio to the baseline is the noise of the measurement.

For each size the variants run in rounds, each once per round in a shuffled order, each call
from a barrier, for about `--budget` seconds (5 to 60 rounds). A call's time is the
slowest rank's; the table shows, per variant, the median over rounds of its time divided by
gloo's in the same round (below 1: faster than gloo). Pairing calls within a round and taking
medians see through the noise of a machine whose ranks share cores: there one call in ten or
so waits for the scheduler, whatever the algorithm. Each rank gets
cpu_count // ranks threads (at least 1), as torchrun gives its processes. Writes
benchmarks/out/allreduce.png.

    python benchmarks/allreduce.py [--ranks 2 4] [--budget 2] [--max-mib 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from lib_dist.cluster import Cluster
from lib_dist.comm.algorithms import gather_broadcast
from lib_dist.extend import definitions

from rounds import interleaved  # benchmarks/rounds.py, beside this script

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "solutions" / "lab03_collectives" / "lab03_collectives.ipynb"
OUT = REPO / "benchmarks" / "out"
VARIANTS = ("ring", "ring/sockets", "naive", "lib_dist", "gloo", "gloo again")


class GlooSockets:
    """`comm`'s point-to-point interface straight over torch.distributed: gloo's sockets."""

    def __init__(self, comm):
        self.rank, self.world_size = comm.rank, comm.world_size

    def isend(self, tensor, dst):
        import torch.distributed as dist

        return dist.isend(tensor, dst)

    def irecv(self, buffer, src):
        import torch.distributed as dist

        return dist.irecv(buffer, src)


def prepare(comm, threads: int) -> dict:
    """Set this rank's threads and calibrate lib_dist's tuner (its first all-reduce does)."""
    torch.set_num_threads(threads)
    comm.all_reduce(torch.zeros(1))
    return {"tuner": comm.tuner}


def measure(comm, nbytes: int, rounds: int, ring_all_reduce) -> dict[str, list[float]]:
    """Seconds each variant's call took on this rank, round by round. In every round each
    variant runs once, in a shuffled order (the same on every rank: the calls are collective)
    so that none always follows the same predecessor, each call starting from a barrier (a
    single all-reduce from a common start, as the tuner times them)."""
    import torch.distributed as dist

    x = torch.ones(nbytes // 4)
    sockets = GlooSockets(comm)
    calls = {"ring": lambda: ring_all_reduce(comm, x),
             "ring/sockets": lambda: ring_all_reduce(sockets, x),
             "naive": lambda: gather_broadcast(comm, x.view(-1)),
             "lib_dist": lambda: comm.all_reduce(x),
             "gloo": lambda: dist.all_reduce(x), "gloo again": lambda: dist.all_reduce(x)}
    for name, call in calls.items():  # warm up, and check: x holds world_size everywhere
        x.fill_(1.0)
        call()
        if not torch.equal(x, torch.full_like(x, float(comm.world_size))):
            raise AssertionError(f"{name} gave a wrong sum on rank {comm.rank}")
    return interleaved(comm, {name: calls[name] for name in VARIANTS}, rounds)[0]


def sweep(cluster: Cluster, sizes: list[int], budget: float, ring) -> dict:
    """{(variant, nbytes): (median seconds, median ratio to gloo within a round)}."""
    results = {}
    for nbytes in sizes:
        probe = _slowest(cluster.run(measure, nbytes, 1, ring))
        rounds = max(5, min(60, int(budget / sum(t[0] for t in probe.values()))))
        slowest = _slowest(cluster.run(measure, nbytes, rounds, ring))
        for v in VARIANTS:
            ratios = [t / g for t, g in zip(slowest[v], slowest["gloo"])]
            results[(v, nbytes)] = (statistics.median(slowest[v]), statistics.median(ratios))
    return results


def _slowest(per_rank: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per variant and round, the slowest rank's time."""
    return {v: [max(ts) for ts in zip(*(r[v] for r in per_rank))] for v in VARIANTS}


def report(n: int, sizes: list[int], results: dict, tuner) -> list[str]:
    shown = [v for v in VARIANTS if v != "gloo"]
    lines = [f"{n} ranks: time per all-reduce as a ratio to gloo's (medians)",
             f"{'size':>9} {'gloo ms':>9} " + " ".join(f"{v:>12}" for v in shown)
             + "  lib_dist runs"]
    for s in sizes:
        gloo = results[("gloo", s)][0]
        lines.append(f"{_size(s):>9} {gloo * 1e3:9.3f} "
                     + " ".join(f"{results[(v, s)][1]:12.2f}" for v in shown)
                     + f"  {tuner.choose(s)}")
    return lines


def plot(all_results: dict[int, dict], sizes: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_results), figsize=(6 * len(all_results), 4.2),
                             squeeze=False)
    for ax, (n, results) in zip(axes[0], all_results.items()):
        for v in VARIANTS[:-1]:
            ax.plot(sizes, [results[(v, s)][0] * 1e3 for s in sizes], marker="o", label=v)
        ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes)",
               ylabel="ms per all-reduce", title=f"{n} ranks, float32, median over rounds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--budget", type=float, default=2.0,
                        help="seconds of timed calls per size (5 to 60 rounds)")
    parser.add_argument("--max-mib", type=int, default=64)
    args = parser.parse_args()
    sizes = [1 << k for k in range(10, 21 + (args.max_mib.bit_length() - 1), 2)]
    ring = definitions(LAB, "ring_all_reduce").ring_all_reduce
    all_results = {}
    start = time.perf_counter()
    for n in args.ranks:
        with Cluster(n, timeout=600) as cluster:
            tuner = cluster.run(prepare, max(1, (os.cpu_count() or 1) // n))[0]["tuner"]
            all_results[n] = sweep(cluster, sizes, args.budget, ring)
        print("\n".join(report(n, sizes, all_results[n], tuner)), end="\n\n", flush=True)
    path = OUT / "allreduce.png"
    plot(all_results, sizes, path)
    print(f"plot: {path} ({time.perf_counter() - start:.0f} s in all; load average now "
          f"{os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
