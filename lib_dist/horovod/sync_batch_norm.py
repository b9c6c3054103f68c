"""Horovod's `SyncBatchNorm`: batch normalisation whose statistics are those of every rank's
batch together, as if one process had normalised the concatenated batch.

Each rank's batch is too small for good statistics when a global batch is split N ways; this
layer all-reduces them: the count, then two differentiable allreduces (sums, then squared
deviations from the global mean: more allreduces than Horovod's, but no `E[x^2] - E[x]^2`
cancellation), so the gradients reach every rank's input through the global mean and variance,
as autograd's rules for `allreduce` send them. On CPU tensors too (Horovod's needs a GPU). In
eval mode it normalises with the running statistics, like `torch.nn.BatchNorm*d`.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from . import autograd
from .basics import ReduceOp


def _summed(t: torch.Tensor) -> torch.Tensor:
    return autograd.allreduce(t, op=ReduceOp.Sum)


class SyncBatchNorm(_BatchNorm):
    """`torch.nn.BatchNorm1d/2d/3d` over the batches of all ranks; inputs `(B, C, *)`."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input (batch, channels, ...) of at "
                             f"least 2 dimensions, got shape {tuple(input.shape)}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        shape = (1, -1) + (1,) * (input.dim() - 2)  # a (C,) statistic against (B, C, *)
        running_mean, running_var = self.running_mean, self.running_var
        if self.training or running_mean is None or running_var is None:
            mean, var, count = self._global_moments(input, shape)
            if self.training and self.track_running_stats:
                self._track(mean.detach(), var.detach(), count)
        else:
            mean, var = running_mean, running_var
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _global_moments(self, input: torch.Tensor, shape: tuple[int, ...]
                        ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Mean and (biased) variance per channel over every rank's batch, and its size."""
        dims = [0] + list(range(2, input.dim()))  # every dimension but the channels
        local = torch.tensor([input.numel() // input.size(1)], dtype=torch.float64)
        count = int(_summed(local.to(input.device)).item())
        if count <= 1:  # as BatchNorm: no variance to normalise by
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel over all "
                             f"ranks when training, got {count} (this rank's input has shape "
                             f"{tuple(input.shape)})")
        mean = _summed(input.sum(dims)) / count
        var = _summed(((input - mean.view(shape)) ** 2).sum(dims)) / count
        return mean, var, count

    def _track(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        """Running statistics as BatchNorm keeps them (an unbiased variance)."""
        tracked = self.num_batches_tracked
        if tracked is not None:
            tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # a cumulative average, as BatchNorm's momentum=None
            momentum = 1.0 / float(tracked if tracked is not None else 1)
        unbiased = var * count / max(count - 1, 1)
        with torch.no_grad():
            for running, new in ((self.running_mean, mean), (self.running_var, unbiased)):
                if running is not None:
                    running.mul_(1 - momentum).add_(new.to(running.dtype), alpha=momentum)


__all__ = ["SyncBatchNorm"]
