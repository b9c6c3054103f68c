"""Pipeline parallelism on engine clusters: lib_dist's GPipe and 1F1B against torch's.

The course's tiny GPT deepened to 8 blocks (vocabulary 96, context 64, 4 heads, width 64:
0.4 M parameters) as layers (`lib_dist.pipeline.gpt_layers`), cut by `split_model` into 4
stages, one per rank of a lib_dist `Cluster`. Every variant runs the very same stage module
on each rank, on the same batch of `--batch` sequences of 64 tokens cut into m = 8
micro-batches; one step is forward and backward of every micro-batch, gradients left in
`.grad` (zeroed first; no optimizer):

- torch GPipe, torch 1F1B: `torch.distributed.pipelining`'s `ScheduleGPipe` and
  `Schedule1F1B` on a `PipelineStage` of the rank's module, messages over gloo: the baselines;
  "torch 1F1B again", the same once more: its ratio to torch 1F1B is the measurement's noise;
- lib_dist GPipe, lib_dist 1F1B: `lib_dist.pipeline.gpipe_step` / `one_f_one_b_step` on a
  `Stage` of the same module, messages through the rank's lib_dist communicator.

Time: in every round each variant runs `--steps` steps (after warm-up, outside the timing), in
an order shuffled per round (the same on every rank), each from a barrier; a variant's time in
a round is the slowest rank's mean step. The table shows the median over rounds of that time
and of its ratio to its torch counterpart's (lib_dist GPipe to torch GPipe, and so on) in the
same round. Each rank gets cpu_count // 4 threads (at least 1).

A sixth variant, "compute only", is each rank's 8 forwards and backwards alone (stand-in
inputs, nothing sent), all ranks at once: the work a step cannot do without. The CPU column is
the processor time of the 4 ranks' processes per step, every thread included.

Memory: one step of each variant runs under `torch.autograd.graph.saved_tensors_hooks` that
count the bytes autograd holds for the backward: every tensor a forward saves, each storage
once, from when it is saved until autograd lets it go; not the parameters nor the batch's
inputs and targets, which are there whatever the schedule. Its peak over the step is the
activation memory the schedule decides, measured the same way for torch's stages and ours, and
free of the allocator's and Python's noise that a process's RSS is full of. Next to it,
lib_dist's `Stage.peak_live`, the most micro-batches it held at once, and the goal: 1F1B's peak
at most p/m of GPipe's on every rank. That step also checks that every variant leaves the same
gradients as torch's GPipe.

What limits it here is the CPU, not the schedule. A step's work on the 4 ranks is some 220 to
260 ms of one core ("compute only"'s CPU; the last stage, 2 blocks and the head with its loss
over the vocabulary, costs half as much again as the others: `split_model` balances
parameters, not time), and the pipelines add their messages and bookkeeping to it: 30 to
100 ms of CPU per step, usually more for torch's (gloo's loopback sockets, PipelineStage's
checks per micro-batch) than for lib_dist's (shared memory). Four ranks share 2 cores, and the
machine's other work, so a step takes about the ranks' total CPU time over the cores they
get: one rank's bubble is another's turn on a core, GPipe and 1F1B take the same time, and
lib_dist's ratio to torch follows its CPU's. The noise ("torch 1F1B again") is large when the
machine is loaded. The memory figures do not depend on the machine: rank r's 1F1B holds
p - r micro-batches, GPipe's all m, in both frameworks.

    python benchmarks/pipeline.py [--rounds 7] [--steps 5] [--batch 32]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from pathlib import Path

import torch

from lib_dist.cluster import Cluster

from rounds import interleaved  # benchmarks/rounds.py, beside this script

OUT = Path(__file__).resolve().parent / "out"
PIPELINES = ("torch GPipe", "torch 1F1B", "lib_dist GPipe", "lib_dist 1F1B", "torch 1F1B again")
VARIANTS = (*PIPELINES, "compute only")
BASELINE = {"torch GPipe": "torch GPipe", "torch 1F1B": "torch 1F1B",
            "lib_dist GPipe": "torch GPipe", "lib_dist 1F1B": "torch 1F1B",
            "torch 1F1B again": "torch 1F1B", "compute only": "torch 1F1B"}
P, M = 4, 8
CONTEXT, VOCAB, WIDTH, LAYERS = 64, 96, 64, 8


class SavedBytes:
    """Bytes autograd holds for backward in the `with` block: now (`live`) and at most
    (`peak`), each storage once, but not those of `module`'s parameters nor of `batch` (the
    step's inputs and targets: micro-batches are views of them)."""

    def __init__(self, module: torch.nn.Module, batch: tuple[torch.Tensor, ...]):
        self.skip = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *batch)}
        self.holders: dict[int, int] = {}
        self.live = self.peak = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if key in self.skip or t.device.type == "meta":
            return t
        self.holders[key] = self.holders.get(key, 0) + 1
        if self.holders[key] == 1:
            self.live += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        return _Held(self, t, key)

    @staticmethod
    def unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    def release(self, tensor: torch.Tensor, key: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.live -= tensor.untyped_storage().nbytes()

    def __enter__(self) -> SavedBytes:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)


class _Held:
    """A saved tensor; autograd dropping it is when its bytes stop counting."""

    def __init__(self, counter: SavedBytes, tensor: torch.Tensor, key: int):
        self.counter, self.tensor, self.key = counter, tensor, key

    def __del__(self) -> None:
        self.counter.release(self.tensor, self.key)


def make_step(name: str, comm, module: torch.nn.Module):
    """One training step of variant `name` on this rank's stage: a function of (x, y), and
    the lib_dist `Stage` (None for torch's)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from lib_dist.pipeline import Stage, gpipe_step, next_token_loss, one_f_one_b_step

    first, last = comm.rank == 0, comm.rank == P - 1
    if name == "compute only":  # the stage's work alone: stand-in inputs, nothing sent
        def alone(x: torch.Tensor, y: torch.Tensor) -> None:
            module.zero_grad(set_to_none=True)
            for xj, yj in zip(x.split(len(x) // M), y.split(len(y) // M)):
                inp = xj if first else torch.ones(len(xj), CONTEXT, WIDTH, requires_grad=True)
                out = module(inp)
                if last:
                    (next_token_loss(out, yj) / M).backward()
                else:
                    out.backward(torch.ones_like(out))
        return alone, None
    if name.startswith("lib_dist"):
        stage = Stage(module, comm, boundary_shape=(CONTEXT, WIDTH),
                      loss_fn=next_token_loss if last else None)
        run = gpipe_step if "GPipe" in name else one_f_one_b_step

        def ours(x: torch.Tensor, y: torch.Tensor) -> None:
            module.zero_grad(set_to_none=True)
            run(comm, stage, x, y, M)
        return ours, stage

    cls = ScheduleGPipe if "GPipe" in name else Schedule1F1B
    schedule = cls(PipelineStage(module, comm.rank, P, torch.device("cpu")), M,
                   loss_fn=next_token_loss)

    def theirs(x: torch.Tensor, y: torch.Tensor) -> None:
        module.zero_grad(set_to_none=True)
        schedule.step(*((x,) if first else ()), target=y if last else None,
                      return_outputs=False)
    return theirs, None


def measure(comm, rounds: int, steps: int, batch: int, threads: int) -> dict:
    """This rank's seconds per step by variant and round, and its memory figures."""
    import torch.distributed as dist

    from lib_dist.models import GPTConfig
    from lib_dist.pipeline import gpt_layers, split_model

    torch.set_num_threads(threads)
    config = GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, n_layer=LAYERS, n_head=4,
                       n_embd=WIDTH)
    module = split_model(gpt_layers(config, seed=0), P)[comm.rank]
    generator = torch.Generator().manual_seed(0)  # the same batch on every rank
    x = torch.randint(VOCAB, (batch, CONTEXT), generator=generator)
    y = torch.randint(VOCAB, (batch, CONTEXT), generator=generator)
    made = {name: make_step(name, comm, module) for name in VARIANTS}
    runs = {name: run for name, (run, _) in made.items()}
    for run in runs.values():  # warm up: torch's shape inference, first-call allocations
        run(x, y)
    peak_bytes, grads = {}, {}
    for name in PIPELINES:
        dist.barrier()
        with SavedBytes(module, (x, y)) as saved:
            runs[name](x, y)
        peak_bytes[name] = saved.peak
        grads[name] = [p.grad.clone() for p in module.parameters()]
    errors = {name: max((a - b).abs().max().item() for a, b in zip(g, grads["torch GPipe"]))
              for name, g in grads.items()}
    for name, g in grads.items():
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6)
                   for a, b in zip(g, grads["torch GPipe"])), \
            f"rank {comm.rank}: {name}'s gradients differ from torch GPipe's by {errors[name]}"
    seconds, cpu = interleaved(
        comm, {name: functools.partial(runs[name], x, y) for name in VARIANTS}, rounds, steps)
    peak_live = {name: stage.peak_live for name, (_, stage) in made.items() if stage}
    return {"seconds": seconds, "cpu": cpu, "peak_bytes": peak_bytes, "peak_live": peak_live,
            "grad_error": max(errors.values()),
            "parameters": sum(p.numel() for p in module.parameters())}


def report(per_rank: list[dict], batch: int) -> list[str]:
    slowest = {v: [max(ts) for ts in zip(*(r["seconds"][v] for r in per_rank))]
               for v in VARIANTS}
    lines = [f"{P} ranks, {LAYERS}-block GPT in {P} stages (parameters by rank: "
             f"{[r['parameters'] for r in per_rank]}), batch {batch} x {CONTEXT} tokens in "
             f"m = {M} micro-batches: time per training step (median over rounds; ratio: to "
             f"the torch schedule's in the same round; CPU: the processor time of all ranks' "
             f"processes, threads included)",
             f"{'variant':>17} {'ms/step':>9} {'ratio':>7}  {'to':<11} {'CPU ms/step':>11}"]
    cpu = {v: [sum(ts) for ts in zip(*(r["cpu"][v] for r in per_rank))] for v in VARIANTS}

    def ratio(v: str) -> float:
        return statistics.median(t / b for t, b in zip(slowest[v], slowest[BASELINE[v]]))

    for v in VARIANTS:
        lines.append(f"{v:>17} {statistics.median(slowest[v]) * 1e3:9.1f} {ratio(v):7.2f}  "
                     f"{BASELINE[v]:<11} {statistics.median(cpu[v]) * 1e3:11.1f}")
    lines += ["", "activation memory per rank: peak bytes autograd held for backward "
              "(KiB), lib_dist's Stage.peak_live (micro-batches), and 1F1B / GPipe against "
              f"the goal p/m = {P / M:.2f}",
              f"{'rank':>4} " + " ".join(f"{v:>16}" for v in VARIANTS[:4]) +
              f" {'live GPipe':>10} {'live 1F1B':>9} {'torch 1F1B/GPipe':>16} "
              f"{'ours 1F1B/GPipe':>15}"]
    for rank, r in enumerate(per_rank):
        kib = r["peak_bytes"]
        lines.append(f"{rank:>4} " + " ".join(f"{kib[v] / 1024:16.0f}" for v in VARIANTS[:4]) +
                     f" {r['peak_live']['lib_dist GPipe']:>10} "
                     f"{r['peak_live']['lib_dist 1F1B']:>9} "
                     f"{kib['torch 1F1B'] / kib['torch GPipe']:16.2f} "
                     f"{kib['lib_dist 1F1B'] / kib['lib_dist GPipe']:15.2f}")
    lines.append(f"\ngradients: every variant's equal torch GPipe's (largest difference "
                 f"{max(r['grad_error'] for r in per_rank):.1e})")
    worst_time = max(ratio(v) for v in ("lib_dist GPipe", "lib_dist 1F1B"))
    worst_memory = max(r["peak_bytes"]["lib_dist 1F1B"] / r["peak_bytes"]["lib_dist GPipe"]
                       for r in per_rank)
    lines += [f"goal, lib_dist at most 1.1 x torch's time per step: "
              f"{'met' if worst_time <= 1.1 else 'NOT met'} ({worst_time:.2f})",
              f"goal, lib_dist 1F1B's peak activations at most p/m = {P / M:.2f} of GPipe's on "
              f"every rank: {'met' if worst_memory <= P / M else 'NOT met'} ({worst_memory:.3f})"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--batch", type=int, default=32,
                        help=f"sequences per step, a multiple of m = {M}")
    args = parser.parse_args()
    if args.batch % M:
        parser.error(f"--batch must be a multiple of m = {M}")
    start = time.perf_counter()
    threads = max(1, (os.cpu_count() or 1) // P)
    with Cluster(P, timeout=300) as cluster:
        per_rank = cluster.run(measure, args.rounds, args.steps, args.batch, threads,
                               timeout=900)
    lines = report(per_rank, args.batch)
    lines.append(f"\n{time.perf_counter() - start:.0f} s in all, {threads} thread(s) per rank "
                 f"on {os.cpu_count()} cores; load average now {os.getloadavg()[0]:.2f}")
    print("\n".join(lines))
    OUT.mkdir(exist_ok=True)
    (OUT / "pipeline.txt").write_text("\n".join(lines) + "\n")
    (OUT / "pipeline.json").write_text(json.dumps({"args": vars(args), "ranks": per_rank}))


if __name__ == "__main__":
    main()
