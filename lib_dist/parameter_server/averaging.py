"""Model averaging: local SGD and FedAvg (McMahan et al. 2017).

Gradient averaging (data parallel, a synchronous parameter server) exchanges gradients every
step, so every replica holds the same parameters all the time. Model averaging lets each worker
take `every` = H optimizer steps on its own data with its own parameters, then replaces every
replica by the average of the parameters: H times fewer messages, at the price of replicas that
drift apart in between.

With SGD and H = 1 the two are the same algorithm: the mean of (theta - lr * g_i) is
theta - lr * mean(g_i), and with momentum the mean of the workers' buffers is the buffer of the
mean gradient (both are linear in the gradients). With Adam, or H > 1, they are not. FedAvg weighs each worker
by its number of examples n_k / n, so that a worker with more data counts for more.

Averaging is not asynchrony: every worker waits for the others at each average, and no
gradient is ever applied to parameters other than the ones it was computed on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..comm import Communicator


@torch.no_grad()
def average_parameters(comm: Communicator, model: nn.Module, weight: float = 1.0) -> None:
    """Replace every parameter by the average over the ranks, rank r weighted by
    weight_r / sum(weights) (equal by default), in place."""
    total = comm.all_reduce(torch.tensor([float(weight)], dtype=torch.float64), "sum")
    share = weight / float(total)
    for p in model.parameters():
        p.mul_(share)
        comm.all_reduce(p.data, "sum")


def local_sgd(comm: Communicator, model: nn.Module, optimizer: torch.optim.Optimizer,
              batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], steps: int,
              every: int, weight: float = 1.0) -> list[float]:
    """`steps` local optimizer steps on this rank's batches `batch_fn(step)`, averaging the
    parameters over the ranks (weighted by `weight`) after every `every` steps and after the
    last. Returns this rank's losses."""
    if every < 1:
        raise ValueError(f"every must be >= 1 (steps between averages), got {every}")
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch_fn(step)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            average_parameters(comm, model, weight)
    return losses


def sum_of_deviations(replicas: list[torch.Tensor]) -> torch.Tensor:
    """sum_i (theta_i - mean): zero for any replicas, which is why a formula that adds
    'the deviations from the average' to anything adds nothing."""
    mean = torch.stack(replicas).mean(0)
    return torch.stack([r - mean for r in replicas]).sum(0)
