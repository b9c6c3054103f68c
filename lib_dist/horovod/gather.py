"""Horovod's operations that move tensors rather than reduce them (allgather, broadcast, in
their in-place and asynchronous forms), and those that only wait (`barrier`, `join`). Their
asynchronous forms return handles for `ops.synchronize`, like the reductions (see `ops`).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import torch

from . import basics, negotiate, wire
from .ops import _check_tensor, check_root, on_the_wire, start
from .process_sets import state_for


# -- allgather ---------------------------------------------------------------------------

def _allgather(tensor: torch.Tensor, name: str | None, process_set: Any, blocking: bool,
               kind: str = "ALLGATHER", **agree: Any) -> Any:
    """Start (or run, when `blocking`) one allgather; `kind` and `agree` (more that every
    rank must give alike) are for the operations built on it (`sparse`)."""
    s = state_for(process_set, kind.lower())
    _check_tensor(tensor, kind.lower())
    name = s.auto_name("allgather", name)
    rows = tensor.detach().contiguous()
    rows = rows.reshape(1) if rows.dim() == 0 else rows
    sig = negotiate.signature(rows, **agree)
    sig["shape"] = ("*", *sig["shape"][1:])  # the first dimension may differ between ranks

    def run(infos: list[Any]) -> torch.Tensor:
        if not s.queue.check:  # the counts were not negotiated: gather them here
            return wire.all_gather_rows(s.comm, rows, f"allgather {name}")
        return wire.gather_rows(s.comm, rows, infos)

    return start(s, kind, name, sig, rows.nbytes, run, lambda out: out, blocking,
                 info=rows.shape[0])


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: Any = None) -> int:
    """Start `allgather(tensor)`; `synchronize(handle)` returns the concatenation."""
    handle: int = _allgather(tensor, name, process_set, False)
    return handle


# -- broadcast ---------------------------------------------------------------------------

def _broadcast(tensor: torch.Tensor, root_rank: int, in_place: bool, name: str | None,
               process_set: Any, blocking: bool) -> Any:
    s = state_for(process_set, "broadcast")
    _check_tensor(tensor, "broadcast")
    root = check_root(s, root_rank, "broadcast")
    name = s.auto_name("broadcast", name)
    if in_place and tensor.is_contiguous():
        work = tensor.detach()
    else:
        work = tensor.detach().clone(memory_format=torch.contiguous_format)

    def finish(_: Any) -> torch.Tensor:
        if in_place and work.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(work)
        return tensor if in_place else work

    def run(_: list[Any]) -> None:
        if s.comm.world_size > 1:
            with on_the_wire(work) as sent:
                s.comm.broadcast(sent, root)

    return start(s, "BROADCAST", name, negotiate.signature(work, root=root_rank), work.nbytes,
                 run, finish, blocking)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = None) -> torch.Tensor:
    """Overwrite `tensor` with rank `root_rank`'s, in place; returns it."""
    result: torch.Tensor = _broadcast(tensor, root_rank, True, name, process_set, True)
    return result


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = None) -> int:
    """Start `broadcast`; `synchronize(handle)` returns the new tensor."""
    handle: int = _broadcast(tensor, root_rank, False, name, process_set, False)
    return handle


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = None) -> int:
    """Start `broadcast_`; `synchronize(handle)` returns `tensor`, overwritten."""
    handle: int = _broadcast(tensor, root_rank, True, name, process_set, False)
    return handle


def barrier(process_set: Any = None) -> None:
    """Return once every rank has called `barrier`; what every rank started before it has
    run by then (an operation only some ranks have started still waits for the others)."""
    s = state_for(process_set, "barrier")
    start(s, "BARRIER", s.auto_name("barrier", None), {}, 0, lambda _: s.comm.barrier(),
          lambda _: None, True)


def join(device: int = -1) -> int:
    """Wait until every rank has called `join`; return the rank that called it last (the
    same on every rank).

    Until then, this rank takes part in every allreduce the others run, with zeros (so an
    average divides by every rank): ranks that run out of data early call `join` and the
    others go on (uneven batches). An allgather, broadcast or other operation that the ranks
    still running start while a rank has joined fails on those ranks (HorovodInternalError).
    `device` is accepted for compatibility and not used. With `LIB_DIST_HVD_CHECKS=0` there is
    no negotiation: every rank must reach `join` after the same operations.
    """
    s = basics.state()
    if s.comm.world_size == 1:
        s.queue.drain()
        return 0
    if not s.queue.check:
        arrived = time.time()
        s.queue.drain()
        times = [struct.unpack("d", b)[0]
                 for b in wire.all_gather_bytes(s.comm, struct.pack("d", arrived))]
        return max(range(len(times)), key=lambda r: (times[r], r))
    last: int = start(s, "JOIN", "join", {}, 0, lambda _: None, lambda r: r, True)
    return last
