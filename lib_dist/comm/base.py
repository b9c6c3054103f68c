"""The communicator every lab programs against: point-to-point messages between ranks.

This is the one place the interface is documented. A rank owns a `Communicator` with:

- `rank`, `world_size`, `device`: who am I, how many of us, where my tensors live;
- `send(tensor, dst)` / `recv(buffer, src)`: blocking. A send completes only once the
  receiver has taken the message (as gloo does), so two ranks that both send first deadlock;
- `isend(tensor, dst)` / `irecv(buffer, src)`: start the operation and return a `Handle`;
  call `handle.wait()` before touching the tensor again. `recv` and `irecv` write into the
  preallocated `buffer`, whose shape and dtype must match the sent tensor;
- `barrier()`: returns once every rank has called it;
- collectives `broadcast`, `all_reduce`, `all_gather`, `reduce_scatter`: correct defaults
  built here from point-to-point messages; a backend may replace them with native ones (the
  torch backend uses torch.distributed's). Labs replace them with the students' own.

Messages between a pair of ranks arrive in the order they were sent. Every completed
operation is recorded in `trace` (see `lib_dist.comm.trace`).

Backends implement `_post_send`, `_post_recv` and `world_barrier`, nothing else.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Literal

import torch

from .errors import CommError
from .trace import Event, Trace

ReduceOp = Literal["sum", "avg"]


class Handle(ABC):
    """A started operation. `wait()` blocks until it completes or raises `CommError`."""

    @abstractmethod
    def wait(self) -> None: ...

    @abstractmethod
    def is_completed(self) -> bool: ...


class _TracedHandle(Handle):
    """Records the operation in the rank's trace when the rank first sees it complete."""

    def __init__(self, comm: Communicator, inner: Handle, kind: str, peer: int, nbytes: int):
        self._comm, self._inner = comm, inner
        self._kind, self._peer, self._nbytes = kind, peer, nbytes
        self._start = time.monotonic()
        self._after = comm._completed
        self._recorded = False

    def wait(self) -> None:
        self._comm.waiting_in = (f"{self._kind} {'to' if self._kind == 'send' else 'from'} "
                                 f"rank {self._peer}")
        try:
            self._inner.wait()
        finally:
            self._comm.waiting_in = None
        if not self._recorded:
            self._recorded = True
            self._comm._record(self._kind, self._peer, self._nbytes, self._start, self._after)

    def is_completed(self) -> bool:
        return self._inner.is_completed()


class Communicator(ABC):
    """One rank's endpoint. See the module docstring for the contract."""

    def __init__(self, rank: int, world_size: int, device: torch.device | str = "cpu",
                 trace: Trace | None = None):
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.trace = trace if trace is not None else Trace()
        self.waiting_in: str | None = None  # the operation this rank is blocked in, if any
        self._completed = 0

    # -- point to point -------------------------------------------------------------------

    def isend(self, tensor: torch.Tensor, dst: int) -> Handle:
        self._check_peer(dst, "send")
        self._check_tensor(tensor, "send")
        return _TracedHandle(self, self._post_send(tensor, dst), "send", dst, _nbytes(tensor))

    def irecv(self, buffer: torch.Tensor, src: int) -> Handle:
        self._check_peer(src, "recv")
        self._check_tensor(buffer, "recv")
        return _TracedHandle(self, self._post_recv(buffer, src), "recv", src, _nbytes(buffer))

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, buffer: torch.Tensor, src: int) -> None:
        self.irecv(buffer, src).wait()

    def barrier(self) -> None:
        start, after = time.monotonic(), self._completed
        self.waiting_in = "barrier"
        try:
            self.world_barrier()
        finally:
            self.waiting_in = None
        self._record("barrier", -1, 0, start, after)

    # -- collectives: simple, correct defaults over point-to-point ------------------------

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Copy `src`'s tensor into `tensor` on every rank, in place; returns it."""
        self._check_peer(src, "broadcast")
        if self.rank == src:
            wait_all([self.isend(tensor, dst) for dst in self._others()])
        else:
            self.recv(tensor, src)
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """Reduce `tensor` over all ranks, in place on every rank; returns it."""
        _check_op(op, tensor)
        if self.rank == 0:
            total = tensor.clone()
            buffers = [torch.empty_like(tensor) for _ in self._others()]
            wait_all([self.irecv(b, src) for b, src in zip(buffers, self._others())])
            for b in buffers:
                total += b
            tensor.copy_(total)
        else:
            self.send(tensor, 0)
        self.broadcast(tensor, src=0)
        if op == "avg":
            tensor /= self.world_size
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape and dtype everywhere), as a list indexed by rank."""
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        out[self.rank].copy_(tensor)
        handles = [self.isend(tensor, dst) for dst in self._others()]
        handles += [self.irecv(out[src], src) for src in self._others()]
        wait_all(handles)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """This rank's chunk (see `chunk_bounds`) of the reduction of the flattened tensor."""
        _check_op(op, tensor)
        flat = tensor.reshape(-1)
        bounds = chunk_bounds(flat.numel(), self.world_size)
        lo, hi = bounds[self.rank]
        mine = flat[lo:hi].clone()
        buffers = [torch.empty_like(mine) for _ in self._others()]
        handles = [self.isend(flat[a:b].contiguous(), dst)
                   for dst, (a, b) in enumerate(bounds) if dst != self.rank]
        handles += [self.irecv(b, src) for b, src in zip(buffers, self._others())]
        wait_all(handles)
        for b in buffers:
            mine += b
        if op == "avg":
            mine /= self.world_size
        return mine

    # -- backend hooks ---------------------------------------------------------------------

    @abstractmethod
    def _post_send(self, tensor: torch.Tensor, dst: int) -> Handle: ...

    @abstractmethod
    def _post_recv(self, buffer: torch.Tensor, src: int) -> Handle: ...

    @abstractmethod
    def world_barrier(self) -> None: ...

    # -- helpers ---------------------------------------------------------------------------

    def _others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    def _record(self, kind: str, peer: int, nbytes: int, start: float, after: int) -> None:
        self.trace.record(Event(self.rank, kind, peer, nbytes, start, time.monotonic(),
                                seq=self._completed, after=after))
        self._completed += 1

    def _check_peer(self, peer: int, op: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size:
            raise CommError(f"rank {self.rank}: {op} names peer {peer!r}, but ranks are "
                            f"0..{self.world_size - 1}")
        if peer == self.rank and op in ("send", "recv"):
            raise CommError(f"rank {self.rank}: {op} to itself; copy the tensor instead")

    def _check_tensor(self, tensor: torch.Tensor, op: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise CommError(f"rank {self.rank}: {op} needs a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if not tensor.is_contiguous():
            raise CommError(f"rank {self.rank}: {op} needs a contiguous tensor; "
                            f"call .contiguous() first")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


def wait_all(handles: list[Handle]) -> None:
    """Wait for every handle, in order."""
    for h in handles:
        h.wait()


def chunk_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """[start, end) of each rank's chunk of n elements: equal chunks of ceil(n / world_size),
    the last ones shorter or empty. This is the split reduce_scatter uses."""
    size = -(-n // world_size)
    return [(min(r * size, n), min((r + 1) * size, n)) for r in range(world_size)]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _check_op(op: str, tensor: torch.Tensor) -> None:
    if op not in ("sum", "avg"):
        raise ValueError(f"reduce op must be 'sum' or 'avg', got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"'avg' needs a floating tensor, got {tensor.dtype}")
