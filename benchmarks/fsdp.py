"""Module 9's memory savers against torch's own, in the same run: time per training step and the
peak the CPU allocator saw.

1. Recomputation, one process: module 2's GPT deepened to 8 blocks, each block recomputed by
   `lib_dist.recompute` and by `torch.utils.checkpoint` (non-reentrant), and not at all.
2. Sharding, on N = 2 and 4 engines of a `Cluster` (gloo): the same GPT under lib_dist's `FSDP`
   (units: the blocks) and under torch's FSDP2 (`fully_shard` on each block, then the root),
   AdamW. Per rank: milliseconds per step and the step's peak (`measure_peak_memory`); the
   slowest rank's time and the largest peak are reported.

Rounds interleave the variants (medians of `--rounds`), so the machine's moods hit each alike.
Goals (issue): recomputation at most 1.05x torch's time, FSDP at most 1.0x FSDP2's step time,
peak within 5% of FSDP2's.

    python benchmarks/fsdp.py [--rounds 5] [--steps 3] [--ranks 2 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from lib_dist.cluster import Cluster
from lib_dist.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=96, block_size=64, n_layer=8, n_head=4, n_embd=64)
BATCH = 8


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, CONFIG.vocab_size),
                                             y.reshape(-1))


def ms_per_step(model: torch.nn.Module, optimizer: Any, steps: int, seed: int) -> float:
    x, y = batch(seed)
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps * 1e3


# -- recomputation ---------------------------------------------------------------------------

def recomputed(way: str) -> GPT:
    from lib_dist.recompute import TorchCheckpointed, checkpoint_blocks

    torch.manual_seed(0)
    model = GPT(CONFIG)
    if way != "none":
        checkpoint_blocks(model.blocks, wrapper=TorchCheckpointed if way == "torch" else None)
    return model


def recomputation(rounds: int, steps: int) -> dict[str, Any]:
    from lib_dist.train.memory import measure_peak_memory

    ways = ("none", "lib_dist", "torch")
    models = {w: recomputed(w) for w in ways}
    optimizers = {w: torch.optim.AdamW(m.parameters(), lr=1e-3) for w, m in models.items()}
    times: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(rounds):
        for w in ways:
            times[w].append(ms_per_step(models[w], optimizers[w], steps, seed=r))
    x, y = batch(0)
    peaks = {w: measure_peak_memory(models[w], optimizers[w], x, y, lm_loss).peak for w in ways}
    return {"ms": {w: statistics.median(t) for w, t in times.items()}, "peak": peaks}


# -- sharding on real ranks --------------------------------------------------------------------

def sharded_steps(comm, rounds: int, steps: int) -> dict[str, Any]:
    """On each rank: both FSDPs, interleaved; ms per step and peak bytes of each."""
    import copy

    import torch

    from lib_dist.sharding import FSDP
    from lib_dist.sharding.fsdp import torch_fully_sharded
    from lib_dist.train.memory import measure_peak_memory

    torch.manual_seed(0)
    base = GPT(CONFIG)
    ours_model = copy.deepcopy(base)
    ours = FSDP(ours_model, comm, units=list(ours_model.blocks))
    theirs = copy.deepcopy(base)
    torch_fully_sharded(theirs, theirs.blocks, comm.world_size)
    models = {"lib_dist": ours, "FSDP2": theirs}
    optimizers = {w: torch.optim.AdamW(m.parameters(), lr=1e-3) for w, m in models.items()}
    times: dict[str, list[float]] = {w: [] for w in models}
    for r in range(rounds):
        for w, model in models.items():
            comm.barrier()
            times[w].append(ms_per_step(model, optimizers[w], steps, seed=100 * r + comm.rank))
    x, y = batch(comm.rank)
    peaks = {}
    for w, model in models.items():
        comm.barrier()
        peaks[w] = measure_peak_memory(model, optimizers[w], x, y, lm_loss).peak
    return {"ms": {w: statistics.median(t) for w, t in times.items()}, "peak": peaks}


def sharding(ranks: int, rounds: int, steps: int) -> dict[str, Any]:
    with Cluster(ranks, timeout=120) as cluster:
        per_rank = cluster.run(sharded_steps, rounds, steps)
    return {"ms": {w: max(r["ms"][w] for r in per_rank) for w in ("lib_dist", "FSDP2")},
            "peak": {w: max(r["peak"][w] for r in per_rank) for w in ("lib_dist", "FSDP2")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    mib = 2 ** 20
    print(f"GPT {CONFIG.n_layer} blocks x {CONFIG.n_embd} wide, batch {BATCH} x "
          f"{CONFIG.block_size}, float32, AdamW; medians of {args.rounds} rounds of "
          f"{args.steps} steps")
    found = recomputation(args.rounds, args.steps)
    for way in ("none", "lib_dist", "torch"):
        print(f"recomputation {way:9s} {found['ms'][way]:7.1f} ms/step, peak "
              f"{found['peak'][way] / mib:6.2f} MiB")
    print(f"lib_dist / torch.utils.checkpoint: {found['ms']['lib_dist'] / found['ms']['torch']:.2f}"
          f" time (goal: at most 1.05), {found['peak']['lib_dist'] / found['peak']['torch']:.2f}"
          f" peak; recomputing costs {found['ms']['lib_dist'] / found['ms']['none']:.2f}x the "
          f"plain step and saves {1 - found['peak']['lib_dist'] / found['peak']['none']:.0%} "
          f"of its peak")
    for n in args.ranks:
        found = sharding(n, args.rounds, args.steps)
        ms, peak = found["ms"], found["peak"]
        print(f"{n} ranks: lib_dist FSDP {ms['lib_dist']:7.1f} ms/step, peak "
              f"{peak['lib_dist'] / mib:6.2f} MiB; FSDP2 {ms['FSDP2']:7.1f} ms/step, peak "
              f"{peak['FSDP2'] / mib:6.2f} MiB; lib_dist / FSDP2: "
              f"{ms['lib_dist'] / ms['FSDP2']:.2f} time (goal: at most 1.0), "
              f"{peak['lib_dist'] / peak['FSDP2']:.2f} peak (goal: within 5%)")


if __name__ == "__main__":
    main()
