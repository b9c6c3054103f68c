"""The communicator every lab programs against: point-to-point messages between ranks.

This is where the interface is documented (`lib_dist.extend` lists every extension point,
this one among them). A rank owns a `Communicator` with:

- `rank`, `world_size`, `device`: who am I, how many of us, where my tensors live;
- `send(tensor, dst)` / `recv(buffer, src)`: blocking. A send completes only once the
  receiver has taken the message (as gloo does), so two ranks that both send first deadlock;
- `isend(tensor, dst)` / `irecv(buffer, src)`: start the operation and return a `Handle`;
  call `handle.wait()` before touching the tensor again. `recv` and `irecv` write into the
  preallocated `buffer`, whose shape and dtype must match the sent tensor;
- `barrier()`: returns once every rank has called it;
- collectives `broadcast`, `all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`
  (rank r's `inputs[d]` lands in rank d's `outputs[r]`: the exchange behind mixtures of
  experts and Horovod's alltoall): correct defaults built here from point-to-point messages;
  a backend may replace them with native ones (the torch backend uses torch.distributed's).
  Labs replace them with the students' own (`all_reduce(..., algorithm="mine")`: lab03's ring);
- `all_reduce_async(tensor, op)`: the all-reduce on a thread of the rank's, returning a
  `Handle` at once, for overlapping communication with computation (`background`);
  `all_gather_async(tensor)` likewise (the list by rank in the handle's `result`);
- `compute(label, cost)`: work the rank does, a "compute" event in the trace; on a virtual
  clock it costs `cost` units (`lib_dist.comm.clock`), elsewhere its wall time.

Messages between a pair of ranks arrive in the order they were sent. Every completed
operation is recorded in `trace` (see `lib_dist.comm.trace`): a collective as one event of its
name, after the messages it was built from (none on a backend with native collectives).

Backends implement `_post_send`, `_post_recv` and `world_barrier`, nothing else; the
all-reduce algorithms need less of a rank: `PointToPoint` (`lib_dist.comm.point_to_point`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from .agreement import agree, as_agreed
from .background import BackgroundHandle, start_after
from .by_name import all_reduce_by_name, preferred_all_reduce
from .errors import CommError
from .point_to_point import Handle, PointToPoint, chunk_bounds, wait_all
from .trace import Event, Trace

ReduceOp = Literal["sum", "avg"]


class _TracedHandle(Handle):
    """Records the operation in the rank's trace when the rank first sees it complete."""

    def __init__(self, comm: Communicator, inner: Handle, kind: str, peer: int, nbytes: int):
        self._comm, self._inner = comm, inner
        self._kind, self._peer, self._nbytes = kind, peer, nbytes
        self._posted = (time.monotonic(), comm._completed, comm.virtual_time())
        self._recorded = False

    def wait(self) -> None:
        if self._recorded:
            return self._inner.wait()
        with self._comm._traced(self._kind, self._peer, self._nbytes, self._posted):
            self._inner.wait()
        self._recorded = True

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
        return _TracedHandle(self, self._post_send(tensor, dst), "send", dst, tensor.nbytes)

    def irecv(self, buffer: torch.Tensor, src: int) -> Handle:
        self._check_peer(src, "recv")
        self._check_tensor(buffer, "recv")
        return _TracedHandle(self, self._post_recv(buffer, src), "recv", src, buffer.nbytes)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, buffer: torch.Tensor, src: int) -> None:
        self.irecv(buffer, src).wait()

    def barrier(self) -> None:
        with self._traced("barrier"):
            self.world_barrier()

    def subgroup(self, ranks: list[int]) -> Communicator | None:
        """A communicator over `ranks` (increasing), None on a rank not among them; collective:
        every rank calls it for every group (`lib_dist.comm.mesh.split` builds on it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot make groups of its ranks")

    @contextmanager
    def compute(self, label: str, cost: float = 0.0) -> Iterator[None]:
        """Record the block as work named `label`; on a virtual clock it takes `cost` units."""
        start, vstart = time.monotonic(), self.virtual_time()
        yield
        self._advance_virtual(cost)
        self.trace.record(Event(self.rank, "compute", -1, 0, start, time.monotonic(),
                                seq=self._completed, after=self._completed, label=label,
                                vstart=vstart, vend=self.virtual_time()))
        self._completed += 1

    def virtual_time(self) -> float | None:
        """This rank's virtual time, or None where there is no virtual clock (real ranks)."""
        return None

    def _advance_virtual(self, cost: float) -> None:
        """Move the virtual clock on by `cost` units of work (nothing without a clock)."""

    # -- collectives: simple, correct defaults over point-to-point ------------------------

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Copy `src`'s tensor into `tensor` on every rank, in place; returns it."""
        self._check_peer(src, "broadcast")
        with self._traced("broadcast", nbytes=tensor.nbytes):
            if self.rank == src:
                wait_all([self.isend(tensor, dst) for dst in self._others()])
            else:
                self.recv(tensor, src)
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum",
                   algorithm: str | None = None) -> torch.Tensor:
        """Reduce `tensor` over all ranks, in place on every rank; returns it. By default every
        rank sends its tensor to rank 0, which adds them up and sends the total back
        (`_default_all_reduce`); `algorithm` names another, lib_dist's or a student's
        (`lib_dist.comm.by_name`)."""
        _check_op(op, tensor)
        self._check_tensor(tensor, "all_reduce")
        name = algorithm or preferred_all_reduce()
        return (all_reduce_by_name(self, name, tensor, op) if name
                else self._default_all_reduce(tensor, op))

    def _default_all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """Gather-broadcast: the all-reduce lab03 asks for (switched off while it is graded)."""
        return all_reduce_by_name(self, "gather_broadcast", tensor, op)

    def all_reduce_async(self, tensor: torch.Tensor, op: ReduceOp = "sum",
                         algorithm: str | None = None) -> Handle:
        """Start `all_reduce(tensor, op, algorithm)` on a thread of this rank's, returning its
        `Handle` at once; until it is waited for, call nothing else on it (`background`)."""
        _check_op(op, tensor)
        self._check_tensor(tensor, "all_reduce_async")
        named = {} if algorithm is None else {"algorithm": algorithm}  # as subclasses take it
        self._last_async = start_after(getattr(self, "_last_async", None),
                                       lambda: self.all_reduce(tensor, op, **named), "all_reduce")
        return self._last_async

    def all_gather_async(self, tensor: torch.Tensor) -> BackgroundHandle:
        """Start `all_gather(tensor)` and return its handle at once; after `wait()`, its
        `result` is the list by rank. The same rules as `all_reduce_async` (FSDP's prefetch
        gathers the next unit this way while the current one computes)."""
        self._check_tensor(tensor, "all_gather_async")
        self._last_async = start_after(getattr(self, "_last_async", None),
                                       lambda: self.all_gather(tensor), "all_gather")
        return self._last_async

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape and dtype everywhere), as a list indexed by rank."""
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        out[self.rank].copy_(tensor)
        with self._traced("all_gather", nbytes=tensor.nbytes):
            handles = [self.isend(tensor, dst) for dst in self._others()]
            handles += [self.irecv(out[src], src) for src in self._others()]
            wait_all(handles)
        return out

    def all_to_all(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor] | None = None,
                   agreed: bool = False) -> list[torch.Tensor]:
        """Send `inputs[d]` to rank d and receive rank s's `inputs[self.rank]` into
        `outputs[s]`, for every rank; returns `outputs`. Every tensor has one dtype; shapes
        may differ, so `outputs` (preallocated, one per rank) says what arrives, by default
        tensors shaped like `inputs` (every rank sends every peer the same shape). The ranks
        first check that each expects what its peers send (`lib_dist.comm.agreement`): if
        not, every rank raises, naming the ranks and shapes, and no data moves. `agreed`:
        skip the check, the sizes being agreed already (read from a table every rank holds)."""
        inputs, outputs = self._check_all_to_all(inputs, outputs, agreed)
        outputs[self.rank].copy_(inputs[self.rank])
        with self._traced("all_to_all", nbytes=sum(t.nbytes for t in inputs)):
            handles = [self.isend(inputs[dst], dst) for dst in self._others()]
            handles += [self.irecv(outputs[src], src) for src in self._others()]
            wait_all(handles)
        return outputs

    def _check_all_to_all(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor] | None,
                          agreed: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return as_agreed(inputs, outputs) if agreed else agree(self, inputs, outputs)

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        """This rank's chunk (see `chunk_bounds`) of the reduction of the flattened tensor."""
        _check_op(op, tensor)
        flat = tensor.reshape(-1)
        bounds = chunk_bounds(flat.numel(), self.world_size)
        lo, hi = bounds[self.rank]
        mine = flat[lo:hi].clone()
        buffers = [torch.empty_like(mine) for _ in self._others()]
        with self._traced("reduce_scatter", nbytes=flat.nbytes):
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

    def _gather_quietly(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's `tensor` (one shape and dtype everywhere), by rank, for lib_dist's own
        bookkeeping (`what`): through the backend's messages, which the trace does not record."""
        out = [tensor if r == self.rank else torch.empty_like(tensor)
               for r in range(self.world_size)]
        wait_all([self._post_send(tensor, dst) for dst in self._others()]
                 + [self._post_recv(out[src], src) for src in self._others()])
        return out

    # -- helpers ---------------------------------------------------------------------------

    def _others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    @contextmanager
    def _traced(self, kind: str, peer: int = -1, nbytes: int = 0,
                posted: tuple[float, int, float | None] | None = None) -> Iterator[None]:
        """Mark this rank as waiting in the operation while the block runs; once it has
        completed, record it in the trace. `posted`: (start, completions before it, virtual
        start) when it was posted earlier than it is waited for (isend, irecv)."""
        start, after, vstart = posted or (time.monotonic(), self._completed,
                                          self.virtual_time())
        outer, self.waiting_in = self.waiting_in, (
            kind if peer < 0 else f"{kind} {'to' if kind == 'send' else 'from'} rank {peer}")
        try:
            yield
        finally:
            self.waiting_in = outer  # a collective's messages report themselves, then it
        self.trace.record(Event(self.rank, kind, peer, nbytes, start, time.monotonic(),
                                seq=self._completed, after=after, vstart=vstart,
                                vend=self.virtual_time()))
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


def _check_op(op: str, tensor: torch.Tensor) -> None:
    if op not in ("sum", "avg"):
        raise ValueError(f"reduce op must be 'sum' or 'avg', got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"'avg' needs a floating tensor, got {tensor.dtype}")


__all__ = ["Communicator", "Handle", "PointToPoint", "ReduceOp",
           "chunk_bounds", "wait_all"]
