"""One 3D-parallel training step.

A dp replica takes its share of the global batch (`replica_batch`); its pp stages run 1F1B
over m micro-batches, each block's tensor-parallel all-reduces inside the tp group; then every
gradient is averaged over the dp group (`average_over_replicas`: one all-reduce of them all,
flattened) and the optimizer steps. The mean loss over a replica's
share, averaged over the replicas, is the mean over the global batch, as one process computes
it: the last stage holds it, and `global_loss` hands it to every rank.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..comm.base import Communicator
from ..pipeline import one_f_one_b_step
from .model import ThreeD


def replica_batch(three_d: ThreeD, inputs: torch.Tensor,
                  targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This dp replica's consecutive share of the global batch (the same on its pp and tp
    ranks)."""
    dp = three_d.mesh["dp"]
    if len(inputs) % dp.world_size:
        raise ValueError(f"a global batch of {len(inputs)} does not split over dp="
                         f"{dp.world_size} replicas: choose a multiple of {dp.world_size}")
    share = len(inputs) // dp.world_size
    rows = slice(dp.rank * share, (dp.rank + 1) * share)
    return inputs[rows], targets[rows]


def three_d_step(three_d: ThreeD, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                 targets: torch.Tensor, m: int) -> float:
    """One step on the global batch (inputs, targets), m micro-batches per replica; returns
    the global batch's mean loss (on every rank)."""
    optimizer.zero_grad()
    x, y = replica_batch(three_d, inputs, targets)
    loss = one_f_one_b_step(three_d.mesh["pp"], three_d.stage, x, y, m)
    average_over_replicas(three_d.parameters(), three_d.mesh["dp"])
    optimizer.step()
    return global_loss(three_d, loss)


def average_over_replicas(parameters: Iterable[torch.nn.Parameter], dp: Communicator) -> None:
    """Each gradient replaced in place by its mean over the dp group, all of them flattened
    into one all-reduce per dtype: one message's latency for the whole model rather than one
    per tensor (module 4's buckets, sent once the pipeline has drained)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is None:  # a parameter this stage never used: its gradient is zero
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])  # (sum of numels,)
        dp.all_reduce(flat, op="avg")
        for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(mean.view_as(grad))


def global_loss(three_d: ThreeD, replica_loss: float | None) -> float:
    """The global batch's mean loss on every rank: the replicas' last stages hold their mean
    losses; the pp group brings the last stage's to the others, the dp group averages."""
    pp, dp = three_d.mesh["pp"], three_d.mesh["dp"]
    stage = three_d.stage
    loss = torch.tensor([replica_loss if stage.is_last else 0.0], dtype=torch.float64,
                        device=pp.device)
    pp.all_reduce(loss)  # only the last stage's is not zero
    dp.all_reduce(loss, op="avg")
    return loss.item()
