"""Horovod's reductions: allreduce in its in-place (`_`) and asynchronous (`_async`) forms,
and `synchronize` / `poll` of the int handles of every asynchronous operation (`gather` has
allgather, broadcast, barrier and join).

As in Horovod, `allreduce`, `allgather` and `broadcast` return new tensors and leave their
input alone, the `_` forms write into it, and the `_async` forms return a handle at once:
`synchronize(handle)` returns the output. Asynchronous operations run in start order on
background threads (`queue`); a blocking operation first waits for them. The out-of-place
forms are differentiable, as Horovod's are: they are in `autograd`, built on these.

The reductions: `Sum` and `Average` run the communicator's all-reduce (lib_dist's tuned one on
gloo); `Min`, `Max` and `Product` gather every rank's tensor and reduce locally. Average of an
integer tensor rounds down. `prescale_factor` multiplies before the reduction and
`postscale_factor` after it (floating tensors only).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch

from ..comm import Communicator
from . import basics, negotiate
from .basics import ReduceOp, State
from .compression import Compressor, NoneCompressor
from .queue import now
from .process_sets import state_for

Average, Sum, Adasum = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum
Min, Max, Product = ReduceOp.Min, ReduceOp.Max, ReduceOp.Product


def reduce_op(op: Any, average: bool | None = None) -> ReduceOp:
    """The op a call asks for: `op`, or Horovod's older `average=True/False`."""
    if op is not None and average is not None:
        raise ValueError("allreduce: give op or the older average, not both (op supersedes it)")
    if op is None:
        op = Average if average is None or average else Sum
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"allreduce: unknown op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, "
                         f"hvd.Max or hvd.Product") from None
    if op == Adasum:
        raise NotImplementedError("lib_dist.horovod does not support Adasum (hvd.Adasum); use "
                                  "hvd.Average or hvd.Sum")
    return op


def reduce_in_place(comm: Communicator, t: torch.Tensor, op: ReduceOp, prescale: float = 1.0,
                    postscale: float = 1.0) -> None:
    """Reduce the contiguous `t` over all ranks, in place (what every allreduce runs).
    Average of integers truncates towards zero, as Horovod's does."""
    floating = t.is_floating_point() or t.is_complex()
    if prescale != 1.0:
        scale_(t, prescale)
    if op in (Sum, Average):
        if comm.world_size > 1:
            with on_the_wire(t) as sent:
                comm.all_reduce(sent, "sum")
        if op == Average and floating:
            postscale = postscale / comm.world_size
        elif op == Average:
            t.copy_(torch.div(t, comm.world_size, rounding_mode="trunc"))
    elif comm.world_size > 1:
        with on_the_wire(t) as sent:
            stacked = torch.stack(comm.all_gather(sent))
            sent.copy_(stacked.amin(0) if op == Min else stacked.amax(0) if op == Max
                       else stacked.prod(0))
    if postscale != 1.0:
        scale_(t, postscale)


def scale_(t: torch.Tensor, factor: float) -> None:
    """`t` times `factor`, in place, as Horovod scales: integers in float64, truncated back;
    half precision in float32 on the CPU but in its own precision on a GPU (Horovod's CUDA
    kernel rounds the factor to half first)."""
    if t.is_cuda and t.dtype in (torch.float16, torch.bfloat16):
        factor = float(torch.tensor(factor, dtype=t.dtype))
    if t.is_floating_point() or t.is_complex():
        t.mul_(factor)
    else:
        t.copy_((t.double() * factor).to(t.dtype))


@contextmanager
def on_the_wire(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """`t`, or a copy in a dtype every backend can move (gloo and NCCL have no int16: it
    travels as int32), written back into `t` afterwards (narrowing wraps as int16 would)."""
    if t.dtype != torch.int16:
        yield t
        return
    wide = t.to(torch.int32)
    yield wide
    t.copy_(wide)


def _joined_allreduce(comm: Communicator, sig: dict[str, Any]) -> None:
    """A rank that has joined (hvd.join) takes part in an allreduce with zeros."""
    reduce_in_place(comm, negotiate.zeros(sig, comm.device), ReduceOp(sig["op"]),
                    sig["prescale"], sig["postscale"])


negotiate.JOINABLE["ALLREDUCE"] = _joined_allreduce


def timed(s: State, kind: str, name: str, nbytes: int,
          run: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """`run`, noting in the timeline (if one is recorded) when it was asked for, when it
    began and when it ended."""
    queued = now()

    def timed_run(infos: list[Any]) -> Any:
        started = now()
        result = run(infos)
        if s.timeline is not None:
            s.timeline.record(kind, name, nbytes, queued, started, now())
        return result

    return timed_run


def start(s: State, kind: str, name: str, signature: dict[str, Any], nbytes: int,
          run: Callable[[list[Any]], Any], finish: Callable[[Any], Any], blocking: bool,
          info: Any = None) -> Any:
    """Ask for one operation named `name` (see `queue`): `run(infos)` runs once every rank
    has asked for it and they agree on `signature` (`infos`: every rank's `info`). Returns
    `finish(run's result)` when `blocking`, else an int handle for `synchronize`."""
    request = s.queue.request(kind, name, signature, timed(s, kind, name, nbytes, run), info)
    if blocking:
        return finish(s.queue.wait(request))
    return basics.state().queue.submit(request, lambda: finish(request.result))


# -- allreduce ---------------------------------------------------------------------------

def _allreduce(tensor: torch.Tensor, out: torch.Tensor | None, average: bool | None,
               name: str | None, op: Any, prescale_factor: float, postscale_factor: float,
               process_set: Any, blocking: bool, compression: type[Compressor] = NoneCompressor
               ) -> Any:
    """All-reduce `tensor` into `out` (`tensor` itself for the in-place forms; None: a new
    tensor), compressed on the wire by `compression`."""
    s = state_for(process_set, "allreduce")
    op = reduce_op(op, average)
    _check_tensor(tensor, "allreduce")
    name = s.auto_name("allreduce", name)
    source = tensor.detach()
    sent, ctx = compression.compress(source)
    if out is tensor or (sent.data_ptr() != source.data_ptr() and sent.is_contiguous()):
        work = sent.contiguous()  # in place, or already a copy (compressed)
    else:
        work = sent.clone(memory_format=torch.contiguous_format)

    def finish() -> torch.Tensor:
        result = compression.decompress(work, ctx)
        if out is tensor:
            if result.data_ptr() != source.data_ptr():
                source.copy_(result)
            return tensor
        return result

    sig = negotiate.signature(work, op=int(op), prescale=float(prescale_factor),
                              postscale=float(postscale_factor))
    return start(s, "ALLREDUCE", name, sig, work.nbytes,
                 lambda _: reduce_in_place(s.comm, work, op, prescale_factor, postscale_factor),
                 lambda _: finish(), blocking)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = None) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place; returns it."""
    result: torch.Tensor = _allreduce(tensor, tensor, average, name, op, prescale_factor,
                                      postscale_factor, process_set, True)
    return result


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None) -> int:
    """Start `allreduce(tensor)`; `synchronize(handle)` returns the new tensor."""
    handle: int = _allreduce(tensor, None, average, name, op, prescale_factor, postscale_factor,
                             process_set, False)
    return handle


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: Any = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: Any = None) -> int:
    """Start reducing `tensor` in place; `synchronize(handle)` returns it, reduced."""
    handle: int = _allreduce(tensor, tensor, average, name, op, prescale_factor,
                             postscale_factor, process_set, False)
    return handle


# -- handles --------------------------------------------------------------

def synchronize(handle: int) -> Any:
    """Wait for the operation behind `handle`; return its output (a tensor)."""
    return basics.state().queue.synchronize(handle)


def poll(handle: int) -> bool:
    """Whether the operation behind `handle` has finished: `synchronize` would not wait."""
    return basics.state().queue.poll(handle)


def check_root(s: State, root_rank: int, what: str) -> int:
    """`root_rank` (a global rank) as a rank of `s`'s communicator. One that is no rank (of
    the process set) fails here, on the rank that gave it (Horovod's HorovodInternalError, a
    RuntimeError); one that differs between ranks fails in negotiation, on every rank."""
    ranks = s.members if s.members is not None else range(s.comm.world_size)
    if not isinstance(root_rank, int) or root_rank not in ranks:
        within = (f"0..{s.comm.world_size - 1}" if s.members is None
                  else f"one of the process set's {s.members}")
        raise negotiate.HorovodInternalError(
            f"{what}: root_rank must be a rank, {within}; got {root_rank!r}")
    return s.root(root_rank)


def _check_tensor(tensor: Any, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, got "
                        f"{'None' if tensor is None else type(tensor).__name__}")
    if tensor.is_sparse:
        raise NotImplementedError(f"{what} takes dense tensors, as Horovod's does; a sparse "
                                  f"one goes through hvd.sparse_allreduce_async, or .to_dense()")
