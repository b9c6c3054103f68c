"""What expert parallelism's all-to-alls moved, read from the trace: each rank's dispatch sends
its tokens' rows, each rank's combine its experts' rows; a router that favours expert 0 shows
as rank 0 processing most of the batch, the load one process's routing predicts."""

from __future__ import annotations

import copy

import pytest
import torch

from lib_dist.comm import SimulatedWorld, Trace
from lib_dist.experts import ExpertParallelMoE, MoE, all_to_all_bytes, expert_load, imbalance

C, E, N, B, T = 4, 8, 4, 2, 4
ROW = C * 8  # bytes of one float64 row


def rank_tokens(rank: int) -> torch.Tensor:
    x = torch.randn(B, T, C, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(10 + rank))
    x[..., 0] = 1.0  # a feature every token has: the skewed router's lever
    return x


def layer(skew: float, k: int = 1) -> MoE:
    torch.manual_seed(0)
    moe = MoE(C, E, k).double()
    with torch.no_grad():
        moe.router.gate.weight[:, 0] = 0.0
        moe.router.gate.weight[0, 0] = skew  # expert 0's logit raised by `skew` for every token
    return moe


def step(comm, moe: MoE):
    out, aux = ExpertParallelMoE(copy.deepcopy(moe), comm)(rank_tokens(comm.rank))
    (out.sum() + aux).backward()


def predicted_load(moe: MoE, k: int = 1) -> list[int]:
    """Rows each rank's experts take, from one process routing every rank's tokens."""
    chosen = moe.router(torch.cat([rank_tokens(r) for r in range(N)]).reshape(-1, C)).chosen
    per_expert = torch.bincount(chosen.reshape(-1), minlength=E)
    return per_expert.view(N, E // N).sum(1).tolist()


@pytest.mark.parametrize("k", [1, 2])
def test_the_trace_shows_what_each_rank_sent_and_processed(k):
    moe = layer(4.0, k)
    world = SimulatedWorld(N)
    world.run(step, moe)
    load = predicted_load(moe, k)
    assert sum(load) == N * B * T * k
    exchanges = all_to_all_bytes(world.trace)
    assert len(exchanges) == 4  # dispatch, combine; combine's reverse, dispatch's reverse
    for row in exchanges[0::2]:  # every rank sends its B * T * k assignments' rows
        assert row == [B * T * k * ROW] * N
    for row in exchanges[1::2]:  # every rank sends back what its experts processed
        assert row == [rows * ROW for rows in load]
    assert expert_load(world.trace, C, torch.float64) == [load, load]


def test_a_skewed_router_overloads_the_rank_of_its_favourite():
    loads = {}
    for skew in (0.0, 4.0):
        world = SimulatedWorld(N)
        world.run(step, layer(skew))
        loads[skew] = expert_load(world.trace, C, torch.float64)[0]
    skewed = loads[4.0]
    assert skewed == predicted_load(layer(4.0))
    assert skewed[0] == max(skewed) and skewed[0] > 0.5 * N * B * T  # most of the batch
    assert imbalance(skewed) > 2.0 > imbalance(loads[0.0])
    assert imbalance([3, 3, 3, 3]) == 1.0 and imbalance([8, 0, 0, 0]) == 4.0


def test_a_trace_that_is_not_whole_pairs_is_refused():
    world = SimulatedWorld(2)
    world.run(lambda comm: comm.all_to_all([torch.zeros(1), torch.zeros(1)]))
    with pytest.raises(ValueError, match="1 all_to_all per rank, not pairs"):
        expert_load(world.trace, C, torch.float64)
    lopsided = Trace([e for e in world.trace.events if e.rank == 0 or e.kind != "all_to_all"])
    with pytest.raises(ValueError, match="rank 0: 1, rank 1: 0"):
        all_to_all_bytes(lopsided)
