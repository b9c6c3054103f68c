"""Run a schedule for real: one training step's forwards and backwards, on every rank.

`run_schedule` follows a rank's list of steps (`lib_dist.pipeline.schedules`): a forward
receives the micro-batch's activation (or takes its slice of the batch, on the first stage),
runs it and sends the output on; a backward receives the gradient of that output (on the last
stage, the loss's weight 1/m), runs it and sends the gradient of the input back. The
parameters' gradients add up over the micro-batches: after the step they are those of the
mean loss over the whole batch, as in one process. The last stage returns that mean loss;
the others return None.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..comm.base import Communicator, Handle, wait_all
from .p2p import recv_backward, recv_forward, send_backward, send_forward
from .schedules import Step, gpipe, one_f_one_b
from .stage import Stage


def micro_batches(batch: torch.Tensor, m: int) -> list[torch.Tensor]:
    """`batch` cut along its first dimension into m equal micro-batches."""
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"m (micro-batches) must be an integer >= 1, got {m!r}")
    if len(batch) % m:
        raise ValueError(f"a batch of {len(batch)} does not split into {m} equal micro-batches: "
                         f"pick m dividing {len(batch)}")
    return list(batch.split(len(batch) // m))


def run_schedule(comm: Communicator, stage: Stage, steps: Sequence[Step],
                 inputs: torch.Tensor, targets: torch.Tensor, m: int) -> float | None:
    """Run this rank's `steps` of one training step on the batch (inputs, targets)."""
    xs, ys = micro_batches(inputs, m), micro_batches(targets, m)
    size = len(ys[0])
    sends: list[Handle | None] = []
    losses: list[float] = []
    for step in steps:
        j = step.micro_batch
        if step.kind == "F":
            x = xs[j] if stage.is_first else recv_forward(comm, stage, size)
            out = stage.forward(j, x, ys[j] if stage.is_last else None)
            if stage.is_last:
                losses.append(out.item())
            else:
                sends.append(send_forward(comm, stage, out))
        elif step.kind == "B":
            grad = 1.0 / m if stage.is_last else recv_backward(comm, stage, size)
            sends.append(send_backward(comm, stage, stage.backward(j, grad)))
        else:
            raise ValueError(f"run_schedule runs forward (F) and backward (B) steps, not "
                             f"{step.kind}")
    wait_all([h for h in sends if h is not None])
    return sum(losses) / m if stage.is_last else None


def gpipe_step(comm: Communicator, stage: Stage, inputs: torch.Tensor, targets: torch.Tensor,
               m: int) -> float | None:
    """One GPipe step: every forward, then every backward."""
    return run_schedule(comm, stage, gpipe(stage.num_stages, m)[stage.index], inputs,
                        targets, m)


def one_f_one_b_step(comm: Communicator, stage: Stage, inputs: torch.Tensor,
                     targets: torch.Tensor, m: int) -> float | None:
    """One 1F1B step: warm-up forwards, then a forward and a backward in turn."""
    return run_schedule(comm, stage, one_f_one_b(stage.num_stages, m)[stage.index], inputs,
                        targets, m)
