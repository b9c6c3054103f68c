"""What crosses a stage boundary: activations forward, their gradients backward.

Stage s lives on rank s; it receives activations from rank s - 1 and gradients from rank
s + 1, and sends to the same neighbours, nobody else: m activation messages and m gradient
messages per boundary per step. Sends are `isend`s, whose handles the step waits for at its
end: a blocking send would hold the sender until its neighbour is ready to receive, and two
neighbours that both send first would deadlock. Receives block: the step needs the tensor.
"""

from __future__ import annotations

import torch

from ..comm.base import Communicator, Handle
from .stage import Stage


def send_forward(comm: Communicator, stage: Stage, activation: torch.Tensor) -> Handle | None:
    """Start sending `activation` to the next stage (nothing on the last)."""
    if stage.is_last:
        return None
    return comm.isend(activation.contiguous(), stage.index + 1)


def recv_forward(comm: Communicator, stage: Stage, micro_batch_size: int) -> torch.Tensor:
    """The previous stage's activation for the next micro-batch."""
    buffer = stage.receive_buffer(micro_batch_size)
    comm.recv(buffer, stage.index - 1)
    return buffer


def send_backward(comm: Communicator, stage: Stage, grad: torch.Tensor | None
                  ) -> Handle | None:
    """Start sending the gradient of this stage's input to the previous stage (nothing on
    the first)."""
    if stage.is_first or grad is None:
        return None
    return comm.isend(grad.contiguous(), stage.index - 1)


def recv_backward(comm: Communicator, stage: Stage, micro_batch_size: int) -> torch.Tensor:
    """The next stage's gradient of this stage's output, for the next micro-batch."""
    buffer = stage.receive_buffer(micro_batch_size)
    comm.recv(buffer, stage.index + 1)
    return buffer
