"""ZeRO-1 against data parallel, the second part of benchmarks/mixed_precision.py (which runs it).

ZeRO stage 1 (`lib_dist.mixed_precision.ZeroOptimizer`, AdamW on the rank's 1/N shard:
a reduce-scatter of the gradients, the shard's step, an all-gather of the parameters) on 2
and 4 ranks of a lib_dist `Cluster` (gloo), each rank with its own `--zero-batch` windows,
against plain data parallel: the gradients flattened, averaged by gloo's all-reduce, and
AdamW on every parameter (the baseline; "DP again" its noise), and lib_dist's `DataParallel`
(its all-reduce the tuner's choice, shared memory on one host). Timed with
benchmarks/rounds.py's `interleaved`; a step's time in a round is the slowest rank's. ZeRO's
memory: its `state_bytes()` per rank against the unsharded AdamW's `optimizer_state_bytes`
divided by N (goal: within 5% of 1/N), and `memory.zero_bytes_per_rank`'s prediction.
Before timing, ZeRO's parameters after two steps are checked against data parallel's.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import torch

from lib_dist.cluster import Cluster
from lib_dist.data import TokenBatches
from lib_dist.models import GPTConfig

from rounds import interleaved, median_ratio  # benchmarks/rounds.py, beside this script

CONTEXT = 64
DP = ("DP (gloo all-reduce)", "DP again", "DP (lib_dist DataParallel)", "ZeRO-1")


def zero_measure(comm, config, batches, rounds: int, steps: int, threads: int) -> dict:
    """This rank's seconds per step of each of DP's variants by round, ZeRO's state bytes and
    the unsharded AdamW's, and the largest difference of ZeRO's parameters from DP's."""
    import functools

    import torch
    import torch.nn.functional as F

    from lib_dist.data_parallel import DataParallel
    from lib_dist.mixed_precision import ZeroOptimizer, optimizer_state_bytes
    from lib_dist.models import GPT

    torch.set_num_threads(threads)
    comm.all_reduce(torch.zeros(1))  # the tuner's calibration, before any timing
    x, y = batches[comm.rank]

    def loss_of(model):
        logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    def grad_of(p: torch.Tensor) -> torch.Tensor:
        assert p.grad is not None, "every parameter has a gradient after backward"
        return p.grad

    def build(name):
        torch.manual_seed(0)  # the same model on every rank and in every variant
        model = GPT(config)
        params = list(model.parameters())
        if name == "ZeRO-1":
            zero = ZeroOptimizer(params, comm, torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.99))

            def zero_step():
                zero.zero_grad()
                loss_of(model).backward()
                zero.step()
            return model, zero, zero_step
        optimizer = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.99))
        wrapped = DataParallel(model, comm) if "DataParallel" in name else model

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss_of(wrapped).backward()
            if wrapped is model:  # one all-reduce of the flattened gradients, gloo's
                grads = [grad_of(p) for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads])
                comm.all_reduce(flat, op="avg", algorithm="native")
                for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
                    g.copy_(piece.view_as(g))
            optimizer.step()
        return model, optimizer, step

    built = {name: build(name) for name in ("DP (gloo all-reduce)", "DP again",
                                            "DP (lib_dist DataParallel)", "ZeRO-1")}
    for name in built:  # two steps each: the check below, and the warm-up
        for _ in range(2):
            built[name][2]()
    difference = max((a - b).abs().max().item() for a, b in zip(
        built["ZeRO-1"][0].parameters(), built["DP (gloo all-reduce)"][0].parameters()))
    torch.manual_seed(0)
    moved = max((a - b).abs().max().item() for a, b in zip(
        GPT(config).parameters(), built["DP (gloo all-reduce)"][0].parameters()))
    zero = built["ZeRO-1"][1]
    seconds, _ = interleaved(comm, {name: b[2] for name, b in built.items()}, rounds, steps)
    return {"seconds": seconds, "state_bytes": zero.state_bytes(),
            "unsharded_bytes": optimizer_state_bytes(built["DP (gloo all-reduce)"][1]),
            "parameters": zero.numel, "shard": zero.shard_size, "difference": difference,
            "moved": moved}


def zero_table(args: argparse.Namespace, config: GPTConfig, train_ids: torch.Tensor
               ) -> tuple[list[str], dict]:
    from lib_dist.mixed_precision import zero_bytes_per_rank

    lines = [f"ZeRO-1 against data parallel: batch {args.zero_batch} x {CONTEXT} tokens per "
             f"rank, AdamW; time per step: the slowest rank's, median over {args.zero_rounds} "
             f"rounds of {args.zero_steps}; ratio: to DP (gloo all-reduce) in the same round",
             f"{'ranks':>5} {'variant':>27} {'ms/step':>8} {'ratio':>6}"]
    memory = [f"{'ranks':>5} {'ZeRO state/rank':>16} {'unsharded':>10} {'x N / unsharded':>16}"
              f" {'predicted':>10}  after 2 steps: max |ZeRO - DP| (|DP - init|)"]
    results: dict[str, Any] = {}
    worst = 0.0
    print("\n".join(lines), flush=True)
    for n in args.ranks:
        threads = max(1, (os.cpu_count() or 1) // n)
        batches = [next(TokenBatches(train_ids, block_size=CONTEXT, batch_size=args.zero_batch,
                                     seed=1 + rank)) for rank in range(n)]
        with Cluster(n, timeout=300) as cluster:
            per_rank = cluster.run(zero_measure, config, batches, args.zero_rounds,
                                   args.zero_steps, threads, timeout=600)
        slowest = {v: [max(ts) for ts in zip(*(r["seconds"][v] for r in per_rank))] for v in DP}
        for v in DP:
            lines.append(f"{n:>5} {v:>27} {statistics.median(slowest[v]) * 1e3:8.1f} "
                         f"{median_ratio(slowest, v, DP[0]):6.2f}")
        state = max(r["state_bytes"] for r in per_rank)
        whole = per_rank[0]["unsharded_bytes"]
        predicted = zero_bytes_per_rank(1, n, mixed=False).optimizer_state * per_rank[0][
            "parameters"]
        worst = max(worst, state * n / whole)
        memory.append(f"{n:>5} {state / 2**10:12.1f} KiB {whole / 2**10:6.1f} KiB "
                      f"{state * n / whole:16.4f} {predicted / 2**10:6.1f} KiB  "
                      f"{max(r['difference'] for r in per_rank):.1e} "
                      f"({min(r['moved'] for r in per_rank):.1e})")
        results[n] = {"ranks": per_rank, "threads": threads}
        print("\n".join(lines[-len(DP):]), flush=True)
    lines += ["", "ZeRO-1's optimizer state per rank (moments of its shard, its step count) "
              "against the unsharded AdamW's (moments and one step count per tensor)"] + memory
    lines.append(f"goal, ZeRO-1's state per rank within 5% of 1/N of the unsharded: "
                 f"{'met' if worst <= 1.05 else 'NOT met'} (at most {worst:.4f} x 1/N)")
    print("\n".join(lines[-len(memory) - 2:]), flush=True)
    return lines, results
