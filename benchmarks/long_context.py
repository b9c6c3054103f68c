"""Module 10's long sequences: ring attention against all-gathering the keys and values, on 2
and 4 engines of a `Cluster` (gloo), in the same run, at growing sequence lengths.

One causal attention (batch 1, 4 heads of 16, float32) over a sequence dealt zig-zag over the
ranks; per rank: forward + backward milliseconds (medians of interleaved rounds; the slowest
rank reported) and the CPU allocator's peak during them (the largest rank reported), against
one rank's ring attention over the whole sequence divided by N (memory should fall as 1/N).
Then the expert-parallel MoE layer (`lib_dist.experts.ExpertParallelMoE`: 8 experts, top 2,
capacity factor 1.25, 4 x 256 tokens of width 128 per rank): a forward + backward step with
the communicator's `all_to_all` (traced; its sizes agreed through the counts every rank
gathers, with the rows' dtype and width checked there) against the same layer on torch's
`all_to_all_single` called directly, untraced.
Goals (issue): ring attention's memory per rank within 10% of 1/N of one rank's, its time at
most 1.0x the all-gather variant's at the longest length; the MoE step at most 1.0x the torch
all-to-all variant's.

    python benchmarks/long_context.py [--lengths 512 1024 2048] [--ranks 2 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, cast

import torch

from lib_dist.cluster import Cluster

HEADS, HEAD_SIZE = 4, 16


def peak_during(fn: Callable[[], Any]) -> int:
    """The most bytes the CPU allocator held at once during `fn()`, above what it held before
    (the main thread's allocations: what the profiler records)."""
    from lib_dist.train.memory import cpu_allocations, profiled_events

    now = peak = 0
    for _, change in cpu_allocations(profiled_events(fn)):
        now += change
        peak = max(peak, now)
    return peak


def attention_run(comm: Any, seq_len: int, way: str) -> Callable[[], None]:
    """Forward and backward of this rank's share of one causal attention, as a callable."""
    from lib_dist.context_parallel import Layout, gathered_attention, ring_attention

    layout = Layout(seq_len, comm.world_size)
    g = torch.Generator().manual_seed(0)
    q, k, v = (layout.shard(torch.randn(1, HEADS, seq_len, HEAD_SIZE, generator=g), comm.rank)
               .requires_grad_() for _ in range(3))
    attention = ring_attention if way == "ring" else gathered_attention

    def run() -> None:
        attention(q, k, v, comm, layout).sum().backward()
    return run


def per_rank(comm: Any, lengths: list[int], rounds: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    ways = ("ring", "gathered")
    out: dict[str, Any] = {}
    for seq_len in lengths:
        runs = {w: attention_run(comm, seq_len, w) for w in ways}
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(rounds):
            for w in ways:
                comm.barrier()
                start = time.perf_counter()
                runs[w]()
                times[w].append((time.perf_counter() - start) * 1e3)
        peaks = {}
        for w in ways:
            comm.barrier()
            peaks[w] = peak_during(runs[w])
        out[str(seq_len)] = {"ms": {w: statistics.median(t) for w, t in times.items()},
                             "peak": peaks}
    return out


class TorchAllToAll:
    """`comm`, its `all_to_all` replaced by one torch.distributed `all_to_all_single` of the
    flattened tensors, with no agreement check and no trace: the baseline."""

    def __init__(self, comm: Any):
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_to_all(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                   agreed: bool = False) -> list[torch.Tensor]:
        """`agreed` is taken and ignored: this baseline never checks."""
        import torch.distributed as dist

        sent = torch.cat([t.reshape(-1) for t in inputs])
        got = sent.new_empty(sum(t.numel() for t in outputs))
        dist.all_to_all_single(got, sent, [t.numel() for t in outputs],
                               [t.numel() for t in inputs])
        for t, part in zip(outputs, got.split([t.numel() for t in outputs])):
            t.copy_(part.view_as(t))
        return outputs


def moe_steps(comm: Any, rounds: int) -> dict[str, float]:
    """ms per forward + backward of the expert-parallel layer, both all-to-alls, interleaved
    (alternating which goes first)."""
    from lib_dist.experts import MoE, ExpertParallelMoE

    torch.set_num_threads(1)
    torch.manual_seed(0)
    moe = MoE(128, 8, k=2, capacity_factor=1.25)
    layers = {"lib_dist": ExpertParallelMoE(moe, comm),
              "torch": ExpertParallelMoE(moe, cast(Any, TorchAllToAll(comm)))}
    x = torch.randn(4, 256, 128, generator=torch.Generator().manual_seed(comm.rank))
    times: dict[str, list[float]] = {w: [] for w in layers}
    for r in range(rounds + 1):  # the first round warms up
        # each goes first in every other round: the one run second finds warmer caches
        for w, layer in (list(layers.items()) if r % 2 else list(layers.items())[::-1]):
            comm.barrier()
            start = time.perf_counter()
            out, aux = layer(x)
            (out.pow(2).mean() + 0.01 * aux).backward()
            layer.sync_router_grads()
            if r:
                times[w].append((time.perf_counter() - start) * 1e3)
    return {w: statistics.median(t) for w, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    mib = 2 ** 20
    print(f"causal attention, batch 1, {HEADS} heads of {HEAD_SIZE}, float32, zig-zag layout; "
          f"medians of {args.rounds} rounds of forward + backward")
    with Cluster(1, timeout=300) as cluster:
        [alone] = cluster.run(per_rank, args.lengths, 1)
    for n in args.ranks:
        with Cluster(n, timeout=300) as cluster:
            ranks = cluster.run(per_rank, args.lengths, args.rounds)
        for seq_len in map(str, args.lengths):
            ms = {w: max(r[seq_len]["ms"][w] for r in ranks) for w in ("ring", "gathered")}
            peak = {w: max(r[seq_len]["peak"][w] for r in ranks) for w in ("ring", "gathered")}
            share = alone[seq_len]["peak"]["ring"] / n
            print(f"{n} ranks, {seq_len:>5} tokens: ring {ms['ring']:8.1f} ms, peak "
                  f"{peak['ring'] / mib:7.2f} MiB ({peak['ring'] / share:.2f}x one rank's / {n}); "
                  f"all-gather {ms['gathered']:8.1f} ms, peak {peak['gathered'] / mib:7.2f} MiB; "
                  f"ring / all-gather time {ms['ring'] / ms['gathered']:.2f}")
        with Cluster(n, timeout=300) as cluster:
            ranks = cluster.run(moe_steps, args.rounds)
        ms = {w: max(r[w] for r in ranks) for w in ("lib_dist", "torch")}
        print(f"{n} ranks, MoE step: lib_dist all_to_all {ms['lib_dist']:.1f} ms, torch "
              f"all_to_all_single {ms['torch']:.1f} ms: {ms['lib_dist'] / ms['torch']:.2f} "
              f"(goal: at most 1.0)")


if __name__ == "__main__":
    main()
