"""One optimization step. This is an extension point: `train` takes any function with the
signature of `train_step`, such as lab 2's step with gradient accumulation.

    step(model, optimizer, x, y, loss_fn) -> float

It must leave the parameters updated once, from the gradient of the mean loss over the whole
batch (x, y), and return that loss as a Python float (its value before the update). It must
not depend on gradients left over from an earlier step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StepFn = Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor, LossFn], float]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, loss_fn: LossFn) -> float:
    """Forward the whole batch, backward, update: the plain step, without accumulation."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
