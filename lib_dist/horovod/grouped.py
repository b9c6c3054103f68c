"""Horovod's grouped operations: a list of tensors reduced (gathered, reduce-scattered)
together, `grouped_allreduce(tensors)` returning the list of results.

Each tensor is one request named `<name>.<i>`, all queued before the next negotiation cycle,
so they are negotiated and run together, and checked one by one (a mismatch names the tensor).
The asynchronous forms return one handle; `synchronize` returns the list. The out-of-place
forms are differentiable, tensor by tensor, by the rules of the single operations.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import autograd, basics, gather, ops, scatter
from .compression import Compressor, NoneCompressor

Single = Callable[[torch.Tensor, str], Any]


def check_group(tensors: Any, kind: str) -> None:
    """A group is a non-empty list of tensors on one device (Horovod fuses a group into one
    buffer, so it refuses a group spread over the CPU and a GPU as well)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{kind} needs a non-empty list of tensors, got {tensors!r}")
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise RuntimeError(f"{kind}: the tensors are on {' and '.join(devices)}; put every "
                           f"tensor of a group on one device")


def _grouped(tensors: list[torch.Tensor], kind: str, name: str | None, single: Single,
             blocking: bool) -> Any:
    """`single(tensor, name)` (an asynchronous operation's int handle) for every tensor;
    their results, or one handle whose `synchronize` returns them."""
    s = basics.state()
    check_group(tensors, kind)
    base = s.auto_name(kind, name)
    handles = [single(t, f"{base}.{i}") for i, t in enumerate(tensors)]
    if blocking:
        return [ops.synchronize(h) for h in handles]
    return s.queue.submit(s.queue._lookup(handles[-1]).request,
                          lambda: [ops.synchronize(h) for h in handles])


def _allreduce_each(tensors: list[torch.Tensor], name: str | None, start: Any, blocking: bool,
                    average: bool | None, op: Any, prescale_factor: float,
                    postscale_factor: float, process_set: Any) -> Any:
    """The grouped allreduces that take no compression: `start` (in place or not) per tensor."""
    return _grouped(tensors, "grouped_allreduce", name,
                    lambda t, n: start(t, average, n, op, prescale_factor, postscale_factor,
                                       process_set), blocking)


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = NoneCompressor,
                      op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None
                      ) -> list[torch.Tensor]:
    """`allreduce` of every tensor, together; differentiable."""
    check_group(tensors, "grouped_allreduce")
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        base = basics.state().auto_name("grouped_allreduce", name)
        return [autograd.allreduce(t, average, f"{base}.{i}", compression, op, prescale_factor,
                                   postscale_factor, process_set) for i, t in enumerate(tensors)]
    result: list[torch.Tensor] = _grouped(
        tensors, "grouped_allreduce", name,
        lambda t, n: ops._allreduce(t, None, average, n, op, prescale_factor, postscale_factor,
                                    process_set, False, compression), True)
    return result


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: Any = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, process_set: Any = None
                       ) -> list[torch.Tensor]:
    """`allreduce_` of every tensor, in place, together."""
    return _allreduce_each(tensors, name, ops.allreduce_async_, True, average, op,
                           prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(tensors: list[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: Any = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None) -> int:
    """Start `grouped_allreduce`; `synchronize(handle)` returns the list."""
    return _allreduce_each(tensors, name, ops.allreduce_async, False, average, op,
                           prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> int:
    """Start `grouped_allreduce_`; `synchronize(handle)` returns the tensors, reduced."""
    return _allreduce_each(tensors, name, ops.allreduce_async_, False, average, op,
                           prescale_factor, postscale_factor, process_set)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: Any = None) -> list[torch.Tensor]:
    """`allgather` of every tensor, together; differentiable."""
    check_group(tensors, "grouped_allgather")
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        base = basics.state().auto_name("grouped_allgather", name)
        return [autograd.allgather(t, f"{base}.{i}", process_set)
                for i, t in enumerate(tensors)]
    result: list[torch.Tensor] = _grouped(
        tensors, "grouped_allgather", name,
        lambda t, n: gather.allgather_async(t, n, process_set), True)
    return result


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: Any = None) -> int:
    """Start `grouped_allgather`; `synchronize(handle)` returns the list."""
    handle: int = _grouped(tensors, "grouped_allgather", name,
                           lambda t, n: gather.allgather_async(t, n, process_set), False)
    return handle


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = NoneCompressor, op: Any = ops.Average,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """`reducescatter` of every tensor, together; differentiable."""
    check_group(tensors, "grouped_reducescatter")
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        base = basics.state().auto_name("grouped_reducescatter", name)
        return [autograd.reducescatter(t, f"{base}.{i}", compression, op, process_set,
                                       prescale_factor, postscale_factor)
                for i, t in enumerate(tensors)]
    result: list[torch.Tensor] = _grouped(
        tensors, "grouped_reducescatter", name,
        lambda t, n: scatter.reducescatter_async(t, n, op, process_set, prescale_factor,
                                                 postscale_factor), True)
    return result


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None,
                                op: Any = ops.Average, process_set: Any = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0
                                ) -> int:
    """Start `grouped_reducescatter`; `synchronize(handle)` returns the list."""
    handle: int = _grouped(
        tensors, "grouped_reducescatter", name,
        lambda t, n: scatter.reducescatter_async(t, n, op, process_set, prescale_factor,
                                                 postscale_factor), False)
    return handle
