"""lib_dist's expert parallelism on 2 real ranks (ipyparallel engines, a gloo group): the
dispatch, forward and backward, equals torch.distributed's `all_to_all_single` done by hand
with the same uneven splits; and `ExpertParallelMoE` gives one process's MoE outputs,
load-balancing loss and gradients on both ranks' tokens, in two all_to_all each way."""

from __future__ import annotations

import pytest
import torch

from lib_dist.cluster import Cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

WORLD = 2


def on_rank(comm):
    import copy

    import torch
    import torch.distributed as dist

    from lib_dist.experts import ExpertParallelMoE, MoE, dispatch

    n, r, C = comm.world_size, comm.rank, 4
    # -- the dispatch against all_to_all_single by hand: rank s sends rank d s + d + 1 rows
    send = [r + d + 1 for d in range(n)]
    recv = [s + r + 1 for s in range(n)]
    rows = (torch.arange(sum(send) * C, dtype=torch.float64).reshape(-1, C) + 1000 * r
            ).requires_grad_()
    mine = dispatch(rows, comm, send, recv)
    by_hand = torch.empty(sum(recv), C, dtype=torch.float64)
    dist.all_to_all_single(by_hand, rows.detach(), recv, send)
    upstream = torch.randn(sum(recv), C, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(r))
    mine.backward(upstream)
    grad_by_hand = torch.empty(sum(send), C, dtype=torch.float64)
    dist.all_to_all_single(grad_by_hand, upstream, send, recv)  # the reverse exchange

    # -- the layer
    torch.manual_seed(0)
    moe = MoE(C, 4, k=2, capacity_factor=0.75).double()
    x = torch.randn(2, 3, C, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(10 + r)).requires_grad_()
    ep = ExpertParallelMoE(copy.deepcopy(moe), comm)
    comm.trace.clear()
    out, aux = ep(x)
    out.sum().add(aux).backward()
    kinds = [e.kind for e in comm.trace.of_rank(r)]
    ep.sync_router_grads()
    grads = {name: p.grad for name, p in ep.named_parameters()}
    return (mine.detach(), by_hand, rows.grad, grad_by_hand, moe, x.detach(), out.detach(),
            aux.detach(), x.grad, grads, ep.first, kinds)


@pytest.fixture(scope="module")
def results():
    with Cluster(WORLD, timeout=60) as cluster:
        return cluster.run(on_rank)


def test_dispatch_equals_all_to_all_single_by_hand(results):
    for r, (mine, by_hand, grad, grad_by_hand, *_) in enumerate(results):
        assert mine.shape == (sum(s + r + 1 for s in range(WORLD)), 4)
        assert torch.equal(mine, by_hand)  # rows moved, not computed: bit for bit
        assert torch.equal(grad, grad_by_hand)
    # rank 1 received rank 0's last block, its 2 rows starting at row 1
    assert torch.equal(results[1][0][:2], torch.arange(4, 12, dtype=torch.float64).reshape(2, 4))


def test_the_layer_equals_one_process_on_both_ranks_tokens(results):
    moe = results[0][4]
    x = torch.cat([res[5] for res in results]).requires_grad_()
    out, aux = moe(x)
    out.sum().add(aux).backward()
    want = {name: p.grad for name, p in moe.named_parameters()}
    assert (out.reshape(-1, 4) == 0).all(1).any()  # some tokens were dropped
    for r, (*_, got_out, got_aux, x_grad, grads, first, kinds) in enumerate(results):
        # float64; chains of about a hundred additions (see tests/test_experts_parallel.py)
        torch.testing.assert_close(got_out, out.detach()[2 * r:2 * r + 2], rtol=1e-12,
                                   atol=1e-13)
        torch.testing.assert_close(got_aux, aux.detach(), rtol=1e-12, atol=0)
        torch.testing.assert_close(x_grad, x.grad[2 * r:2 * r + 2], rtol=1e-12, atol=1e-13)
        for name, g in grads.items():
            if name.startswith("experts."):
                _, i, rest = name.split(".", 2)
                name = f"experts.{first + int(i)}.{rest}"
            torch.testing.assert_close(g, want[name], rtol=1e-12, atol=1e-13, msg=name)
        assert kinds.count("all_to_all") == 4 and kinds.count("all_gather") == 1
