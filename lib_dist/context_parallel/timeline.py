"""Ring attention on the virtual clock: one forward's timeline, and the times its schedule
predicts.

Each step of the ring computes one K/V block while the next one travels (`ring_attention`).
On a simulated world with a `VirtualClock`, a block's compute costs `pair_cost` per score it
computes (`block_scores`: what the causal mask hides entirely is skipped) and a block's
transfer what the clock charges for its bytes. `ring_timeline` runs the real `ring_attention`
that way and returns its trace, for `lib_dist.comm.plot_overlap` to draw;
`predicted_finish` is the same schedule as a recurrence over the steps, each rank's finishing
time, which the trace must match exactly:

- overlapped: a step ends when both its compute and its two messages (the block arriving from
  rank r - 1, the block leaving for rank r + 1) are done, max(start + compute, arrivals);
- not overlapped: the messages first, then the compute, max(arrivals) + compute.

A message leaves when its send and its receive are both posted, at the later of the two
ranks' step starts, so a slow rank delays its neighbours, and through them the whole ring.
"""

from __future__ import annotations

import torch

from ..comm import Communicator, SimulatedWorld, Trace, VirtualClock
from .layout import Layout
from .ring import block_scores, ring_attention


def scores_per_rank(layout: Layout) -> list[int]:
    """The scores each rank computes over the whole ring (every block's `block_scores`)."""
    n = layout.world_size
    positions = [layout.positions(r) for r in range(n)]
    return [sum(block_scores(positions[r], positions[s]) for s in range(n)) for r in range(n)]


def block_bytes(layout: Layout, rank: int, batch: int, heads: int, head_size: int,
                dtype: torch.dtype) -> int:
    """The bytes of rank `rank`'s K/V block as the ring passes it: (B, heads, its tokens,
    2 x head size)."""
    return batch * heads * layout.sizes()[rank] * 2 * head_size * dtype.itemsize


def ring_timeline(layout: Layout, pair_cost: float, clock: VirtualClock, batch: int = 1,
                  heads: int = 1, head_size: int = 8, dtype: torch.dtype = torch.float64,
                  overlap: bool = True) -> Trace:
    """The trace of one `ring_attention` forward over random inputs on `layout.world_size`
    simulated ranks with `clock`; compute events "A{s}" (with the block of rank s)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, layout.seq_len, head_size, generator=g, dtype=dtype)
               for _ in range(3))

    def forward(comm: Communicator) -> None:
        with torch.no_grad():
            mine = [layout.shard(t, comm.rank) for t in (q, k, v)]
            ring_attention(mine[0], mine[1], mine[2], comm, layout, pair_cost=pair_cost,
                           overlap=overlap)

    world = SimulatedWorld(layout.world_size, clock=clock)
    world.run(forward)
    return world.trace


def predicted_finish(layout: Layout, pair_cost: float, clock: VirtualClock, batch: int = 1,
                     heads: int = 1, head_size: int = 8, dtype: torch.dtype = torch.float64,
                     overlap: bool = True) -> list[float]:
    """Each rank's virtual time at the end of `ring_timeline`'s forward, from the schedule."""
    n = layout.world_size
    positions = [layout.positions(r) for r in range(n)]
    start = [0.0] * n
    for step in range(n):
        src = [(r - step) % n for r in range(n)]
        compute = [pair_cost * block_scores(positions[r], positions[src[r]]) for r in range(n)]
        if step == n - 1:  # the last block: nothing more to pass on
            start = [start[r] + compute[r] for r in range(n)]
            break
        # the message into rank r carries the block rank r - 1 holds at this step
        arrival = [max(start[(r - 1) % n], start[r])
                   + clock.message_cost(block_bytes(layout, src[(r - 1) % n], batch, heads,
                                                    head_size, dtype)) for r in range(n)]
        done = [max(arrival[r], arrival[(r + 1) % n]) for r in range(n)]
        start = [max(start[r] + compute[r], done[r]) if overlap else done[r] + compute[r]
                 for r in range(n)]
    return start


def finish_times(trace: Trace) -> list[float]:
    """Each rank's virtual time at its last event."""
    ranks = sorted({e.rank for e in trace.events})
    return [max(e.times("virtual")[1] for e in trace.of_rank(r)) for r in ranks]


__all__ = ["block_bytes", "finish_times", "predicted_finish", "ring_timeline",
           "scores_per_rank"]
