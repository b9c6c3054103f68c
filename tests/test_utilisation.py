"""Model FLOPs and utilisation (lib_dist.train.utilisation): the formula equals what torch's
FlopCounterMode counts over a real step, with the written-out and the fused attention; the
fused attention is the written-out one to float64 rounding, gradients included; MFU is the
ratio it says."""

from __future__ import annotations

import copy

import pytest
import torch

from lib_dist.models import GPT, GPTConfig
from lib_dist.train.utilisation import (counted_flops_per_token, flops_per_token, mfu,
                                        peak_matmul_flops)

CONFIG = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_embd=16)


def tokens(seq_len: int = 16) -> torch.Tensor:
    return torch.randint(0, 40, (3, seq_len), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("seq_len", [16, 9])
def test_the_formula_is_what_torch_counts(fused, seq_len):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**CONFIG.__dict__, "fused_attention": fused}))
    # the CPU's fused kernel has no FLOP formula registered with the counter; its math
    # variant (the same products as matmuls) has
    with sdpa_kernel(SDPBackend.MATH):
        counted = counted_flops_per_token(model, tokens(seq_len))
    assert counted == flops_per_token(CONFIG, seq_len)


def test_fused_attention_is_the_written_out_one():
    torch.manual_seed(0)
    course = GPT(CONFIG).double()
    fused = copy.deepcopy(course)
    for block in fused.blocks:
        block.attn.fused = True
    x = tokens()
    outs = []
    for model in (course, fused):
        out = model(x)
        out.pow(2).mean().backward()
        outs.append((out.detach(), {n: p.grad for n, p in model.named_parameters()}))
    # float64: two orders of the same sums (the fused kernel scales q before the product)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-12, atol=1e-13)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, rtol=1e-10, atol=1e-13, msg=name)


def test_mfu_is_model_flops_per_second_over_the_peak():
    peak = peak_matmul_flops(n=256, repeats=2)
    assert peak > 1e6  # any machine does a million FLOP/s
    per_token = flops_per_token(CONFIG)
    assert mfu(1000.0, CONFIG, peak) == pytest.approx(1000.0 * per_token / peak)
    assert mfu(peak / per_token, CONFIG, peak) == pytest.approx(1.0)
