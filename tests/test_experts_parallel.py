"""ExpertParallelMoE on 1, 2 and 4 simulated ranks against one process's MoE fed every rank's
tokens concatenated in rank order: the same outputs, load-balancing loss, input gradients and
parameter gradients (float64), with and without tokens dropped at capacity (the drop order is
global token order: a later rank's tokens lose to an earlier rank's); exactly two all_to_all
per forward and two per backward; the experts refused when they do not split evenly; ranks that
disagree on what they exchange all raise; a rank keeps only the router and its own experts."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch

from lib_dist.comm import MismatchError, SimulatedWorld
from lib_dist.errors import RankFailure
from lib_dist.experts import ExpertParallelMoE, MoE

from tolerances import rounding

C, E, B, T = 4, 4, 2, 3
F64 = torch.float64
# the longest chain of additions behind a result: forward and backward through the router
# (C) and an expert (C, then 4C), k outputs per token, the sums over every token of the batch
TERMS = 2 * 6 * C + 2 + 4 * B * T


def layer(k: int, factor: float | None) -> MoE:
    torch.manual_seed(0)
    return MoE(C, E, k, factor).double()


def rank_tokens(rank: int) -> torch.Tensor:
    return torch.randn(B, T, C, dtype=F64, generator=torch.Generator().manual_seed(10 + rank))


def loss_weight(rank: int) -> torch.Tensor:
    """A fixed weighting of the outputs, so that every output's gradient differs."""
    return torch.randn(B, T, C, dtype=F64, generator=torch.Generator().manual_seed(50 + rank))


def one_process(moe: MoE, n: int):
    """The oracle: sum over ranks of (out_r * w_r).sum(), plus aux once, on the concatenation."""
    moe = copy.deepcopy(moe)
    x = torch.cat([rank_tokens(r) for r in range(n)]).requires_grad_()
    out, aux = moe(x)
    (out * torch.cat([loss_weight(r) for r in range(n)])).sum().add(aux).backward()
    grads = {name: p.grad for name, p in moe.named_parameters()}
    return out.detach(), aux.detach(), x.grad, grads


def expert_parallel(comm, moe: MoE):
    """This rank's loss (out_r * w_r).sum() + aux, backward, router gradients summed."""
    ep = ExpertParallelMoE(copy.deepcopy(moe), comm)
    x = rank_tokens(comm.rank).requires_grad_()
    out, aux = ep(x)
    forward = [e.kind for e in comm.trace.of_rank(comm.rank)]
    (out * loss_weight(comm.rank)).sum().add(aux).backward()
    everything = [e.kind for e in comm.trace.of_rank(comm.rank)]
    ep.sync_router_grads()
    grads = {name: p.grad for name, p in ep.named_parameters()}
    return out.detach(), aux.detach(), x.grad, grads, list(ep.expert_ids()), forward, everything


def global_name(name: str, first: int) -> str:
    """`experts.i.fc.weight` on a rank holding experts first.. is `experts.{first+i}...`."""
    if not name.startswith("experts."):
        return name
    _, i, rest = name.split(".", 2)
    return f"experts.{first + int(i)}.{rest}"


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("k,factor", [(1, None), (2, None), (1, 0.5), (2, 0.75)])
def test_expert_parallel_equals_one_process_on_every_ranks_tokens(n, k, factor):
    moe = layer(k, factor)
    want_out, want_aux, want_x_grad, want_grads = one_process(moe, n)
    if factor is not None:  # the case is only worth its name if tokens were dropped
        assert (want_out.reshape(-1, C) == 0).all(1).any()
    results = SimulatedWorld(n).run(expert_parallel, moe)
    seen = set()
    for r, (out, aux, x_grad, grads, ids, _, _) in enumerate(results):
        torch.testing.assert_close(out, want_out[r * B:(r + 1) * B], rtol=0,
                                   atol=rounding(want_out, TERMS))
        torch.testing.assert_close(aux, want_aux, rtol=0, atol=rounding(want_aux, TERMS))
        torch.testing.assert_close(x_grad, want_x_grad[r * B:(r + 1) * B], rtol=0,
                                   atol=rounding(want_x_grad, TERMS))
        assert ids == list(range(r * E // n, (r + 1) * E // n))
        for name, g in grads.items():
            full = global_name(name, ids[0])
            want = want_grads[full]
            torch.testing.assert_close(g, want, rtol=0, atol=rounding(want, n * TERMS),
                                       msg=f"rank {r}: {full}")
            seen.add(full)
    assert seen == set(want_grads)  # every expert held by some rank, and its gradient checked


def test_drops_follow_global_token_order_earlier_ranks_first():
    """Every token wants expert 0, which has room for 6 of the 12: rank 0's 6 tokens keep
    their place and rank 1's are all dropped, as in one process on the concatenation."""
    moe = layer(1, 2.0)  # capacity ceil(2.0 * 12 * 1 / 4) = 6
    with torch.no_grad():
        moe.router.gate.weight.zero_()
        moe.router.gate.weight[0, 0] = 50.0

    def run(comm):
        x = rank_tokens(comm.rank)
        x[..., 0] = 1.0  # every token's logit for expert 0 is 50
        return ExpertParallelMoE(copy.deepcopy(moe), comm)(x)[0].detach()

    rank0, rank1 = SimulatedWorld(2).run(run)
    assert (rank0.reshape(-1, C) != 0).all(1).all()
    assert (rank1 == 0).all()


@pytest.mark.parametrize("n", [2, 4])
def test_two_all_to_all_forward_and_two_backward(n):
    for _, _, _, _, _, forward, everything in SimulatedWorld(n).run(expert_parallel,
                                                                     layer(2, 0.75)):
        backward = everything[len(forward):]
        assert forward.count("all_to_all") == 2 and backward.count("all_to_all") == 2
        # the counts travel in one all_gather, before dispatch; backward needs none
        assert forward.count("all_gather") == 1 and "all_gather" not in backward
        assert forward.index("all_gather") < forward.index("all_to_all")
        # the sizes come from that one table: no all-to-all checks them again
        assert "all_to_all_check" not in everything


def test_experts_that_do_not_split_evenly_are_refused():
    moe = MoE(C, 6).double()

    def build(comm):
        ExpertParallelMoE(moe, comm)

    with pytest.raises(RankFailure) as info:
        SimulatedWorld(4).run(build)
    for e in info.value.exceptions.values():
        assert isinstance(e, ValueError)
        assert str(e) == ("expert parallelism splits the 6 experts evenly over the 4 ranks: "
                          "6 is not a multiple of 4")


def test_ranks_that_disagree_on_what_they_exchange_all_raise():
    """Rank 1 runs its copy in float32: its dispatch sends float32 rows where the others
    expect float64. Every rank raises before any row moves, naming the dtypes."""
    moe = layer(1, None)

    def run(comm):
        mine = copy.deepcopy(moe)
        x = rank_tokens(comm.rank)
        if comm.rank == 1:
            mine, x = mine.float(), x.float()
        ExpertParallelMoE(mine, comm)(x)

    with pytest.raises(RankFailure) as info:
        SimulatedWorld(4).run(run)
    assert info.value.ranks == [0, 1, 2, 3]
    for r, e in info.value.exceptions.items():
        assert isinstance(e, MismatchError)
        assert str(e).startswith(f"rank {r}: all_to_all: ranks disagree on the dtype")
        assert "rank 0 float64, rank 1 float32, rank 2 float64, rank 3 float64" in str(e)


def test_ranks_whose_rows_differ_in_width_all_raise():
    """Rank 2's layer is 2 wider: the gathered table says so, and every rank raises before
    any row moves."""
    def run(comm):
        torch.manual_seed(0)
        width = C + 2 if comm.rank == 2 else C
        moe = MoE(width, E, 1).double()
        ExpertParallelMoE(moe, comm)(torch.randn(B, T, width, dtype=F64))

    with pytest.raises(RankFailure) as info:
        SimulatedWorld(4).run(run)
    assert info.value.ranks == [0, 1, 2, 3]
    for r, e in info.value.exceptions.items():
        assert isinstance(e, MismatchError)
        assert str(e) == (f"rank {r}: all_to_all: ranks disagree on the width of the rows they "
                          f"exchange: rank 0 4, rank 1 4, rank 2 6, rank 3 4")


def test_a_rank_holds_the_router_and_its_own_experts_only():
    def build(comm):
        moe = layer(1, None)
        others = [weakref.ref(e) for i, e in enumerate(moe.experts) if i // (E // 2) != comm.rank]
        ep = ExpertParallelMoE(moe, comm)
        del moe
        gc.collect()
        return sum(p.numel() for p in ep.parameters()), [o() is None for o in others]

    per_expert = sum(p.numel() for p in layer(1, None).experts[0].parameters())
    for held, freed in SimulatedWorld(2).run(build):
        assert held == C * E + (E // 2) * per_expert  # the router's gate, half the experts
        assert freed == [True] * (E // 2)           # the other half is not kept alive
