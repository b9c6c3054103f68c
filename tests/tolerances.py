"""Tolerances from the arithmetic, not from one machine's results.

Two bounds, for two kinds of result. Each operation rounds to within eps (the dtype's machine
epsilon) of its exact result, and every error is relative to the largest number that went into
the result.
- `tolerance`: one reduction of `terms` numbers (a softmax's sum, a loss's mean), which torch
  adds in blocks and pairs, piling up about log2(terms) more such errors; two implementations
  (or two CPU kernels) each round a few times and both may err: 8 covers that.
- `rounding`: a result that comes out of a chain of sums (a forward and a backward pass, a
  reduction over rows, ranks adding their parts) whose lengths add up to `terms`, bounded in
  the worst case: a sum of n terms is off by at most (n - 1) u times the sum of their magnitudes
  (u = eps / 2). With inputs and weights of order 1 the magnitudes involved are about the
  result's largest entry, or 1 where that is smaller: terms * eps * max(1, |want|).
Different CPU kernels (`ATEN_CPU_CAPABILITY`) add in different orders and stay inside both.
"""

from __future__ import annotations

import math

import torch

from lib_dist.models.gpt import GPTConfig


def tolerance(dtype: torch.dtype, magnitude: float | torch.Tensor, terms: int = 1) -> float:
    """8 eps(dtype) x magnitude x (log2(terms) + 1)."""
    return 8 * torch.finfo(dtype).eps * float(magnitude) * (math.log2(terms) + 1)


def worst(got: torch.Tensor | float, want: torch.Tensor | float) -> float:
    """The largest absolute difference between `got` and `want`."""
    return float((torch.as_tensor(got) - torch.as_tensor(want)).abs().max())


def gpt_terms(config: GPTConfig, tokens: int) -> int:
    """The longest chain of additions behind a GPT's loss or a gradient: forward and backward
    through each block (n_embd inputs to qkv, head_size to a score, T scores to a value, n_embd
    to proj and to fc, 4 n_embd to the MLP's projection), the head (n_embd) and the softmax
    (vocab_size), and the sum over the batch's `tokens`."""
    head_size = config.n_embd // config.n_head
    block = 3 * config.n_embd + head_size + config.block_size + 4 * config.n_embd
    return 2 * config.n_layer * block + config.n_embd + config.vocab_size + tokens


def rounding(want: torch.Tensor | float, terms: int, dtype: torch.dtype | None = None,
             scale: float = 1.0) -> float:
    """terms * eps * max(scale, |want|): how far rounding can take a result of `terms`
    additions in `dtype` (by default want's) whose inputs are of size `scale`."""
    want = torch.as_tensor(want)
    eps = torch.finfo(dtype or want.dtype).eps
    return terms * eps * max(scale, want.abs().max().item() if want.numel() else 0.0)
