"""Gradients through Horovod's collectives, as Horovod defines them, and the out-of-place
`allreduce`, `allgather` and `broadcast`, which take this path when their input requires a
gradient (built on `ops` and `gather`, which know nothing of it).

Each rank computes its own loss from the collective's output, so the gradient of a rank's
input sums what every rank's loss says about it:
- allreduce: the gradient is all-reduced with the same op and scale factors (for `Average`,
  each input contributes 1/size to the output every rank sees);
- allgather: every rank's gradient of the whole concatenation is summed, and each rank keeps
  the rows that came from it;
- broadcast: the gradients are summed on the root; the other ranks' inputs did not count.
"""

from __future__ import annotations

from typing import Any

import torch

from . import gather, ops
from .compression import Compressor, NoneCompressor


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, average: bool | None, name: str | None,
                compression: type[Compressor], op: Any, prescale: float, postscale: float,
                process_set: Any) -> torch.Tensor:
        ctx.args = (average, op, prescale, postscale, process_set)
        result: torch.Tensor = ops._allreduce(tensor, None, average, name, op, prescale,
                                              postscale, process_set, True, compression)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        average, op, prescale, postscale, process_set = ctx.args
        reduced = ops._allreduce(grad.contiguous(), None, average, None, op, prescale,
                                 postscale, process_set, True)
        return reduced, None, None, None, None, None, None, None


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                process_set: Any) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.shape = tensor.shape
        result: torch.Tensor = gather._allgather(tensor, name, process_set, True)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        summed = ops._allreduce(grad.contiguous(), None, None, None, ops.Sum, 1.0, 1.0, None,
                                True)
        counts = gather._allgather(torch.tensor([ctx.rows]), None, None, True)
        first = int(counts[: ops.basics.rank()].sum())
        return summed[first: first + ctx.rows].reshape(ctx.shape), None, None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: Any) -> torch.Tensor:
        ctx.root = root_rank
        result: torch.Tensor = gather._broadcast(tensor, root_rank, False, name, process_set, True)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        summed = ops._allreduce(grad.contiguous(), None, None, None, ops.Sum, 1.0, 1.0, None,
                                True)
        if ops.basics.rank() != ctx.root:
            summed = torch.zeros_like(summed)
        return summed, None, None, None


def allreduce_with_grad(tensor: torch.Tensor, average: bool | None, name: str | None,
                        compression: type[Compressor], op: Any, prescale: float,
                        postscale: float, process_set: Any) -> torch.Tensor:
    result: torch.Tensor = _Allreduce.apply(tensor, average, name, compression, op, prescale,
                                            postscale, process_set)
    return result


def allgather_with_grad(tensor: torch.Tensor, name: str | None,
                        process_set: Any) -> torch.Tensor:
    result: torch.Tensor = _Allgather.apply(tensor, name, process_set)
    return result


def broadcast_with_grad(tensor: torch.Tensor, root_rank: int, name: str | None,
                        process_set: Any) -> torch.Tensor:
    result: torch.Tensor = _Broadcast.apply(tensor, root_rank, name, process_set)
    return result


# -- the out-of-place forms, differentiable ---------------------------------------------

def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = NoneCompressor, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """A new tensor: `tensor` reduced over all ranks by `op` (default `Average`), sent
    compressed by `compression`. Differentiable: the gradient is all-reduced the same way."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return allreduce_with_grad(tensor, average, name, compression, op, prescale_factor,
                                   postscale_factor, process_set)
    result: torch.Tensor = ops._allreduce(tensor, None, average, name, op, prescale_factor,
                                          postscale_factor, process_set, True, compression)
    return result


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order. The first
    dimension may differ between ranks, the others and the dtype may not. Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return allgather_with_grad(tensor, name, process_set)
    result: torch.Tensor = gather._allgather(tensor, name, process_set, True)
    return result


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """A new tensor holding rank `root_rank`'s `tensor`, on every rank. Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return broadcast_with_grad(tensor, root_rank, name, process_set)
    result: torch.Tensor = gather._broadcast(tensor, root_rank, False, name, process_set, True)
    return result
