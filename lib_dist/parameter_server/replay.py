"""Asynchronous SGD in one process: the oracle for a parameter server, and the simulator the
course measures convergence against staleness with.

`replay_async` applies the workers' gradients in a given order, each computed on the
parameters that worker last pulled, exactly as an asynchronous server with that order would.
A parameter server that follows a schedule (or records the order it saw) must end with these
parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .layout import flat_gradients, flat_parameters, load_flat
from .schedule import staleness_of


def staleness_aware(lr: float) -> Callable[[int], float]:
    """The learning rate lr / tau for a gradient tau updates stale (Zhang et al. 2016):
    a gradient that is older moves the parameters less. tau = 0 keeps lr."""
    return lambda tau: lr / max(tau, 1)


@dataclass
class AsyncRun:
    """`parameters`: the final flat vector; `staleness` of every update; `curve`: (update,
    value of `evaluate`) every `every` updates, from update 0."""

    parameters: torch.Tensor
    staleness: list[int]
    curve: list[tuple[int, float]] = field(default_factory=list)


def replay_async(model: nn.Module, order: Sequence[int], lr: float,
                 batch_fn: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 lr_for_staleness: Callable[[int], float] | None = None,
                 evaluate: Callable[[nn.Module], float] | None = None,
                 every: int = 1) -> AsyncRun:
    """Apply the gradients of `order` (worker ids, each worker's n-th appearance its step n)
    with SGD. `model` gives the initial parameters and is left holding the final ones.
    `batch_fn(worker, step)`; `evaluate(model)` is called on the server's parameters."""
    theta = flat_parameters(model)
    pulled = dict.fromkeys(order, theta)  # every worker starts from the initial parameters
    steps: dict[int, int] = {}
    staleness = staleness_of(order)
    rate = lr_for_staleness or (lambda tau: lr)
    curve = []
    for k, w in enumerate(order):
        if evaluate is not None and k % every == 0:
            curve.append((k, _evaluate_at(model, theta, evaluate)))
        grad = _gradient_at(model, pulled[w], batch_fn(w, steps.get(w, 0)), loss_fn)
        theta = theta - rate(staleness[k]) * grad
        pulled[w], steps[w] = theta, steps.get(w, 0) + 1
    if evaluate is not None:
        curve.append((len(order), _evaluate_at(model, theta, evaluate)))
    load_flat(model, theta)
    return AsyncRun(theta, staleness, curve)


def _gradient_at(model: nn.Module, params: torch.Tensor,
                 batch: tuple[torch.Tensor, torch.Tensor],
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    load_flat(model, params)
    model.zero_grad(set_to_none=True)
    x, y = batch
    loss_fn(model(x), y).backward()
    return flat_gradients(model)


def _evaluate_at(model: nn.Module, params: torch.Tensor,
                 evaluate: Callable[[nn.Module], float]) -> float:
    load_flat(model, params)
    with torch.no_grad():
        return float(evaluate(model))
