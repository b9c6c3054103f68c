"""lib_dist's tensor parallelism on 4 real ranks (engines, gloo): ParallelMLP and
ParallelAttention give the outputs and full gradients of torch.distributed.tensor.parallel's
ColwiseParallel/RowwiseParallel plan on the same modules, and of the unsplit modules; a
TensorParallelGPT gives one process's loss and gradients, with the all-reduces of Megatron's
plan and nothing else in its trace."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from lib_dist.cluster import Cluster
from lib_dist.losses import next_token_loss
from lib_dist.models.gpt import GPT, Block, GPTConfig
from lib_dist.tensor_parallel import unshard


from tolerances import gpt_terms, rounding

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster]

CONFIG = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16)
B, T = 2, 8
F64 = torch.float64


@pytest.fixture(scope="module")
def cluster():
    with Cluster(4, timeout=60) as c:
        yield c


TERMS = gpt_terms(CONFIG, B * T) + 4  # the whole GPT on B x T tokens, 4 ranks' parts added


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to float64 rounding (tests/tolerances.py)."""
    torch.testing.assert_close(a, b, rtol=0, atol=rounding(b, TERMS))


def inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(B, T, CONFIG.n_embd, dtype=F64, generator=g),
            torch.randn(B, T, CONFIG.n_embd, dtype=F64, generator=g))


def both_frameworks(comm, block, x, weights):
    """For the MLP and the attention: (output, input gradient, parameter gradients) of
    lib_dist's module and of torch's plan, on this rank."""
    from lib_dist.tensor_parallel import ParallelAttention, ParallelMLP
    from lib_dist.tensor_parallel.dtensor import (device_mesh, gradients,
                                                  torch_parallel_attention, torch_parallel_mlp)

    mesh = device_mesh(comm.world_size)
    out = {}
    for kind, ours, theirs in (
            ("mlp", ParallelMLP(block.mlp, comm), torch_parallel_mlp(block.mlp, mesh)),
            ("attn", ParallelAttention(block.attn, comm),
             torch_parallel_attention(block.attn, mesh))):
        results = []
        for module in (ours, theirs):
            xr = x.clone().requires_grad_()
            y = module(xr)
            (y * weights).sum().backward()
            grads = ({n: p.grad for n, p in module.named_parameters()} if module is ours
                     else gradients(module))
            results.append((y.detach(), xr.grad, grads))
        out[kind] = results
    return out


def test_parallel_mlp_and_attention_equal_torchs_plan_and_the_full_modules(cluster):
    torch.manual_seed(0)
    block = Block(CONFIG).double()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    x, weights = inputs()
    per_rank = cluster.run(both_frameworks, block, x, weights)
    for kind in ("mlp", "attn"):
        full = getattr(block, kind)
        xf = x.clone().requires_grad_()
        want = full(xf)
        (want * weights).sum().backward()
        expected = {n: p.grad for n, p in full.named_parameters()}
        mine = []
        for (y, x_grad, grads), (ty, tx_grad, torch_grads) in (r[kind] for r in per_rank):
            close(y, ty)
            close(y, want.detach())
            close(x_grad, tx_grad)
            close(x_grad, xf.grad)
            assert torch_grads.keys() == expected.keys()
            for name in expected:  # torch's DTensors gathered whole
                close(torch_grads[name], expected[name])
            mine.append(grads)
        ours = {
            "weight": unshard([g["qkv.weight" if kind == "attn" else "fc.weight"] for g in mine],
                              0, parts=3 if kind == "attn" else 1),
            "bias": unshard([g["qkv.bias" if kind == "attn" else "fc.bias"] for g in mine],
                            0, parts=3 if kind == "attn" else 1),
            "proj.weight": unshard([g["proj.weight"] for g in mine], 1),
        }
        first = "qkv" if kind == "attn" else "fc"
        close(ours["weight"], expected[f"{first}.weight"])
        close(ours["bias"], expected[f"{first}.bias"])
        close(ours["proj.weight"], expected["proj.weight"])
        for g in mine:  # the row-parallel bias is whole on every rank
            close(g["proj.bias"], expected["proj.bias"])


def gpt_step(comm, gpt, idx, targets):
    from lib_dist.tensor_parallel import TensorParallelGPT

    model = TensorParallelGPT(gpt, comm)
    comm.trace.clear()  # the run's events only
    loss = model.loss(idx, targets)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def test_tensor_parallel_gpt_gives_one_process_loss_with_megatrons_all_reduces(cluster):
    torch.manual_seed(0)
    gpt = GPT(CONFIG).double()
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(CONFIG.vocab_size, (B, T), generator=g)
    targets = torch.randint(CONFIG.vocab_size, (B, T), generator=g)
    want = next_token_loss(gpt(idx), targets)
    want.backward()
    per_rank = cluster.run(gpt_step, gpt, idx, targets)
    for loss, _ in per_rank:
        assert loss == pytest.approx(want.item(), abs=rounding(want, TERMS))
    grads = [r[1] for r in per_rank]
    close(unshard([gr["tok_emb.weight"] for gr in grads], 0), gpt.tok_emb.weight.grad)
    close(unshard([gr["blocks.1.attn.qkv.weight"] for gr in grads], 0, parts=3),
          gpt.blocks[1].attn.qkv.weight.grad)
    close(unshard([gr["blocks.0.mlp.proj.weight"] for gr in grads], 1),
          gpt.blocks[0].mlp.proj.weight.grad)
    # Per rank: 2 all-reduces forward and 2 backward per block, 1 for the embedding's lookup,
    # 1 for the head's input gradient (its f), 1 for the loss's sums, and 1 all-gather of the
    # rows' maxima: never the logits.
    expected = {"all_reduce": 4 * CONFIG.n_layer + 3, "all_gather": 1}
    tokens = B * T
    for rank in range(4):
        events = [e for e in cluster.trace.events if e.rank == rank]
        assert Counter(e.kind for e in events) == expected
        reduced = sorted(e.nbytes for e in events if e.kind == "all_reduce")
        assert reduced.count(tokens * CONFIG.n_embd * 8) == 4 * CONFIG.n_layer + 2
        assert reduced[0] == 2 * tokens * 8  # the loss's two numbers per row
        assert max(e.nbytes for e in events) < tokens * CONFIG.vocab_size * 8  # the logits'
