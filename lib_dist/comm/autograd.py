"""A communication that autograd can differentiate: its gradient is the reverse communication.

An all-gather along some dimension is differentiated by a reduce-scatter along it (each rank's
piece was used by every rank, so its gradient is the sum of theirs), and the other way round;
an all-to-all by the all-to-all that sends everything back. `Transposed.apply(x, forth, back)`
runs `forth(x)` forward and `back(grad)` backward, for any such pair (module 6's f and g are
the same idea, written out for the course in `lib_dist.tensor_parallel.functions`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Communication = Callable[[torch.Tensor], torch.Tensor]


class Transposed(torch.autograd.Function):
    """forward: `forth(x)`; backward: `back(grad)`, the reverse communication."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forth: Communication, back: Communication
                ) -> torch.Tensor:
        ctx.back = back
        return forth(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.back(grad.contiguous()), None, None


__all__ = ["Communication", "Transposed"]
