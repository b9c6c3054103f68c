"""Module 10's virtual-clock timelines: ring attention's forward (lib_dist.context_parallel
.timeline) finishes exactly when its schedule's recurrence says, overlapped or not, on a case
worked by hand and on others; an expert-parallel MoE step (lib_dist.experts.timeline) prices
each expert by the rows the trace says it processed, and every rank's combine waits for the
busiest rank; `plot_overlap` draws one bar per message sent."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

from lib_dist.comm import AlphaBeta, SimulatedWorld, VirtualClock, plot_overlap
from lib_dist.context_parallel import Layout, ring_attention
from lib_dist.context_parallel.timeline import (block_bytes, finish_times, predicted_finish,
                                                ring_timeline, scores_per_rank)
from lib_dist.experts import MoE, expert_load
from lib_dist.experts.timeline import Priced, moe_timeline

matplotlib.use("Agg")


def test_a_ring_of_two_worked_by_hand():
    """T = 8 zig-zag over 2 ranks: rank 0 holds 0,1,6,7 and rank 1 holds 2..5. Rank 0
    computes 4 + 4 + 4 scores on its own block (two diagonals and 6,7 against 0,1) and 8 on
    rank 1's (6,7 against 2..5); rank 1 16 on its own (one diagonal run) and 8 on rank 0's.
    A block is 4 tokens x 2 x 8 float64 = 512 bytes: 1 + 512 / 512 = 2 units."""
    layout, clock = Layout(8, 2), VirtualClock(AlphaBeta(alpha=1.0, beta=512.0))
    assert scores_per_rank(layout) == [20, 24]
    assert block_bytes(layout, 0, 1, 1, 8, torch.float64) == 512
    # overlapped: max(3, 2) + 2 and max(4, 2) + 2; not: 2 + 3 + 2 and 2 + 4 + 2
    for overlap, want in ((True, [5.0, 6.0]), (False, [7.0, 8.0])):
        trace = ring_timeline(layout, 0.25, clock, overlap=overlap)
        assert finish_times(trace) == want
        assert predicted_finish(layout, 0.25, clock, overlap=overlap) == want
        assert [e.label for e in trace.of_rank(0) if e.kind == "compute"] == ["A0", "A1"]


@pytest.mark.parametrize("n, seq_len, zigzag", [(4, 64, True), (4, 64, False), (3, 13, True),
                                                (1, 8, True), (2, 10, False)])
@pytest.mark.parametrize("overlap", [True, False])
def test_the_clock_follows_the_schedule_exactly(n, seq_len, zigzag, overlap):
    layout = Layout(seq_len, n, zigzag)
    for beta in (2.0**6, 2.0**3, math.inf):  # messages cheaper and dearer than a block
        clock = VirtualClock(AlphaBeta(alpha=0.25, beta=beta))
        assert finish_times(ring_timeline(layout, 2**-4, clock, overlap=overlap)) == \
            predicted_finish(layout, 2**-4, clock, overlap=overlap)


def test_pricing_the_compute_changes_nothing_computed():
    layout = Layout(12, 3)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))

    def run(comm, **priced):
        return ring_attention(*(layout.shard(t, comm.rank) for t in (q, k, v)), comm, layout,
                              **priced)

    plain = SimulatedWorld(3).run(run)
    clock = VirtualClock(AlphaBeta(alpha=1.0, beta=64.0))
    for overlap in (True, False):
        priced = SimulatedWorld(3, clock=clock).run(run, pair_cost=0.5, overlap=overlap)
        assert all(torch.equal(a, b) for a, b in zip(plain, priced))


def test_plot_overlap_draws_every_message_and_compute():
    layout = Layout(16, 4)
    trace = ring_timeline(layout, 0.1, VirtualClock(AlphaBeta(alpha=0.5, beta=math.inf)))
    ax = plot_overlap(trace, VirtualClock(AlphaBeta(alpha=0.5, beta=math.inf)))
    bars = [c for c in ax.collections]
    sends = sum(e.kind == "send" for e in trace.events)
    computes = sum(e.kind == "compute" for e in trace.events)
    assert sends == 4 * 3 and computes == 4 * 4
    assert len(bars) == sends + computes
    assert [p for p, _ in trace.pairs()] == sorted(
        (e for e in trace.events if e.kind == "send"), key=lambda e: (e.start, e.rank, e.seq))
    assert all(r is not None and r.rank == s.peer for s, r in trace.pairs())


C, E, N = 4, 8, 4


def tokens(rank: int) -> torch.Tensor:
    x = torch.randn(2, 4, C, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(10 + rank))
    x[..., 0] = 1.0
    return x


def skewed(skew: float) -> MoE:
    torch.manual_seed(0)
    moe = MoE(C, E, 1).double()
    with torch.no_grad():
        moe.router.gate.weight[:, 0] = 0.0
        moe.router.gate.weight[0, 0] = skew  # expert 0 favoured by every token
    return moe


def test_priced_experts_compute_what_the_expert_computes():
    moe = skewed(0.0)
    expert = moe.experts[0]
    x = tokens(0).reshape(-1, C).requires_grad_()
    y = expert(x)
    y.pow(2).sum().backward()
    want = x.grad.clone()
    x.grad = None

    def run(comm):
        out = Priced(expert, comm, "0", 0.5)(x)
        out.pow(2).sum().backward()
        return out.detach()

    world = SimulatedWorld(1, clock=VirtualClock())
    [out] = world.run(run)
    assert torch.equal(out, y.detach()) and torch.equal(x.grad, want)
    assert [(e.label, e.vend - e.vstart) for e in world.trace.events] == [("F0", 4.0),
                                                                           ("B0", 8.0)]


@pytest.mark.parametrize("skew", [0.0, 4.0])
def test_an_moe_step_prices_each_rank_by_its_rows_and_the_others_wait(skew):
    row_cost = 0.25
    trace = moe_timeline(skewed(skew), [tokens(r) for r in range(N)], row_cost,
                         VirtualClock(AlphaBeta(alpha=0.0, beta=2.0**12)))
    load = expert_load(trace, C, torch.float64)[0]
    computes = {r: [e for e in trace.of_rank(r) if e.kind == "compute"] for r in range(N)}
    for r in range(N):
        forward = sum(e.vend - e.vstart for e in computes[r] if e.label.startswith("F"))
        backward = sum(e.vend - e.vstart for e in computes[r] if e.label.startswith("B"))
        assert (forward, backward) == (row_cost * load[r], 2 * row_cost * load[r])
        assert [e.kind for e in trace.of_rank(r)].count("all_to_all") == 4
    busiest = max(range(N), key=lambda r: load[r])
    experts_done = max(e.vend for e in computes[busiest] if e.label.startswith("F"))
    for r in range(N):  # combine (the second all_to_all) ends after the busiest's experts
        combine = [e for e in trace.of_rank(r) if e.kind == "all_to_all"][1]
        assert combine.vend >= experts_done
