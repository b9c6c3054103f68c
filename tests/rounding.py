"""How far two correct floating-point computations of one result may differ, for tests that
compare with torch or with an exact value. The bound follows from the arithmetic, not from one
machine's results: each operation rounds to within eps (the dtype's machine epsilon) of its
exact result, a reduction of `terms` numbers, which torch adds in blocks and pairs, piles up
about log2(terms) more such errors, and every error is relative to the largest number that went
into the result. Two implementations (or two CPU kernels) each round a few times, and both may
err: 8 covers that."""

from __future__ import annotations

import math

import torch


def tolerance(dtype: torch.dtype, magnitude: float | torch.Tensor, terms: int = 1) -> float:
    """8 eps(dtype) x magnitude x (log2(terms) + 1)."""
    return 8 * torch.finfo(dtype).eps * float(magnitude) * (math.log2(terms) + 1)


def worst(got: torch.Tensor | float, want: torch.Tensor | float) -> float:
    """The largest absolute difference between `got` and `want`."""
    return float((torch.as_tensor(got) - torch.as_tensor(want)).abs().max())
