"""Horovod's operations that move tensors rather than reduce them (allgather, broadcast, in
their in-place and asynchronous forms), and those that only wait (`barrier`, `join`). Their
asynchronous forms return handles for `ops.synchronize`, like the reductions (see `ops`).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import torch

from . import basics, wire
from .ops import _check_tensor, check_root, start
from .unsupported import check_process_set


# -- allgather ---------------------------------------------------------------------------

def _allgather(tensor: torch.Tensor, name: str | None, process_set: Any, blocking: bool) -> Any:
    s = basics.state()
    check_process_set(process_set, "allgather")
    _check_tensor(tensor, "allgather")
    name = s.auto_name("allgather", name)
    rows = tensor.detach().contiguous()
    out: list[torch.Tensor] = []
    return start(s, "ALLGATHER", name, rows.nbytes,
                 lambda: out.append(wire.all_gather_rows(s.comm, rows, f"allgather {name}")),
                 lambda: out[0], blocking)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: Any = None) -> int:
    """Start `allgather(tensor)`; `synchronize(handle)` returns the concatenation."""
    handle: int = _allgather(tensor, name, process_set, False)
    return handle


# -- broadcast ---------------------------------------------------------------------------

def _broadcast(tensor: torch.Tensor, root_rank: int, in_place: bool, name: str | None,
               process_set: Any, blocking: bool) -> Any:
    s = basics.state()
    check_process_set(process_set, "broadcast")
    _check_tensor(tensor, "broadcast")
    check_root(root_rank, s.comm.world_size, "broadcast")
    name = s.auto_name("broadcast", name)
    if in_place and tensor.is_contiguous():
        work = tensor.detach()
    else:
        work = tensor.detach().clone(memory_format=torch.contiguous_format)

    def finish() -> torch.Tensor:
        if in_place and work.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(work)
        return tensor if in_place else work

    def run() -> None:
        if s.comm.world_size > 1:
            s.comm.broadcast(work, root_rank)

    return start(s, "BROADCAST", name, work.nbytes, run, finish, blocking)


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
    """Return once every rank has called `barrier` (and everything started before is done)."""
    s = basics.state()
    check_process_set(process_set, "barrier")
    start(s, "BARRIER", "", 0, s.comm.barrier, lambda: None, True)


def join(device: int = -1) -> int:
    """Wait until every rank has called `join`; return the rank that called it last.

    Horovod's join also lets ranks that have run out of data stop early while the others go
    on all-reducing (the joined ones contribute zeros). lib_dist.horovod does not: a rank in
    `join` takes part in no other collective, so every rank must reach `join` after the same
    operations (give every rank the same number of batches, e.g. with DistributedSampler's
    padding or `drop_last`). `device` is accepted for compatibility and not used.
    """
    s = basics.state()
    arrived = time.time()
    s.queue.drain()
    if s.comm.world_size == 1:
        return 0
    times = [struct.unpack("d", b)[0]
             for b in wire.all_gather_bytes(s.comm, struct.pack("d", arrived))]
    return max(range(len(times)), key=lambda r: (times[r], r))
