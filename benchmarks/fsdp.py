"""Module 9's memory savers against torch's own, in the same run: time per training step and the
peak the CPU allocator saw.

1. Recomputation, one process: module 2's GPT deepened to 8 blocks, each block recomputed by
   `lib_dist.recompute` and by `torch.utils.checkpoint` (non-reentrant), only attention's core
   recomputed (`selective_blocks`), and not at all.
2. Sharding, on N = 2 and 4 engines of a `Cluster` (gloo): the same GPT under lib_dist's ZeRO-2
   (`Zero2Optimizer`: replicated parameters, gradients and AdamW's state sharded), under its
   `FSDP` (units: the blocks), without and with prefetch, and under torch's FSDP2
   (`fully_shard` on each block, then the root), AdamW. Per rank: milliseconds per step and
   the step's peak (`measure_peak_memory`); the slowest rank's time and the largest peak are
   reported.

`--device cuda` runs the same on a GPU (`--ranks 1` on one GPU: NCCL), the peak from CUDA's
allocator (`torch.cuda.max_memory_allocated`) instead of the CPU profiler.

Rounds interleave the variants (medians of `--rounds`), so the machine's moods hit each alike.
Goals (issue): recomputation at most 1.05x torch's time, ZeRO-2 and FSDP at most 1.0x FSDP2's
step time, peak within 5% of FSDP2's.

    python benchmarks/fsdp.py [--rounds 5] [--steps 3] [--ranks 2 4] [--device cuda]
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


def batch(seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size + 1), generator=g)
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, CONFIG.vocab_size),
                                             y.reshape(-1))


def step(model: torch.nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    lm_loss(model(x), y).backward()
    optimizer.step()


def ms_per_step(model: torch.nn.Module, optimizer: Any, steps: int, seed: int,
                device: str = "cpu") -> float:
    x, y = batch(seed, device)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(model, optimizer, x, y)
    synchronize(device)
    return (time.perf_counter() - start) / steps * 1e3


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_bytes(model: torch.nn.Module, optimizer: Any, device: str, seed: int = 0
               ) -> tuple[int, int]:
    """The step's peak and what was held before it: the CPU profiler's (the peak counting what
    was held), or CUDA's (the peak above it)."""
    from lib_dist.train.memory import measure_peak_memory

    x, y = batch(seed, device)
    if not device.startswith("cuda"):
        found = measure_peak_memory(model, optimizer, x, y, lm_loss)
        return found.peak, found.before
    step(model, optimizer, x, y)  # the optimizer's state exists from here on
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step(model, optimizer, x, y)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, before


# -- recomputation ---------------------------------------------------------------------------

WAYS = ("none", "lib_dist", "torch", "selective")


def recomputed(way: str, device: str) -> GPT:
    from lib_dist.recompute import TorchCheckpointed, checkpoint_blocks, selective_blocks

    torch.manual_seed(0)
    model = GPT(CONFIG).to(device)
    if way == "selective":
        selective_blocks(model.blocks)
    elif way != "none":
        checkpoint_blocks(model.blocks, wrapper=TorchCheckpointed if way == "torch" else None)
    return model


def recomputation(rounds: int, steps: int, device: str) -> dict[str, Any]:
    models = {w: recomputed(w, device) for w in WAYS}
    optimizers = {w: torch.optim.AdamW(m.parameters(), lr=1e-3) for w, m in models.items()}
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(rounds):
        for w in WAYS:
            times[w].append(ms_per_step(models[w], optimizers[w], steps, r, device))
    peaks = {w: peak_bytes(models[w], optimizers[w], device)[0] for w in WAYS}
    return {"ms": {w: statistics.median(t) for w, t in times.items()}, "peak": peaks}


# -- sharding on real ranks --------------------------------------------------------------------

SHARDED = ("ZeRO-2", "lib_dist", "prefetch", "FSDP2")


def sharded_steps(comm, rounds: int, steps: int) -> dict[str, Any]:
    """On each rank: ZeRO-2 and the three FSDPs, interleaved; ms per step and peak bytes of
    each."""
    import copy

    import torch

    from lib_dist.sharding import FSDP, Zero2Optimizer
    from lib_dist.sharding.fsdp import torch_fully_sharded

    device = str(comm.device)
    torch.manual_seed(0)
    base = GPT(CONFIG).to(device)
    models: dict[str, torch.nn.Module] = {"ZeRO-2": copy.deepcopy(base)}
    for way in ("lib_dist", "prefetch"):
        inner = copy.deepcopy(base)
        models[way] = FSDP(inner, comm, units=list(inner.blocks), prefetch=way == "prefetch")
    models["FSDP2"] = theirs = copy.deepcopy(base)
    torch_fully_sharded(theirs, theirs.blocks, comm.world_size, comm.device.type)
    optimizers: dict[str, Any] = {w: torch.optim.AdamW(m.parameters(), lr=1e-3)
                                  for w, m in models.items() if w != "ZeRO-2"}
    optimizers["ZeRO-2"] = Zero2Optimizer(models["ZeRO-2"].parameters(), comm,
                                          torch.optim.AdamW, lr=1e-3)
    times: dict[str, list[float]] = {w: [] for w in models}
    for r in range(rounds):
        for w, model in models.items():
            comm.barrier()
            times[w].append(ms_per_step(model, optimizers[w], steps, 100 * r + comm.rank,
                                        device))
    peaks, held = {}, {}
    for w, model in models.items():
        comm.barrier()
        peaks[w], held[w] = peak_bytes(model, optimizers[w], device, seed=comm.rank)
    return {"ms": {w: statistics.median(t) for w, t in times.items()}, "peak": peaks,
            "before": held}


def sharding(ranks: int, rounds: int, steps: int, device: str) -> dict[str, Any]:
    with Cluster(ranks, timeout=120, device=device) as cluster:
        per_rank = cluster.run(sharded_steps, rounds, steps)
    return {"ms": {w: max(r["ms"][w] for r in per_rank) for w in SHARDED},
            "peak": {w: max(r["peak"][w] for r in per_rank) for w in SHARDED},
            "before": {w: max(r["before"][w] for r in per_rank) for w in SHARDED}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    mib = 2 ** 20
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"GPT {CONFIG.n_layer} blocks x {CONFIG.n_embd} wide, batch {BATCH} x "
          f"{CONFIG.block_size}, float32, AdamW, on {where}; medians of {args.rounds} rounds "
          f"of {args.steps} steps")
    found = recomputation(args.rounds, args.steps, args.device)
    ms, peak = found["ms"], found["peak"]
    for way in WAYS:
        print(f"recomputation {way:9s} {ms[way]:7.2f} ms/step, peak {peak[way] / mib:6.2f} MiB")
    print(f"lib_dist / torch.utils.checkpoint: {ms['lib_dist'] / ms['torch']:.2f} time (goal: "
          f"at most 1.05), {peak['lib_dist'] / peak['torch']:.2f} peak; recomputing costs "
          f"{ms['lib_dist'] / ms['none']:.2f}x the plain step and saves "
          f"{1 - peak['lib_dist'] / peak['none']:.0%} of its peak; selective "
          f"{ms['selective'] / ms['none']:.2f}x for {1 - peak['selective'] / peak['none']:.0%}")
    for n in args.ranks:
        found = sharding(n, args.rounds, args.steps, args.device)
        ms, peak = found["ms"], found["peak"]
        print(f"{n} rank{'s' if n > 1 else ''}: " + "; ".join(
            f"{w} {ms[w]:7.2f} ms/step, peak {peak[w] / mib:6.2f} MiB" for w in SHARDED))
        for w in ("ZeRO-2", "lib_dist", "prefetch"):
            print(f"  {w} / FSDP2: {ms[w] / ms['FSDP2']:.2f} time (goal: at most 1.0), "
                  f"{peak[w] / peak['FSDP2']:.2f} peak (goal: within 5%)")
        before, params = found["before"], GPT(CONFIG).num_params() * 4
        rise = {w: peak[w] - (before[w] if args.device == "cpu" else 0) for w in SHARDED}
        print(f"  ZeRO-2 holds {before['ZeRO-2'] / mib:.2f} MiB before the step, FSDP2 "
              f"{before['FSDP2'] / mib:.2f}: its whole parameters, less FSDP2's 1/{n} "
              f"({params * (1 - 1 / n) / mib:.2f} MiB; it steps its shard of them in place); "
              f"the step adds {rise['ZeRO-2'] / mib:.2f} MiB to it, "
              f"{rise['FSDP2'] / mib:.2f} to FSDP2's")
        if args.device == "cpu":
            block = sum(p.numel() for p in GPT(CONFIG).blocks[0].parameters()) * 4
            print(f"  (the CPU profiler sees only the main thread's allocations: prefetch's "
                  f"unit in flight, up to one block's {block / mib:.2f} MiB, is not in its peak)")


if __name__ == "__main__":
    main()
