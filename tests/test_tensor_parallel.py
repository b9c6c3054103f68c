"""lib_dist's tensor parallelism on simulated ranks: column- and row-parallel layers, the f/g
operators, the GPT's MLP, attention and block split over 1, 2 and 4 ranks, the vocabulary-
parallel embedding and cross-entropy, and TensorParallelGPT all give the unsplit modules'
outputs and gradients (float64), with exactly the all-reduces Megatron's plan needs; the cost
model's bytes and times are those of a traced ring all-reduce, and its layouts the parameters
a rank of a real TensorParallelGPT holds."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from lib_dist.comm import AlphaBeta, SimulatedWorld
from lib_dist.comm.algorithms import RING, ring
from lib_dist.comm.simulated import SimulatedCommunicator
from lib_dist.losses import cross_entropy, next_token_loss
from lib_dist.models.gpt import GPT, Block, GPTConfig
from lib_dist.tensor_parallel import (ColumnParallelLinear, ParallelAttention, ParallelBlock,
                                      ParallelMLP, RowParallelLinear, TensorParallelGPT,
                                      VocabParallelEmbedding, copy_to_ranks, gather_from_ranks,
                                      linear_overlapped, reduce_from_ranks, unshard,
                                      vocab_parallel_cross_entropy)
from lib_dist.tensor_parallel.cost import (block_bytes_per_token, block_communication_time,
                                           layout, layouts)
from lib_dist.train.memory import gpt_num_params


from tolerances import gpt_terms, rounding

TPS = [1, 2, 4]
CONFIG = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16)
B, T = 2, 8
F64 = torch.float64


TERMS = gpt_terms(CONFIG, B * T) + 4  # the whole GPT on B x T tokens, 4 ranks' parts added


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to float64 rounding; the layers and blocks tested alone have shorter chains."""
    torch.testing.assert_close(a, b, rtol=0, atol=rounding(b, TERMS))


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def full_grads(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The unsplit gradient of every parameter, from each rank's gradients by name: matrices
    split by output features (fc, the fused qkv by thirds, the vocabulary's rows) or by input
    features (proj) are put back together; everything else must be the same on every rank."""
    out = {}
    for name in per_rank[0]:
        shards = [g[name] for g in per_rank]
        if name.endswith(("qkv.weight", "qkv.bias")):
            out[name] = unshard(shards, 0, parts=3)
        elif name.endswith(("fc.weight", "fc.bias", "tok_emb.weight")):
            out[name] = unshard(shards, 0)
        elif name.endswith("proj.weight"):
            out[name] = unshard(shards, 1)
        else:
            for s in shards[1:]:
                close(s, shards[0])
            out[name] = shards[0]
    return out


def all_reduces(comm) -> int:
    return sum(e.kind == "all_reduce" for e in comm.trace.of_rank(comm.rank))


# -- column- and row-parallel linear layers --------------------------------------------------


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_linear_gives_the_full_layers_output_and_gradients(tp, gather_output):
    torch.manual_seed(0)
    full = nn.Linear(8, 12, dtype=F64)
    x, weights = randn(3, 5, 8, seed=1), randn(3, 5, 12, seed=2)  # loss: (y * weights).sum()
    xf = x.clone().requires_grad_()
    want = full(xf)
    (want * weights).sum().backward()

    def body(comm):
        layer = ColumnParallelLinear(full, comm, gather_output=gather_output)
        xr = x.clone().requires_grad_()
        y = layer(xr)
        mine = weights if gather_output else weights.chunk(comm.world_size, -1)[comm.rank]
        (y * mine).sum().backward()
        return y.detach(), xr.grad, layer.weight.grad, layer.bias.grad

    results = SimulatedWorld(tp).run(body)
    ys, x_grads, w_grads, b_grads = zip(*results)
    if gather_output:
        for y in ys:
            close(y, want.detach())
    else:
        assert all(y.shape[-1] == 12 // tp for y in ys)
        close(torch.cat(ys, -1), want.detach())
    for g in x_grads:  # f's backward summed every rank's share of the input gradient
        close(g, xf.grad)
    close(unshard(list(w_grads), 0), full.weight.grad)
    close(unshard(list(b_grads), 0), full.bias.grad)


@pytest.mark.parametrize("tp", TPS)
def test_linear_overlapped_gives_the_column_layers_numbers_with_its_all_reduce_in_flight(tp):
    """The same products as ColumnParallelLinear, so the same bits, and the same one all-reduce
    backward (started asynchronously, and waited for before the backward returns)."""
    torch.manual_seed(0)
    full = nn.Linear(8, 12, dtype=F64)
    x, weights = randn(3, 5, 8, seed=1), randn(3, 5, 12, seed=2)

    def body(comm):
        out = []
        for overlap in (False, True):
            layer = ColumnParallelLinear(full, comm)
            xr = x.clone().requires_grad_()
            y = linear_overlapped(xr, layer.weight, layer.bias, comm) if overlap else layer(xr)
            before = all_reduces(comm)
            (y * weights.chunk(comm.world_size, -1)[comm.rank]).sum().backward()
            out.append((y.detach(), xr.grad, layer.weight.grad, layer.bias.grad,
                        all_reduces(comm) - before))
        return out

    for plain, overlapped in SimulatedWorld(tp).run(body):
        for a, b in zip(plain[:4], overlapped[:4]):
            assert torch.equal(a, b)
        assert plain[4] == overlapped[4] == 1


@pytest.mark.parametrize("tp", TPS)
def test_row_parallel_linear_gives_the_full_layers_output_and_gradients(tp):
    torch.manual_seed(0)
    full = nn.Linear(12, 8, dtype=F64)
    with torch.no_grad():
        full.bias.copy_(torch.linspace(1.0, 4.0, 8))  # large: added tp times, it would show
    x, weights = randn(3, 5, 12, seed=1), randn(3, 5, 8, seed=2)
    xf = x.clone().requires_grad_()
    want = full(xf)
    (want * weights).sum().backward()

    def body(comm):
        layer = RowParallelLinear(full, comm)
        xr = x.chunk(comm.world_size, -1)[comm.rank].clone().requires_grad_()
        y = layer(xr)
        (y * weights).sum().backward()
        return y.detach(), xr.grad, layer.weight.grad, layer.bias.grad

    results = SimulatedWorld(tp).run(body)
    ys, x_grads, w_grads, b_grads = zip(*results)
    for y in ys:  # the full output on every rank, the bias in it once
        close(y, want.detach())
    close(torch.cat(x_grads, -1), xf.grad)
    close(unshard(list(w_grads), 1), full.weight.grad)
    for g in b_grads:
        close(g, full.bias.grad)


def test_row_parallel_linear_adds_its_bias_once_after_the_sum():
    full = nn.Linear(8, 4, dtype=F64)
    with torch.no_grad():
        full.weight.zero_()
        full.bias.copy_(torch.tensor([1.0, -2.0, 3.0, 0.5]))

    def body(comm):
        return RowParallelLinear(full, comm)(torch.ones(2, 8 // comm.world_size, dtype=F64))

    for y in SimulatedWorld(4).run(body):
        close(y, full.bias.detach().expand(2, 4))


# -- the conjugate operators f and g ---------------------------------------------------------


def test_copy_to_ranks_is_the_identity_forward_and_sums_gradients_backward():
    xs = [randn(3, 4, seed=r) for r in range(4)]
    upstream = [randn(3, 4, seed=10 + r) for r in range(4)]

    def body(comm):
        x = xs[comm.rank].clone().requires_grad_()
        y = copy_to_ranks(x, comm)
        forward = all_reduces(comm)
        y.backward(upstream[comm.rank])
        return y.detach(), x.grad, forward, all_reduces(comm)

    for rank, (y, grad, forward, total) in enumerate(SimulatedWorld(4).run(body)):
        close(y, xs[rank])
        close(grad, sum(upstream))
        assert (forward, total) == (0, 1)


def test_reduce_from_ranks_sums_forward_and_passes_gradients_through():
    xs = [randn(3, 4, seed=r) for r in range(4)]
    upstream = [randn(3, 4, seed=10 + r) for r in range(4)]

    def body(comm):
        x = xs[comm.rank].clone().requires_grad_()
        y = reduce_from_ranks(x, comm)
        forward = all_reduces(comm)
        y.backward(upstream[comm.rank])
        return x.detach(), y.detach(), x.grad, forward, all_reduces(comm)

    for rank, (x, y, grad, forward, total) in enumerate(SimulatedWorld(4).run(body)):
        close(x, xs[rank])  # the all-reduce summed a copy, not the caller's tensor
        close(y, sum(xs))
        close(grad, upstream[rank])
        assert (forward, total) == (1, 1)


def test_gather_from_ranks_concatenates_forward_and_keeps_this_ranks_slice_backward():
    xs = [randn(2, 3, seed=r) for r in range(4)]
    upstream = randn(2, 12, seed=9)

    def body(comm):
        x = xs[comm.rank].clone().requires_grad_()
        y = gather_from_ranks(x, comm)
        y.backward(upstream)
        return y.detach(), x.grad

    for rank, (y, grad) in enumerate(SimulatedWorld(4).run(body)):
        close(y, torch.cat(xs, -1))
        close(grad, upstream[:, 3 * rank:3 * rank + 3])


# -- the GPT's MLP, attention and block ------------------------------------------------------


def block_and_input() -> tuple[Block, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    block = Block(CONFIG).double()
    with torch.no_grad():  # non-zero biases and LayerNorm shifts, so their gradients count
        for name, p in block.named_parameters():
            if not name.endswith("weight"):
                p.normal_(0, 0.1)
    return block, randn(B, T, CONFIG.n_embd, seed=1), randn(B, T, CONFIG.n_embd, seed=2)


PARALLEL = {"mlp": ParallelMLP, "attn": ParallelAttention}


def parallel_run(kind: str, tp: int):
    """(the full module, its output, input gradient and gradients, and per rank: output,
    input gradient, gradients by name, all-reduces in forward, all-reduces in backward)."""
    block, x, weights = block_and_input()
    full = block if kind == "block" else getattr(block, kind)
    xf = x.clone().requires_grad_()
    want = full(xf)
    (want * weights).sum().backward()

    def body(comm):
        module = (ParallelBlock if kind == "block" else PARALLEL[kind])(full, comm)
        xr = x.clone().requires_grad_()
        y = module(xr)
        forward = all_reduces(comm)
        (y * weights).sum().backward()
        grads = {n: p.grad for n, p in module.named_parameters()}
        return y.detach(), xr.grad, grads, forward, all_reduces(comm) - forward

    return full, want.detach(), xf.grad, SimulatedWorld(tp).run(body)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("kind", ["mlp", "attn", "block"])
def test_parallel_mlp_attention_and_block_equal_the_full_modules(kind, tp):
    full, want, x_grad, results = parallel_run(kind, tp)
    for y, grad, _, _, _ in results:
        close(y, want)
        close(grad, x_grad)
    got = full_grads([grads for _, _, grads, _, _ in results])
    expected = {n: p.grad for n, p in full.named_parameters()}
    assert got.keys() == expected.keys()
    for name in expected:
        close(got[name], expected[name])
    # Megatron's plan: one all-reduce forward (the row-parallel layer's), one backward (the
    # column-parallel layer's input gradient) per MLP and per attention
    per_module = {"mlp": 1, "attn": 1, "block": 2}[kind]
    assert [(f, b) for _, _, _, f, b in results] == [(per_module, per_module)] * tp


def test_parallel_attention_keeps_its_share_of_the_heads():
    block, x, _ = block_and_input()

    def body(comm):
        attn = ParallelAttention(block.attn, comm)
        return attn.n_head, tuple(attn.qkv.weight.shape), tuple(attn.proj.weight.shape)

    c = CONFIG.n_embd
    assert SimulatedWorld(4).run(body) == [(1, (3 * c // 4, c), (c, c // 4))] * 4


def test_splits_that_do_not_divide_evenly_or_use_dropout_fail_clearly():
    three = SimulatedWorld(3).communicators()[0]
    four = SimulatedWorld(4).communicators()[0]
    with pytest.raises(ValueError, match="4 heads do not split evenly over 3 ranks"):
        ParallelAttention(Block(CONFIG).attn, three)
    with pytest.raises(ValueError, match="64 output features: 64 does not split evenly over "
                                         "3 ranks"):
        ParallelMLP(Block(CONFIG).mlp, three)
    with pytest.raises(ValueError, match="10 output features: 10 does not split evenly over 4"):
        ColumnParallelLinear(nn.Linear(8, 10), four)
    with pytest.raises(ValueError, match="3 blocks of 10 does not split evenly over 4 ranks"):
        ColumnParallelLinear(nn.Linear(8, 30), four, parts=3)
    with pytest.raises(ValueError, match="10 input features: 10 does not split evenly over 4"):
        RowParallelLinear(nn.Linear(10, 8), four)
    with pytest.raises(ValueError, match="vocabulary of 30: 30 does not split evenly over 4"):
        VocabParallelEmbedding(nn.Embedding(30, 8), four)
    dropout = GPTConfig(vocab_size=32, block_size=8, n_head=4, n_embd=16, dropout=0.1)
    for build, module in [(ParallelMLP, Block(dropout).mlp), (ParallelAttention,
                                                              Block(dropout).attn),
                          (ParallelBlock, Block(dropout)), (TensorParallelGPT, GPT(dropout))]:
        with pytest.raises(ValueError, match="dropout > 0"):
            build(module, four)


# -- the vocabulary: embedding and cross-entropy ---------------------------------------------


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("scale", [1.0, 3000.0])
def test_vocab_parallel_cross_entropy_equals_the_full_one_without_moving_the_logits(tp, scale):
    n, vocab = 12, 32
    logits = randn(n, vocab, seed=0) * scale
    logits[3, 5] += 5 * scale  # row maxima on different ranks, far above the rest
    logits[4, 30] += 5 * scale
    target = torch.randint(vocab, (n,), generator=torch.Generator().manual_seed(1))
    target[[2, 7]] = -100
    full = logits.clone().requires_grad_()
    want = cross_entropy(full, target)
    want.backward()
    assert torch.isfinite(want) and (scale == 1 or not torch.isfinite(logits.exp()).all())

    def body(comm):
        mine = logits.chunk(comm.world_size, 1)[comm.rank].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(mine, target, comm)
        loss.backward()
        return loss.detach(), mine.grad

    world = SimulatedWorld(tp)
    results = world.run(body)
    for loss, _ in results:
        close(loss, want.detach())
    close(torch.cat([g for _, g in results], 1), full.grad)
    assert full.grad[[2, 7]].abs().max() == 0
    # only a few numbers per row travel: never the logits, not even one rank's share of them
    assert world.trace.events
    assert max(e.nbytes for e in world.trace.events) <= 2 * n * logits.element_size()
    assert max(e.nbytes for e in world.trace.events) < logits.nbytes // max(tp, 2)


@pytest.mark.parametrize("tp", TPS)
def test_vocab_parallel_embedding_equals_nn_embedding(tp):
    torch.manual_seed(0)
    full = nn.Embedding(32, 6, dtype=F64)
    idx = torch.tensor([[0, 31, 8, 8, 15], [16, 23, 24, 7, 1]])  # ids in every rank's range
    weights = randn(2, 5, 6, seed=1)
    want = full(idx)
    (want * weights).sum().backward()

    def body(comm):
        emb = VocabParallelEmbedding(full, comm)
        y = emb(idx)
        (y * weights).sum().backward()
        return y.detach(), emb.weight.grad

    results = SimulatedWorld(tp).run(body)
    for y, _ in results:
        close(y, want.detach())
    close(unshard([g for _, g in results], 0), full.weight.grad)


# -- the whole GPT ---------------------------------------------------------------------------


def gpt_and_batch() -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    gpt = GPT(CONFIG).double()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(CONFIG.vocab_size, (B, T), generator=g)
    targets = torch.randint(CONFIG.vocab_size, (B, T), generator=g)
    targets[0, :3] = -100
    return gpt, idx, targets


@pytest.mark.parametrize("tp", TPS)
def test_tensor_parallel_gpt_gives_the_full_gpts_logits_loss_and_gradients(tp):
    gpt, idx, targets = gpt_and_batch()
    logits = gpt(idx)
    want = next_token_loss(logits, targets)
    want.backward()

    def body(comm):
        model = TensorParallelGPT(gpt, comm)
        mine = model(idx)
        loss = vocab_parallel_cross_entropy(mine, targets, comm)
        loss.backward()
        return mine.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    results = SimulatedWorld(tp).run(body)
    close(torch.cat([r[0] for r in results], -1), logits.detach())
    for _, loss, _ in results:
        close(loss, want.detach())
    got = full_grads([r[2] for r in results])
    expected = {n: p.grad for n, p in gpt.named_parameters()}  # head.weight is tok_emb.weight
    assert got.keys() == expected.keys()
    for name in expected:  # the embedding's includes the tied head's share
        close(got[name], expected[name])


def test_sgd_on_tensor_parallel_gpt_follows_the_full_gpts_training():
    gpt, idx, targets = gpt_and_batch()
    reference = copy.deepcopy(gpt)
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = next_token_loss(reference(idx), targets)
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert want[-1] < want[0]

    def body(comm):
        model = TensorParallelGPT(gpt, comm)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = model.loss(idx, targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, {n: p.detach() for n, p in model.named_parameters()}

    results = SimulatedWorld(2).run(body)
    for losses, _ in results:
        assert losses == pytest.approx(want, rel=1e-10)
    params = full_grads([r[1] for r in results])
    for name, p in reference.named_parameters():
        close(params[name], p.detach())


# -- communication and layouts ----------------------------------------------------------------


class RingCommunicator(SimulatedCommunicator):
    """A simulated rank whose all-reduce is the ring `cost` assumes, its messages traced."""

    def all_reduce(self, tensor, op="sum"):
        assert op == "sum"
        with self._traced("all_reduce", nbytes=tensor.nbytes):
            ring(self, tensor.view(-1))
        return tensor


class RingWorld(SimulatedWorld):
    def communicators(self):
        return [RingCommunicator(self, r) for r in range(self.world_size)]


@pytest.mark.parametrize("tp", [2, 4])
def test_block_communication_is_what_cost_predicts(tp):
    block, x, weights = block_and_input()

    def body(comm):
        module = ParallelBlock(block, comm)
        (module(x.clone().requires_grad_()) * weights).sum().backward()

    world = RingWorld(tp)
    world.run(body)
    tokens, item = B * T, x.element_size()
    for rank in range(tp):
        events = world.trace.of_rank(rank)
        reduces = [e for e in events if e.kind == "all_reduce"]
        assert [e.nbytes for e in reduces] == [tokens * CONFIG.n_embd * item] * 4
        sent = sum(e.nbytes for e in events if e.kind == "send")
        assert sent == pytest.approx(tokens * block_bytes_per_token(CONFIG.n_embd, tp, item))
    network = AlphaBeta(alpha=1e-5, beta=1e9)
    assert world.trace.modeled_time(network) == pytest.approx(
        block_communication_time(tokens, CONFIG.n_embd, tp, network, item), rel=1e-9)
    assert block_bytes_per_token(CONFIG.n_embd, 1) == 0
    assert block_communication_time(tokens, CONFIG.n_embd, 1, network) == 0
    # more ranks, more bytes each: 2(tp-1)/tp of each all-reduce
    assert block_bytes_per_token(64, 8) > block_bytes_per_token(64, 4)
    assert block_bytes_per_token(64, 4) == 4 * RING.sent(4, 128)


def test_layout_counts_the_parameters_a_rank_holds():
    gpt = GPT(CONFIG)
    one = layout(CONFIG, 1, 1, 1)
    assert one.params_per_rank == gpt_num_params(CONFIG) == gpt.num_params()
    assert one.bytes_per_rank == 16 * one.params_per_rank
    assert layout(CONFIG, 1, 1, 1, bytes_per_param=4).bytes_per_rank == 4 * gpt.num_params()

    def numel(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    for tp in (2, 4):
        ranks = SimulatedWorld(tp).communicators()
        held = [numel(TensorParallelGPT(gpt, comm)) for comm in ranks]
        assert layout(CONFIG, tp, 1, 8).params_per_rank == held[0] == max(held)
        # one block per stage: the first stage holds the embeddings and block 0
        first = TensorParallelGPT(gpt, ranks[0])
        stage = numel(first.tok_emb) + numel(first.pos_emb) + numel(first.blocks[0])
        assert layout(CONFIG, tp, CONFIG.n_layer, 1).params_per_rank == stage
    # a vocabulary that does not divide is padded to a multiple of tp
    odd = GPTConfig(vocab_size=30, block_size=8, n_layer=2, n_head=4, n_embd=16)
    assert layout(odd, 4, 1, 1).params_per_rank == layout(CONFIG, 4, 1, 1).params_per_rank


def test_layouts_are_every_valid_split_of_the_ranks_fewest_bytes_first():
    config = GPTConfig(vocab_size=96, block_size=16, n_layer=4, n_head=6, n_embd=48)
    found = layouts(config, 24)
    expected = {(tp, pp, 24 // (tp * pp)) for tp, pp in itertools.product(range(1, 9), range(1, 5))
                if 24 % (tp * pp) == 0 and 6 % tp == 0}
    assert {(x.tp, x.pp, x.dp) for x in found} == expected
    assert len(found) == len(expected)
    assert all(x.tp * x.pp * x.dp == 24 for x in found)
    assert [x.bytes_per_rank for x in found] == sorted(x.bytes_per_rank for x in found)
    for x in found:
        assert x == layout(config, x.tp, x.pp, x.dp)
    assert {x.tp for x in found} == {1, 2, 3, 6}  # 4 and 8 do not divide 6 heads
    assert max(x.tp for x in layouts(config, 24, max_tp=2)) == 2
    with pytest.raises(ValueError, match="tp=4 must divide n_head"):
        layout(config, 4, 1, 1)
    with pytest.raises(ValueError, match="pp=5 stages for 4 layers"):
        layout(config, 1, 5, 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_a_gathered_fused_column_layer_keeps_the_full_layers_order(tp):
    """parts=3 (a fused q/k/v weight): gathered rank by rank, each part's chunks go back in
    place, so the output is the unsplit layer's, not rank 0's q, k, v then rank 1's."""
    torch.manual_seed(0)
    full = nn.Linear(8, 24, dtype=torch.float64)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    outs = SimulatedWorld(tp).run(
        lambda comm: ColumnParallelLinear(full, comm, gather_output=True, parts=3)(x).detach())
    for out in outs:
        torch.testing.assert_close(out, full(x).detach(), rtol=0, atol=1e-12)
