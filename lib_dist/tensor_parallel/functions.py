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
"""

from __future__ import annotations

from typing import Any

import torch

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


def copy_to_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """x itself forward; its gradient summed over the ranks backward."""
    return CopyToRanks.apply(x, comm)


def reduce_from_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """The sum of every rank's x forward; the gradient passed through backward."""
    return ReduceFromRanks.apply(x, comm)


def gather_from_ranks(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Every rank's x concatenated along the last dimension, in rank order."""
    return GatherFromRanks.apply(x, comm)
