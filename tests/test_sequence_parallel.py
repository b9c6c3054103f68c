"""Sequence parallelism with tensor parallelism (lib_dist.tensor_parallel.sequence) on 1-4
simulated ranks: module 2's Block split by heads and features and, elsewhere, by sequence,
gives the unsplit block's output and every gradient (float64) once the replicated parameters'
partial gradients are summed, with residual dropout too (the same masks as one process's
`nn.Dropout`); its traffic is module 6's all-reduces turned into all-gathers
and reduce-scatters of a ring all-reduce's bytes; without the sum,
the LayerNorms' gradients are wrong."""

from __future__ import annotations

import copy

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.models.gpt import Block, GPTConfig
from lib_dist.tensor_parallel import ParallelBlock, unshard
from lib_dist.tensor_parallel.sequence import SequenceParallelBlock, shard_sequence

CONFIG = GPTConfig(vocab_size=8, block_size=12, n_layer=1, n_head=4, n_embd=8)
B, T = 2, 12


def block_and_input(seed: int = 0) -> tuple[Block, torch.Tensor]:
    torch.manual_seed(seed)
    block = Block(CONFIG).double()
    for p in block.parameters():  # LayerNorms start at 1 and 0: make every gradient count
        torch.nn.init.normal_(p, std=0.3)
    return block, torch.randn(B, T, CONFIG.n_embd, dtype=torch.float64)


def sequence_parallel(comm, block, x, sync=True, dropout=0.0, seed=0):
    sp = SequenceParallelBlock(block, comm, dropout, seed)
    mine = shard_sequence(x, comm).requires_grad_()
    out = sp(mine)
    out.pow(2).sum().backward()
    if sync:
        sp.sync_replicated_gradients()
    return out.detach(), mine.grad, {n: p.grad for n, p in sp.named_parameters()}


def unsplit(block, x):
    x = x.clone().requires_grad_()
    out = block(x)
    out.pow(2).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in block.named_parameters()}


# where each parameter of SequenceParallelBlock is split: (name in Block, dim, parts)
SPLIT = {"attn.qkv.weight": ("attn.qkv.weight", 0, 3), "attn.qkv.bias": ("attn.qkv.bias", 0, 3),
         "attn.proj.weight": ("attn.proj.weight", 1, 1), "mlp.fc.weight": ("mlp.fc.weight", 0, 1),
         "mlp.fc.bias": ("mlp.fc.bias", 0, 1), "mlp.proj.weight": ("mlp.proj.weight", 1, 1)}


def with_residual_dropout(block, p, seed):
    """A copy of `block` whose two residual dropouts drop with probability p (attention's
    weights undropped), and the global generator seeded so that they draw from `seed`."""
    dropped = copy.deepcopy(block)
    dropped.attn.resid_dropout.p = dropped.mlp.dropout.p = p
    torch.manual_seed(seed)
    return dropped


@pytest.mark.parametrize("n, p", [(1, 0.0), (2, 0.0), (4, 0.0), (1, 0.3), (2, 0.3), (4, 0.3)])
def test_the_sequence_parallel_block_is_the_unsplit_block(n, p):
    block, x = block_and_input()
    want_out, want_dx, want_grads = unsplit(with_residual_dropout(block, p, seed=5), x)
    if p:  # the masks drop something: the output is not the undropped block's
        assert not torch.allclose(want_out, unsplit(block, x)[0])
    ranks = SimulatedWorld(n).run(sequence_parallel, block, x, True, p, 5)
    # float64; sums over ranks in another order: a few roundings relative to the values
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat([out for out, _, _ in ranks], 1), want_out, **close)
    torch.testing.assert_close(torch.cat([dx for _, dx, _ in ranks], 1), want_dx, **close)
    for name, want in want_grads.items():
        if name in SPLIT:
            _, dim, parts = SPLIT[name]
            got = unshard([grads[name] for _, _, grads in ranks], dim, parts)
        else:  # replicated: the same summed gradient on every rank
            got = ranks[0][2][name]
            for _, _, grads in ranks[1:]:
                torch.testing.assert_close(grads[name], got, rtol=0, atol=0)
        torch.testing.assert_close(got, want, **close, msg=name)


def test_its_traffic_is_tensor_parallels_in_gathers_and_reduce_scatters():
    block, x = block_and_input()
    n = 4
    sp_world, tp_world = SimulatedWorld(n), SimulatedWorld(n)
    sp_world.run(sequence_parallel, block, x, False)

    def tensor_parallel(comm):
        out = ParallelBlock(block, comm)(x.clone().requires_grad_())
        out.pow(2).sum().backward()

    tp_world.run(tensor_parallel)
    for rank in range(n):
        sp = [e.kind for e in sp_world.trace.of_rank(rank) if e.kind not in ("send", "recv")]
        tp = [e.kind for e in tp_world.trace.of_rank(rank) if e.kind not in ("send", "recv")]
        assert tp == ["all_reduce"] * 4  # two forward (g), two backward (f)
        assert sorted(sp) == ["all_gather"] * 4 + ["reduce_scatter"] * 4
        # each all-gather and reduce-scatter sends (n-1)/n of the (B, T, C) activation: the
        # pair moves a ring all-reduce's 2(n-1)/n, the bytes module 6 counts per all-reduce
        full = x.nbytes
        assert sp_world.trace.summary()[rank].sent_bytes == 4 * 2 * (n - 1) * full // n


def test_without_summing_the_replicated_gradients_the_layernorms_learn_from_a_slice():
    block, x = block_and_input()
    _, _, want = unsplit(block, x)
    ranks = SimulatedWorld(2).run(sequence_parallel, block, x, False)
    assert not torch.allclose(ranks[0][2]["ln1.weight"], want["ln1.weight"])
    torch.testing.assert_close(ranks[0][2]["ln1.weight"] + ranks[1][2]["ln1.weight"],
                               want["ln1.weight"], rtol=1e-12, atol=1e-12)


def test_a_sequence_the_ranks_do_not_divide_is_refused():
    def body(comm):
        with pytest.raises(ValueError, match="choose a sequence length divisible by 4"):
            shard_sequence(torch.zeros(1, 10, 8), comm)
        return True

    assert SimulatedWorld(4).run(body) == [True] * 4


def test_dropout_draws_a_fresh_mask_each_step_and_none_in_eval():
    block, x = block_and_input()

    def body(comm):
        sp = SequenceParallelBlock(block, comm, dropout=0.5, seed=1)
        mine = shard_sequence(x, comm)
        first, second = sp(mine), sp(mine)
        sp.eval()
        return not torch.equal(first, second), torch.equal(sp(mine), undropped(comm))

    def undropped(comm):
        return SequenceParallelBlock(block, comm)(shard_sequence(x, comm))

    def refused(comm):
        with pytest.raises(ValueError, match=r"dropout 1.0 must be in \[0, 1\)"):
            SequenceParallelBlock(block, comm, dropout=1.0)
        return True

    assert SimulatedWorld(2).run(body) == [(True, True)] * 2
    assert SimulatedWorld(1).run(refused) == [True]
