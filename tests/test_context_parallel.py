"""Ring attention (lib_dist.context_parallel) on 1-4 simulated ranks: exactly causal attention
over the whole sequence (float64, against the unsplit attention and torch's
scaled_dot_product_attention), its gradients too, for contiguous and zig-zag layouts and
sequences the world does not divide; the all-gather alternative likewise; each K/V block sent
N - 1 times in forward, its receive posted before the block it overlaps is computed; the
zig-zag layout balancing the causal work that the contiguous one piles on the last rank."""

from __future__ import annotations

import math

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.context_parallel import (Layout, gathered_attention, ring_attention,
                                      ulysses_attention)

B, H, D = 2, 3, 4


def full_sequence(seq_len: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq_len, D, generator=g, dtype=torch.float64) for _ in range(3)]


def reference(q, k, v):
    """Causal attention, unsplit: the oracle, with its gradients for a fixed d_out."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    out = torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v
    out.backward(d_out(out.shape))
    return out.detach(), [t.grad for t in (q, k, v)]


def d_out(shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)


def split_run(comm, attention, layout, q, k, v):
    """This rank's output and gradients, the same d_out as the oracle's for its positions."""
    mine = [layout.shard(t, comm.rank).clone().requires_grad_() for t in (q, k, v)]
    out = attention(*mine, comm, layout)
    out.backward(layout.shard(d_out(q.shape), comm.rank))
    return out.detach(), [t.grad for t in mine]


CASES = [(1, 8, True), (2, 8, True), (2, 8, False), (3, 13, True), (4, 16, True),
         (4, 11, False), (4, 19, True)]


@pytest.mark.parametrize("attention", [ring_attention, gathered_attention])
@pytest.mark.parametrize("n, seq_len, zigzag", CASES)
def test_split_attention_is_exactly_the_unsplit_one(attention, n, seq_len, zigzag):
    q, k, v = full_sequence(seq_len, seed=n + seq_len)
    layout = Layout(seq_len, n, zigzag)
    want, want_grads = reference(q, k, v)
    ranks = SimulatedWorld(n).run(split_run, attention, layout, q, k, v)
    got = layout.unshard([out for out, _ in ranks])
    # float64: the running softmax rescales each row once per block, a few roundings of
    # 1e-16 each; the gradients sum N blocks' contributions in another order
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    for i, name in enumerate("qkv"):
        grad = layout.unshard([grads[i] for _, grads in ranks])
        torch.testing.assert_close(grad, want_grads[i], rtol=1e-12, atol=1e-13, msg=name)


@pytest.mark.parametrize("n, seq_len, zigzag", [(3, 13, True), (1, 8, True), (3, 10, False)])
def test_ulysses_attention_is_exactly_the_unsplit_one_too(n, seq_len, zigzag):
    # B, H = 2, 3: heads split over 1 or 3 ranks
    q, k, v = full_sequence(seq_len, seed=seq_len)
    layout = Layout(seq_len, n, zigzag)
    want, want_grads = reference(q, k, v)
    world = SimulatedWorld(n)
    ranks = world.run(split_run, ulysses_attention, layout, q, k, v)
    torch.testing.assert_close(layout.unshard([out for out, _ in ranks]), want, rtol=1e-12,
                               atol=1e-13)
    for i, name in enumerate("qkv"):
        grad = layout.unshard([grads[i] for _, grads in ranks])
        torch.testing.assert_close(grad, want_grads[i], rtol=1e-12, atol=1e-13, msg=name)
    kinds = [e.kind for e in world.trace.of_rank(0) if e.kind not in ("send", "recv")]
    assert kinds.count("all_to_all") == 8  # q, k, v, out forward; their gradients back


def test_ulysses_refuses_heads_the_ranks_do_not_divide():
    layout = Layout(8, 2)

    def body(comm):
        q = torch.zeros(B, H, 4, D)
        with pytest.raises(ValueError, match="3 heads over 2 ranks"):
            ulysses_attention(q, q, q, comm, layout)
        return True

    assert SimulatedWorld(2).run(body) == [True, True]


def test_it_equals_torchs_scaled_dot_product_attention():
    q, k, v = full_sequence(12, seed=3)
    layout = Layout(12, 3)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ranks = SimulatedWorld(3).run(split_run, ring_attention, layout, q, k, v)
    torch.testing.assert_close(layout.unshard([out for out, _ in ranks]), want, rtol=1e-12,
                               atol=1e-13)


def forward_only(comm, layout, q, k, v):
    with torch.no_grad():
        ring_attention(*(layout.shard(t, comm.rank) for t in (q, k, v)), comm, layout)


@pytest.mark.parametrize("n", [2, 4])
def test_each_block_travels_n_minus_1_hops_its_receive_posted_before_the_compute(n):
    seq_len = 4 * n + 1
    layout = Layout(seq_len, n)
    world = SimulatedWorld(n)
    world.run(forward_only, layout, *full_sequence(seq_len))
    for rank in range(n):
        events = world.trace.of_rank(rank)
        sends = [e for e in events if e.kind == "send"]
        recvs = [e for e in events if e.kind == "recv"]
        computes = [e for e in events if e.kind == "compute"]
        # step s passes on the block that started on rank - s: 2 x head size per token
        assert [e.nbytes for e in sends] == [
            B * H * layout.sizes()[(rank - s) % n] * 2 * D * 8 for s in range(n - 1)]
        assert all(e.peer == (rank + 1) % n for e in sends)
        assert all(e.peer == (rank - 1) % n for e in recvs)
        assert len(computes) == n  # zig-zag: every block has keys this rank may see
        for recv, compute in zip(recvs, computes):
            assert recv.after <= compute.seq < recv.seq  # posted before, completed after


def test_zigzag_balances_the_causal_work_that_contiguous_piles_on_the_last_rank():
    contiguous, zigzag = Layout(64, 4, zigzag=False), Layout(64, 4)
    work = contiguous.causal_pairs()
    assert work[-1] / work[0] == pytest.approx(7, rel=0.1)  # about 2N - 1
    balanced = zigzag.causal_pairs()
    assert max(balanced) == min(balanced)
    assert sum(balanced) == sum(work) == 64 * 65 // 2


@pytest.mark.parametrize("seq_len, n, zigzag", [(10, 3, True), (11, 4, False), (8, 4, True)])
def test_a_layout_deals_every_position_once(seq_len, n, zigzag):
    layout = Layout(seq_len, n, zigzag)
    dealt = torch.cat([layout.positions(r) for r in range(n)])
    assert sorted(dealt.tolist()) == list(range(seq_len))
    assert max(layout.sizes()) - min(layout.sizes()) <= (2 if zigzag else 1)
    x = torch.arange(seq_len * 2.0).view(2, seq_len, 1)
    assert torch.equal(layout.unshard([layout.shard(x, r) for r in range(n)]), x)


def test_bad_input_is_refused_saying_what_was_expected():
    with pytest.raises(ValueError, match="cannot be split into 8"):
        Layout(6, 4)
    layout = Layout(8, 2)
    wrong_length = torch.zeros(B, H, 5, D)

    def body(comm, layout):
        with pytest.raises(ValueError, match=r"expected \(B, heads, 4, head size\)"):
            ring_attention(wrong_length, wrong_length, wrong_length, comm, layout)
        return True

    assert SimulatedWorld(2).run(body, layout) == [True, True]

    def other_world(comm):
        q = torch.zeros(B, H, 4, D)
        with pytest.raises(ValueError, match="over 2 ranks; the communicator has 1"):
            ring_attention(q, q, q, comm, layout)
        return True

    assert SimulatedWorld(1).run(other_world) == [True]
