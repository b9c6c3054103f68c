"""Tensor parallelism on engine clusters: lib_dist's MLP and attention against torch's DTensor plan.

One transformer block of width 256 with 8 heads (float32, `lib_dist.models.gpt.Block`), its MLP
and its attention each split over 2 and then 4 ranks of a lib_dist `Cluster` (gloo), on a batch
of `--batch` sequences of `--seq` tokens, the same on every rank. One step is a forward and a
backward of one of them, the input's gradient included (it is what the layer below needs, and
what the column-parallel layer's all-reduce backward computes):

- torch: `torch.distributed.tensor.parallel`'s `ColwiseParallel` / `RowwiseParallel` plan
  (`lib_dist.tensor_parallel.dtensor`: fc, and q, k, v column-wise, proj row-wise), its
  all-reduces gloo's: the baseline; "torch again", the same once more: its ratio to torch is
  the measurement's noise;
- lib_dist: `ParallelMLP` / `ParallelAttention` on the rank's `TorchCommunicator`, whose
  all-reduce is the tuner's choice for the size (`lib_dist.comm.fast`; the table's
  footnote says which);
- lib_dist native: the same modules with `comm.all_reduce_algorithm = "native"`: gloo's
  all-reduce, torch's, under lib_dist's f and g;
- compute only: the same shards on every rank with a stand-in communicator that moves
  nothing: the work a step cannot do without, all ranks computing at once.

Time: in every round each variant runs `--steps` steps (after warm-up, outside the timing) in
an order shuffled per round (the same on every rank), each from a barrier; a variant's time in
a round is the slowest rank's mean step. The table shows the median over rounds of that time
and of its ratio to torch's in the same round, and the processor time of all ranks' processes
per step (threads included) with its ratio, taken the same way. Each rank gets
cpu_count // ranks threads (at least 1). Before timing, every variant's output, input
gradient and parameter gradients (this rank's shards) are checked against torch's.

A last pair of rows, "2 all-reduces", times a step's communication alone: two all-reduces of
a copy of the batch's activations (f and g copy before they all-reduce), with gloo's
all-reduce ("gloo native", the baseline of that pair) and with lib_dist's default.

What limits it here is the compute, the same matrix products in both frameworks: lib_dist's
step is "compute only" plus its two all-reduces and a wait at each for the slowest rank. Its
all-reduces go through shared memory, the tuner's choice at this size on one host, some 5
times faster than gloo's (the "2 all-reduces" rows; "lib_dist native" is the whole step with
gloo's instead); the copies f and g make before each all-reduce take some 0.04 ms each
(`clone()` of 512 KiB), under 0.5% of a step. torch's plan computes the same but pays gloo's
all-reduces and, on every call, DTensor's Python work (wrapping the input, propagating
shardings, redistributing): its CPU per step exceeds "compute only" by that much, more for
the attention (four parallel layers) than for the MLP (two). The ranks share the machine's
cores (4 ranks on 2 here, with whatever else runs), so a step takes about the ranks' total
processor time over the cores they get, and the ratios follow the CPU's; "torch again" shows
the noise of a loaded machine.

    python benchmarks/tensor_parallel.py [--ranks 2 4] [--rounds 15] [--steps 3] [--batch 8]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import cast

import torch

from lib_dist.cluster import Cluster
from lib_dist.comm import Communicator

from rounds import interleaved  # benchmarks/rounds.py, beside this script

OUT = Path(__file__).resolve().parent / "out"
KINDS = ("mlp", "attn")
VARIANTS = ("torch", "lib_dist", "lib_dist native", "torch again", "compute only")
COMM = ("gloo native", "lib_dist auto")  # the all-reduces alone: the first is the baseline
WIDTH, HEADS = 256, 8


class Alone:
    """A stand-in communicator for rank `rank` of `world_size`: collectives that move nothing
    (an all-reduce leaves this rank's tensor as it is), for timing the compute alone."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor] * self.world_size

    @classmethod
    def of(cls, rank: int, world_size: int) -> Communicator:
        """One, where the parallel blocks' signatures say Communicator: all they call of it
        is `rank`, `world_size`, `all_reduce` and `all_gather`."""
        return cast(Communicator, cls(rank, world_size))


def build(name: str, kind: str, comm, block, mesh) -> torch.nn.Module:
    from lib_dist.tensor_parallel import ParallelAttention, ParallelMLP
    from lib_dist.tensor_parallel.dtensor import torch_parallel_attention, torch_parallel_mlp

    full = getattr(block, kind)
    if name.startswith("torch"):
        return (torch_parallel_mlp if kind == "mlp" else torch_parallel_attention)(full, mesh)
    ours = ParallelMLP if kind == "mlp" else ParallelAttention
    return ours(full, Alone.of(comm.rank, comm.world_size) if name == "compute only" else comm)


def local_grads(module: torch.nn.Module, kind: str) -> list[torch.Tensor]:
    """This rank's parameter gradients in lib_dist's layout (torch's q, k, v fused back)."""
    from torch.distributed.tensor import DTensor

    grads = {n: g.to_local() if isinstance(g, DTensor) else g
             for n, g in ((n, grad_of(p)) for n, p in module.named_parameters())}
    if kind == "attn" and "q.weight" in grads:
        for part in ("weight", "bias"):
            grads[f"qkv.{part}"] = torch.cat([grads.pop(f"{p}.{part}") for p in "qkv"])
    return [grads[n] for n in sorted(grads)]


def grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "every parameter has a gradient after backward"
    return p.grad


def measure(comm, rounds: int, steps: int, batch: int, seq: int, threads: int) -> dict:
    """This rank's seconds and CPU seconds per step by job ("mlp torch", "comm native", ...)
    and round, and the largest difference of any variant's results from torch's."""
    from lib_dist.models.gpt import Block, GPTConfig
    from lib_dist.tensor_parallel.dtensor import device_mesh

    torch.set_num_threads(threads)
    torch.manual_seed(0)  # the same block on every rank
    block = Block(GPTConfig(vocab_size=2, block_size=seq, n_head=HEADS, n_embd=WIDTH))
    generator = torch.Generator().manual_seed(1)  # the same batch on every rank
    x = torch.randn(batch, seq, WIDTH, generator=generator)
    upstream = torch.randn(batch, seq, WIDTH, generator=generator)
    mesh = device_mesh(comm.world_size)
    default = comm.all_reduce_algorithm
    modules = {(kind, name): build(name, kind, comm, block, mesh)
               for kind in KINDS for name in VARIANTS}

    def step(kind: str, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        comm.all_reduce_algorithm = "native" if "native" in name else default
        if kind == "comm":  # a step's two all-reduces, from copies as f and g make them
            for _ in range(2):
                comm.all_reduce(x.clone())
            return None
        module = modules[kind, name]
        module.zero_grad(set_to_none=True)
        xr = x.detach().requires_grad_()
        y = module(xr)
        y.backward(upstream)
        return y, xr

    errors = {}
    for kind in KINDS:
        want = step(kind, "torch")
        assert want is not None
        want_grads = local_grads(modules[kind, "torch"], kind)
        for name in VARIANTS[1:]:
            got = step(kind, name)
            assert got is not None
            if name == "compute only":
                continue
            error = max((a - b).abs().max().item() for a, b in [
                (got[0], want[0]), (grad_of(got[1]), grad_of(want[1])),
                *zip(local_grads(modules[kind, name], kind), want_grads, strict=True)])
            assert error < 1e-4, f"rank {comm.rank}: {kind} {name} differs from torch's by {error}"
            errors[f"{kind} {name}"] = error
    jobs = [(k, v) for k in KINDS for v in VARIANTS] + [("comm", v) for v in COMM]
    for kind, name in jobs:  # warm up: DTensor's sharding caches, first-call allocations
        step(kind, name)
    seconds, cpu = interleaved(
        comm, {f"{k} {v}": functools.partial(step, k, v) for k, v in jobs}, rounds, steps)
    comm.all_reduce_algorithm = default
    return {"seconds": seconds, "cpu": cpu, "grad_error": max(errors.values()),
            "auto": comm.choose_all_reduce(x.nbytes), "all_reduce_bytes": x.nbytes}


def report(ranks: int, per_rank: list[dict], batch: int, seq: int) -> tuple[list[str], dict]:
    lines = [f"{ranks} ranks: {batch} x {seq} tokens, width {WIDTH}, {HEADS} heads, float32: "
             f"forward + backward per step, median over rounds of the slowest rank's time and "
             f"of its ratio to the baseline's in the same round; CPU: all ranks' processes, and "
             f"its ratio likewise",
             f"{'module':>12} {'variant':>16} {'ms/step':>8} {'ratio':>6} {'CPU ms/step':>11} "
             f"{'CPU ratio':>9}  {'to':<8}"]
    ratios = {}
    rows = [(k, v, "torch") for k in KINDS for v in VARIANTS] + [("comm", v, COMM[0])
                                                                  for v in COMM]
    label = {"mlp": "MLP", "attn": "attention", "comm": "2 all-reduces"}
    for kind, v, base in rows:
        slowest = {name: [max(ts) for ts in zip(*(r["seconds"][f"{kind} {name}"]
                                                  for r in per_rank))] for name in (v, base)}
        cpu = {name: [sum(ts) for ts in zip(*(r["cpu"][f"{kind} {name}"] for r in per_rank))]
               for name in (v, base)}
        ratio = statistics.median(t / b for t, b in zip(slowest[v], slowest[base]))
        cpu_ratio = statistics.median(t / b for t, b in zip(cpu[v], cpu[base]))
        ratios[f"{kind} {v}"] = ratio
        lines.append(f"{label[kind]:>12} {v:>16} {statistics.median(slowest[v]) * 1e3:8.2f} "
                     f"{ratio:6.2f} {statistics.median(cpu[v]) * 1e3:11.2f} {cpu_ratio:9.2f}  "
                     f"{base:<8}")
    worst = max(ratios[f"{k} lib_dist"] for k in KINDS)
    lines += [f"each all-reduce: {per_rank[0]['all_reduce_bytes'] / 1024:.0f} KiB, for which "
              f"lib_dist's tuner (auto) picks {per_rank[0]['auto']!r}",
              f"outputs and gradients: every variant's equal torch's (largest difference "
              f"{max(r['grad_error'] for r in per_rank):.1e})",
              f"goal, lib_dist at most 1.0 x torch's time: {'met' if worst <= 1.0 else 'NOT met'}"
              f" ({worst:.2f}; noise, torch again: "
              f"{max(abs(ratios[f'{k} torch again'] - 1) for k in KINDS):.2f})", ""]
    return lines, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    start = time.perf_counter()
    lines, results = [], {}
    for ranks in args.ranks:
        threads = max(1, (os.cpu_count() or 1) // ranks)
        with Cluster(ranks, timeout=300) as cluster:
            per_rank = cluster.run(measure, args.rounds, args.steps, args.batch, args.seq,
                                   threads, timeout=900)
        table, ratios = report(ranks, per_rank, args.batch, args.seq)
        lines += table
        results[ranks] = {"ranks": per_rank, "ratios": ratios, "threads": threads}
        print("\n".join(table), flush=True)
    lines.append(f"{time.perf_counter() - start:.0f} s in all on {os.cpu_count()} cores; load "
                 f"average now {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    OUT.mkdir(exist_ok=True)
    (OUT / "tensor_parallel.txt").write_text("\n".join(lines) + "\n")
    (OUT / "tensor_parallel.json").write_text(json.dumps({"args": vars(args),
                                                          "results": results}))


if __name__ == "__main__":
    main()
