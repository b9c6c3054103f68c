"""One rank's stage of a pipelined model: its layers, and the bookkeeping a schedule needs.

A schedule runs a stage's forward and backward one micro-batch at a time, in an order of its
own, so the stage keeps what each micro-batch's backward will need (its input and its output,
with autograd's graph between them) until that backward runs:

    out = stage.forward(j, x)            # the activation to send on (the loss, on the last)
    grad_x = stage.backward(j, grad)     # grad of out; on the last stage, the loss's weight 1/m

Both run inside `comm.compute("F3", cost)` / `comm.compute("B3", cost)`: on a simulated world
with a virtual clock a forward costs `costs.forward` units and a backward `costs.backward`,
and every run leaves its steps, labelled, in the trace (`lib_dist.pipeline.metrics` measures
them). `live` counts the micro-batches whose activations the stage holds; `peak_live` the
most it ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..comm.base import Communicator


@dataclass(frozen=True)
class StepCosts:
    """Virtual units a forward and a backward of one micro-batch cost on this stage."""

    forward: float = 1.0
    backward: float = 2.0


class Stage:
    """Stage `index` (default: the rank) of `num_stages` (default: the world size)."""

    def __init__(self, module: nn.Module, comm: Communicator, *,
                 boundary_shape: Sequence[int], dtype: torch.dtype = torch.float32,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 costs: StepCosts = StepCosts(), index: int | None = None,
                 num_stages: int | None = None):
        self.module, self.comm = module, comm
        self.index = comm.rank if index is None else index
        self.num_stages = comm.world_size if num_stages is None else num_stages
        self.boundary_shape, self.dtype = tuple(boundary_shape), dtype
        self.loss_fn, self.costs = loss_fn, costs
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage computes the loss: give it loss_fn")
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.peak_live = 0

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    @property
    def live(self) -> int:
        return len(self._outputs)

    def receive_buffer(self, micro_batch_size: int) -> torch.Tensor:
        """An empty tensor of the shape, dtype and device that cross a stage boundary: an
        activation (or its gradient) of `micro_batch_size` examples."""
        return torch.empty((micro_batch_size, *self.boundary_shape), dtype=self.dtype,
                           device=self.comm.device)

    def forward(self, micro_batch: int, x: torch.Tensor,
                target: torch.Tensor | None = None) -> torch.Tensor:
        """Run micro-batch `micro_batch` through the stage and keep what its backward needs.
        Returns the output to send to the next stage (detached from the graph), or, on the
        last stage, the loss against `target`."""
        if micro_batch in self._outputs:
            raise RuntimeError(f"stage {self.index}: forward of micro-batch {micro_batch} "
                               f"again before its backward")
        if self.is_last and target is None:
            raise ValueError(f"stage {self.index} is the last: its forward needs the target")
        with self.comm.compute(f"F{micro_batch}", self.costs.forward):
            if not self.is_first:
                x = x.detach().requires_grad_()
                self._inputs[micro_batch] = x
            out = self.module(x)
            if self.is_last:
                assert self.loss_fn is not None and target is not None
                out = self.loss_fn(out, target)
        self._outputs[micro_batch] = out
        self.peak_live = max(self.peak_live, self.live)
        return out.detach()

    def backward(self, micro_batch: int, grad: torch.Tensor | float | None
                 ) -> torch.Tensor | None:
        """Backpropagate micro-batch `micro_batch` from the gradient of its output (on the
        last stage: the weight of its loss in the step's loss, 1/m for a mean over m
        micro-batches), adding into the parameters' `.grad`, and free its activations.
        Returns the gradient of its input, to send to the previous stage (None on the first)."""
        if micro_batch not in self._outputs:
            raise RuntimeError(f"stage {self.index}: backward of micro-batch {micro_batch}, "
                               f"whose forward has not run (or whose backward already has)")
        out = self._outputs.pop(micro_batch)
        x = self._inputs.pop(micro_batch, None)
        with self.comm.compute(f"B{micro_batch}", self.costs.backward):
            if isinstance(grad, (int, float)):  # a loss's weight, in the loss's own precision
                grad = torch.tensor(float(grad), dtype=out.dtype, device=out.device)
            if grad is not None:
                grad = grad.to(out.dtype).reshape(out.shape)
            torch.autograd.backward(out, grad)
        if x is None:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)
