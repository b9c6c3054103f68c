"""Data parallel on engine clusters: time per training step of the tiny GPT, as ratios to DDP's.

The course's tiny GPT (vocabulary 96, context 64, 2 layers, 4 heads, width 64: 0.1 M
parameters, 0.4 MB of float32 gradients) trained with AdamW, each rank on its own batch of
`--batch` sequences of 64 tokens, on 4 ranks of a lib_dist `Cluster`, one step of each variant
being:

- torch DDP: `torch.nn.parallel.DistributedDataParallel` over gloo, the baseline, and the same
  once more ("DDP again"): its ratio to the baseline is the noise of the measurement;
- lib_dist: `lib_dist.data_parallel.DataParallel` (buckets of 25 MiB: one, here);
- lab solution: lab 4's `DataParallel`, the instructor's solution loaded from solutions/ with
  `lib_dist.definitions`;
- naive: `lib_dist.data_parallel.average_gradients` after backward, one all-reduce per
  parameter tensor (of 28), none overlapped with backward;
- horovod: `lib_dist.horovod`'s `DistributedOptimizer` (Tensor Fusion: 128 MiB, one bucket),
  every bucket's all-reduce negotiated and checked (one small all-gather of the ranks'
  requests first), and "hvd unchecked", the same with the checks off (`LIB_DIST_HVD_CHECKS=0`):
  the difference is what the mismatch checks cost a step;
- no sync: the same step without communication: what each rank computes, with the other
  ranks computing beside it. A variant's excess over it is what its communication costs.

In every round each variant runs `--steps` steps (after warm-up steps, outside the timing), in
an order shuffled per round (the same on every rank: the steps are collective), each from a
barrier; a variant's time in a round is the slowest rank's mean step. The table shows, per
variant, the median over rounds of its step time and of its ratio to DDP's in the same round
(below 1: faster than DDP). Each rank gets cpu_count // ranks threads (at least 1), as torchrun
gives its processes.

Then tokens/s on 1, 2 and 4 ranks of lib_dist's DataParallel and of DDP, each rank with the
same batch (weak scaling), and the scaling efficiency tokens/s(N) / (N tokens/s(1)): on a
machine with fewer cores than ranks it can only fall, since the ranks then share the cores.

What limits lib_dist here: the tiny GPT's whole gradient fits in one bucket, so nothing
overlaps with backward, and each step pays one all-reduce of 0.4 MB once backward is over, on
top of the compute ("no sync"). That all-reduce goes through shared memory, a fraction of
gloo's time at this size (benchmarks/allreduce.py), where DDP's goes through gloo. Handing the
bucket to a background thread and back costs a few milliseconds more: on one rank, where DDP's
C++ reducer has nothing to send, that hand-off is what lib_dist's step costs over DDP's.

    python benchmarks/data_parallel.py [--ranks 1 2 4] [--rounds 7] [--steps 5] [--batch 16]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

import torch

from lib_dist.cluster import Cluster
from lib_dist.extend import definitions

from rounds import interleaved  # benchmarks/rounds.py, beside this script

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "solutions" / "lab04_data_parallel" / "lab04_data_parallel.ipynb"
VARIANTS = ("torch DDP", "DDP again", "lib_dist", "lab solution", "naive", "horovod",
            "hvd unchecked", "no sync")
SCALING = ("torch DDP", "lib_dist")
CONTEXT, VOCAB = 64, 96


def make_step(name: str, comm, lab_data_parallel):
    """One training step of variant `name` on a fresh tiny GPT (the same on every rank): a
    function of (x, y)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from lib_dist.data_parallel import DataParallel, average_gradients
    from lib_dist.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, n_layer=2, n_head=4, n_embd=64))
    wrapped: torch.nn.Module = model
    if name in ("torch DDP", "DDP again"):
        wrapped = DistributedDataParallel(model)
    elif name == "lib_dist":
        wrapped = DataParallel(model, comm)
    elif name == "lab solution":
        wrapped = lab_data_parallel(model, comm)
    optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if name in ("horovod", "hvd unchecked"):
        import lib_dist.horovod as hvd

        hvd.init()
        queue = hvd.basics.state().queue
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if name == "hvd unchecked":  # as LIB_DIST_HVD_CHECKS=0, for this variant's steps only
            queue.check = False  # (the queue is empty between steps, on every rank alike)
        optimizer.zero_grad(set_to_none=True)
        logits = wrapped(x)
        F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
        if name == "naive":
            average_gradients(comm, model)
        optimizer.step()
        if name == "hvd unchecked":
            queue.check = True

    dist.barrier()
    return step


def measure(comm, variants: tuple[str, ...], rounds: int, steps: int, batch: int,
            threads: int, lab_data_parallel) -> dict[str, list[float]]:
    """Seconds per step of each variant on this rank, round by round (see the docstring)."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    comm.all_reduce(torch.zeros(1))  # the tuner's calibration, before any timing
    generator = torch.Generator().manual_seed(1000 + comm.rank)
    x = torch.randint(VOCAB, (batch, CONTEXT), generator=generator)
    y = torch.randint(VOCAB, (batch, CONTEXT), generator=generator)
    runs = {name: make_step(name, comm, lab_data_parallel) for name in variants}
    for run in runs.values():  # warm up: first-call allocations, the tuner, autograd's caches
        for _ in range(2):
            run(x, y)
    calls = {name: functools.partial(run, x, y) for name, run in runs.items()}
    return interleaved(comm, calls, rounds, steps)[0]


def run_cluster(n: int, variants: tuple[str, ...], args, lab_data_parallel) -> dict:
    """{variant: (median seconds per step, median ratio to DDP within a round)} on n ranks."""
    threads = max(1, (os.cpu_count() or 1) // n)
    with Cluster(n, timeout=900) as cluster:
        per_rank = cluster.run(measure, variants, args.rounds, args.steps, args.batch, threads,
                               lab_data_parallel, timeout=900)
    slowest = {v: [max(ts) for ts in zip(*(r[v] for r in per_rank))] for v in variants}
    return {v: (statistics.median(slowest[v]),
                statistics.median(t / d for t, d in zip(slowest[v], slowest["torch DDP"])))
            for v in variants}


def report(n: int, results: dict, batch: int) -> list[str]:
    lines = [f"{n} ranks, batch {batch} x {CONTEXT} tokens per rank: time per training step "
             f"(median over rounds; ratio: to DDP's in the same round)",
             f"{'variant':>14} {'ms/step':>9} {'ratio':>7} {'tokens/s':>10}"]
    for v, (seconds, ratio) in results.items():
        lines.append(f"{v:>14} {seconds * 1e3:9.1f} {ratio:7.2f} "
                     f"{n * batch * CONTEXT / seconds:10.0f}")
    return lines


def scaling(all_results: dict[int, dict], batch: int) -> list[str]:
    sizes = sorted(all_results)
    lines = [f"tokens/s by ranks (weak scaling: {batch} x {CONTEXT} tokens per rank), and the "
             f"scaling efficiency tokens/s(N) / (N x tokens/s(1)) on {os.cpu_count()} cores",
             f"{'variant':>14} " + " ".join(f"{f'{n} ranks':>16}" for n in sizes)]
    for v in SCALING:
        if any(v not in all_results[n] for n in sizes):
            continue
        one = batch * CONTEXT / all_results[sizes[0]][v][0] / sizes[0]
        cells = []
        for n in sizes:
            rate = n * batch * CONTEXT / all_results[n][v][0]
            cells.append(f"{rate:9.0f} ({rate / (n * one):4.0%})")
        lines.append(f"{v:>14} " + " ".join(f"{c:>16}" for c in cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4],
                        help="world sizes; the largest runs every variant, the others "
                             "DDP and lib_dist (tokens/s)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank")
    args = parser.parse_args()
    lab_data_parallel = definitions(LAB, "DataParallel").DataParallel
    start = time.perf_counter()
    all_results = {}
    for n in sorted(args.ranks, reverse=True):
        variants = VARIANTS if n == max(args.ranks) else SCALING
        all_results[n] = run_cluster(n, variants, args, lab_data_parallel)
        print("\n".join(report(n, all_results[n], args.batch)), end="\n\n", flush=True)
    print("\n".join(scaling(all_results, args.batch)))
    print(f"\n{time.perf_counter() - start:.0f} s in all; load average now "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
