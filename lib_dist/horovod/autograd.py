"""Gradients through Horovod's collectives, as Horovod defines them, and the out-of-place
`allreduce`, `allgather` and `broadcast`, which take this path when their input requires a
gradient (built on `ops` and `gather`, which know nothing of it).

Horovod's rules, which treat the ranks' losses as one averaged loss:
- allreduce: the gradient is all-reduced with the same op and scale factors;
- allgather: every rank's gradient of the whole concatenation is averaged over the ranks,
  and each rank keeps the rows that came from it;
- broadcast: the gradients are averaged, and kept on the root; the other ranks' inputs did
  not count (zero);
- alltoall: the gradients travel back the way the rows came (an alltoall with the received
  splits);
- reducescatter: each rank's gradient of its block is scaled (by the number of ranks for
  `Sum`, and the scale factors) and gathered.
"""

from __future__ import annotations

from typing import Any

import torch

from . import gather, ops, scatter
from .compression import Compressor, NoneCompressor
from .process_sets import state_for


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
        ctx.shape, ctx.process_set = tensor.shape, process_set
        result: torch.Tensor = gather._allgather(tensor, name, process_set, True)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        averaged = ops._allreduce(grad.contiguous(), None, None, None, ops.Average, 1.0, 1.0,
                                  ctx.process_set, True)
        counts = gather._allgather(torch.tensor([ctx.rows]), None, ctx.process_set, True)
        first = int(counts[: state_for(ctx.process_set, "allgather").comm.rank].sum())
        return averaged[first: first + ctx.rows].reshape(ctx.shape), None, None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: Any) -> torch.Tensor:
        ctx.root, ctx.process_set = root_rank, process_set
        result: torch.Tensor = gather._broadcast(tensor, root_rank, False, name, process_set, True)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        averaged = ops._allreduce(grad.contiguous(), None, None, None, ops.Average, 1.0, 1.0,
                                  ctx.process_set, True)
        if ops.basics.rank() != ctx.root:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: Any) -> Any:
        output, received = scatter._alltoall(tensor, splits, name, process_set, True)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> Any:
        back, _ = scatter._alltoall(grad.contiguous(), ctx.received, None, ctx.process_set,
                                    True)
        return back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: Any, process_set: Any,
                prescale: float, postscale: float) -> torch.Tensor:
        size = state_for(process_set, "reducescatter").comm.world_size
        ctx.process_set = process_set
        ctx.scale = (size if ops.reduce_op(op) == ops.Sum else 1) * prescale * postscale
        result: torch.Tensor = scatter._reducescatter(tensor, name, op, process_set, prescale,
                                                      postscale, True)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        scaled = grad * ctx.scale if ctx.scale != 1 else grad
        return gather._allgather(scaled.contiguous(), None, ctx.process_set, True), *[None] * 5


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
    ops._check_tensor(tensor, "allreduce")
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
    ops._check_tensor(tensor, "allgather")
    if tensor.requires_grad and torch.is_grad_enabled():
        return allgather_with_grad(tensor, name, process_set)
    result: torch.Tensor = gather._allgather(tensor, name, process_set, True)
    return result


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """A new tensor holding rank `root_rank`'s `tensor`, on every rank. Differentiable."""
    ops._check_tensor(tensor, "broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return broadcast_with_grad(tensor, root_rank, name, process_set)
    result: torch.Tensor = gather._broadcast(tensor, root_rank, False, name, process_set, True)
    return result


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = None) -> Any:
    """Rows `splits[d]` of `tensor` to rank d (equal parts without `splits`); returns the rows
    every rank sent this one, in rank order, and, when `splits` is given, how many came from
    each rank (an int32 tensor). Differentiable."""
    ops._check_tensor(tensor, "alltoall")
    if tensor.requires_grad and torch.is_grad_enabled():
        output, received = _Alltoall.apply(tensor, splits, name, process_set)
    else:
        output, received = scatter._alltoall(tensor, splits, name, process_set, True)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = NoneCompressor, op: Any = ops.Average,
                  process_set: Any = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """This rank's block of rows of `tensor` reduced over the ranks by `op` (`Average` or
    `Sum`); the first dimension is split as evenly as it can be, the first ranks taking one
    row more. `compression` is accepted and not applied. Differentiable."""
    ops._check_tensor(tensor, "reducescatter")
    if tensor.requires_grad and torch.is_grad_enabled():
        result: torch.Tensor = _Reducescatter.apply(tensor, name, op, process_set,
                                                    prescale_factor, postscale_factor)
        return result
    result = scatter._reducescatter(tensor, name, op, process_set, prescale_factor,
                                    postscale_factor, True)
    return result
