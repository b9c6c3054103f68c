"""One expert-parallel MoE step on the virtual clock: the experts' work priced by the rows they
process, the all-gather and the four all-to-alls as the clock charges their messages.

`Priced(expert, comm, name, row_cost)` wraps an expert: its forward is recorded as compute
"F{name}" costing `row_cost` per row, and, when the gradient reaches its output in the backward
pass, "B{name}" costing twice that (a backward pass is about two forwards). `moe_timeline` runs
`ExpertParallelMoE` forward and backward that way on simulated ranks and returns the trace, for
`lib_dist.comm.plot_overlap`: a rank whose experts got more rows computes longer, and every
other rank waits for it in the next all-to-all, which is what `imbalance` costs.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..comm import Communicator, SimulatedWorld, Trace, VirtualClock
from .moe import MoE
from .parallel import ExpertParallelMoE


class Priced(nn.Module):
    """`expert`, its forward and backward declared to `comm` as compute of `row_cost` (and
    2 x `row_cost`) virtual units per row."""

    def __init__(self, expert: nn.Module, comm: Communicator, name: str, row_cost: float):
        super().__init__()
        self.expert, self.comm, self.name, self.row_cost = expert, comm, name, row_cost

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        with self.comm.compute(f"F{self.name}", self.row_cost * rows):
            y = self.expert(x)
        return _PricedBackward.apply(y, self.comm, f"B{self.name}", 2 * self.row_cost * rows)


class _PricedBackward(torch.autograd.Function):
    """Identity forward; backward declares the expert's backward work as it begins."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, comm: Communicator, label: str, cost: float
                ) -> torch.Tensor:
        ctx.comm, ctx.label, ctx.cost = comm, label, cost
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        with ctx.comm.compute(ctx.label, ctx.cost):
            pass
        return grad, None, None, None


def moe_timeline(moe: MoE, batches: list[torch.Tensor], row_cost: float,
                 clock: VirtualClock) -> Trace:
    """The trace of one forward and backward of `ExpertParallelMoE(moe)` on `len(batches)`
    simulated ranks with `clock`, rank r routing `batches[r]`, the loss out.sum() + aux; each
    expert `Priced` at `row_cost` per row."""

    def step(comm: Communicator) -> None:
        mine = copy.deepcopy(moe)
        for i, expert in enumerate(mine.experts):
            mine.experts[i] = Priced(expert, comm, str(i), row_cost)
        out, aux = ExpertParallelMoE(mine, comm)(batches[comm.rank])
        (out.sum() + aux).backward()

    world = SimulatedWorld(len(batches), clock=clock)
    world.run(step)
    return world.trace


__all__ = ["Priced", "moe_timeline"]
