"""Tolerances from the arithmetic, not from one machine's results.

A floating-point sum of n terms is off by at most (n - 1) u times the sum of their magnitudes
(u = eps / 2, the unit roundoff); a result that comes out of a chain of such sums (a forward
and a backward pass, a reduction over rows, ranks adding their parts) is bounded by the sum of
the chain's lengths, `terms`. With inputs and weights of order 1, the magnitudes involved are
about the result's largest entry, or 1 where that is smaller: hence terms * eps * max(1, |want|).
Different CPU kernels (`ATEN_CPU_CAPABILITY`) add in different orders and stay inside it."""

from __future__ import annotations

import torch

from lib_dist.models.gpt import GPTConfig


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
