"""Sending less: top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018).

Top-k keeps the k gradient entries of largest magnitude and sends (value, index) pairs. The
entries left out are not thrown away: error feedback adds them, as a residual, to the next
step's gradient, so every bit of gradient is applied eventually. Step by step,

    sent_t + residual_t == gradient_t + residual_{t-1}

exactly, so the sum of what was sent plus the last residual is the sum of the gradients.
Without error feedback the small entries of a gradient are never applied at all.
"""

from __future__ import annotations

import torch

from ..comm import Communicator


class TopK:
    """Top-k sparsification of flat gradients, with error feedback unless told otherwise.
    `ratio`: the share of entries sent (k = max(1, round(ratio * numel)))."""

    def __init__(self, ratio: float, error_feedback: bool = True):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio, self.error_feedback = ratio, error_feedback
        self.residual: torch.Tensor | None = None

    def k(self, numel: int) -> int:
        return max(1, round(self.ratio * numel))

    def compress(self, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, indices) of the k largest entries of grad (+ the residual), flattened."""
        acc = grad.detach().reshape(-1).clone()
        if self.error_feedback and self.residual is not None:
            acc += self.residual
        indices = acc.abs().topk(self.k(acc.numel()), sorted=False).indices
        values = acc[indices]
        if self.error_feedback:
            acc[indices] = 0
            self.residual = acc
        return values, indices

    @staticmethod
    def decompress(values: torch.Tensor, indices: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A dense tensor shaped like `like`, zero but at `indices`."""
        dense = torch.zeros(like.numel(), dtype=values.dtype, device=values.device)
        dense.index_add_(0, indices, values)
        return dense.view_as(like)


def sparse_all_reduce(comm: Communicator, compressor: TopK, grad: torch.Tensor,
                      op: str = "avg") -> torch.Tensor:
    """Every rank's top-k of its gradient, all-gathered and summed (or averaged): a dense
    result, in a new tensor. Each rank sends k values and k indices to every other rank."""
    values, indices = compressor.compress(grad)
    total = torch.zeros(grad.numel(), dtype=grad.dtype, device=grad.device)
    for v, i in zip(comm.all_gather(values), comm.all_gather(indices)):
        total.index_add_(0, i, v)
    if op == "avg":
        total /= comm.world_size
    return total.view_as(grad)
