"""The conjugate operators of Megatron-style tensor parallelism, as autograd functions.

A column-parallel layer needs every rank to see the whole input; a row-parallel layer leaves
each rank with a partial sum of the output. Two operators mark those boundaries, each the
other's transpose (Megatron-LM calls them f and g):

- `copy_to_ranks` (f): forward, the identity (every rank already holds the input); backward,
  an all-reduce, since each rank computed the input's gradient through its own shard only;
- `reduce_from_ranks` (g): forward, an all-reduce of the partial sums; backward, the identity,
  since the sum's gradient is the same for every term.

`gather_from_ranks` all-gathers a last dimension split over the ranks (backward: keep this
rank's slice), for a column-parallel layer whose caller wants the whole output.

`linear_overlapped` is f and a column-parallel layer's product in one function, whose backward
starts the all-reduce of the input's gradient (`all_reduce_async`) and computes the weight's
gradient, which no other layer waits for, while it runs: Megatron-LM's column-parallel layer
overlaps the two the same way. Forward, g's all-reduce has nothing to overlap with: the next
layer needs its result.
"""

from __future__ import annotations

from typing import Any

import torch

from torch.nn import functional as F

from ..comm import Communicator


class CopyToRanks(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.comm.all_reduce(grad.contiguous().clone(), "sum"), None


class ReduceFromRanks(torch.autograd.Function):
    """g: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        return comm.all_reduce(x.contiguous().clone(), "sum")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class GatherFromRanks(torch.autograd.Function):
    """All-gather along the last dimension forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm, ctx.width = comm, x.shape[-1]
        return torch.cat(comm.all_gather(x.contiguous()), dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.comm.rank * ctx.width
        return grad[..., start:start + ctx.width].contiguous(), None


class LinearOverlapped(torch.autograd.Function):
    """f, then x W^T + b; backward, x's gradient all-reduced while W's and b's are computed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                comm: Communicator) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.comm, ctx.has_bias = comm, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        grad_x = grad.matmul(weight)                        # this rank's term of the sum
        handle = ctx.comm.all_reduce_async(grad_x, "sum")   # runs while the rest computes
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = rows.t().matmul(x.reshape(-1, x.shape[-1]))
        grad_bias = rows.sum(0) if ctx.has_bias else None
        handle.wait()
        return grad_x, grad_weight, grad_bias, None


def copy_to_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """x itself forward; its gradient summed over the ranks backward."""
    return CopyToRanks.apply(x, comm)


def reduce_from_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """The sum of every rank's x forward; the gradient passed through backward."""
    return ReduceFromRanks.apply(x, comm)


def gather_from_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Every rank's x concatenated along the last dimension, in rank order."""
    return GatherFromRanks.apply(x, comm)


def linear_overlapped(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      comm: Communicator) -> torch.Tensor:
    """`F.linear(copy_to_ranks(x, comm), weight, bias)`, the same values and gradients, with
    the backward's all-reduce of x's gradient overlapping the weight gradient's product."""
    return LinearOverlapped.apply(x, weight, bias, comm)
