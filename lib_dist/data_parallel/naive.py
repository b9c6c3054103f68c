"""Data parallel in four lines: average every gradient over the ranks after backward.

    loss = loss_fn(model(x), y)          # x, y: this rank's shard of the batch
    loss.backward()
    average_gradients(comm, model)       # now every rank holds the same, averaged gradient
    optimizer.step()

If the loss is the mean over each rank's B examples, the average of the N ranks' gradients is
the gradient of the mean over all N * B examples: this is SGD with batch N * B, exactly. It is
the version to write first, and it is slow for two reasons that `DataParallel` removes: one
all-reduce per parameter pays the per-message latency once per tensor, and nothing is sent
until backward has finished, so the network idles while the processor computes and the other
way round.
"""

from __future__ import annotations

from torch import nn

from ..comm import Communicator


def average_gradients(comm: Communicator, model: nn.Module) -> None:
    """Replace every parameter's gradient by its average over the ranks, in place.

    Parameters without a gradient (frozen, or unused in this forward) are skipped, so every
    rank must have gradients for the same parameters: a parameter that is used on some ranks
    only would leave the ranks calling different all-reduces (`DataParallel` handles that).
    """
    for p in model.parameters():  # in registration order, the same on every rank
        if p.grad is not None:
            comm.all_reduce(p.grad, "avg")
