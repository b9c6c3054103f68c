"""Horovod's background work: every operation negotiated by name across the ranks, then run.

Horovod hands every operation to one background thread and gives the caller an int handle;
`synchronize(handle)` waits for it and returns its output, `poll(handle)` says whether it has
finished. Its coordinator matches operations by name, not by the order the ranks started
them, and checks that the ranks agree on what each one is before any data moves. The same
here: each rank's background thread runs cycles while it has operations waiting. A cycle
swaps every rank's list of waiting requests (name, kind, and the signature that must agree:
dtype, shape, root, reduce op... one small all-gather, `negotiate.exchange`); the requests
every rank has made run, in the order the lowest rank made them. A request whose ranks
disagree fails on every rank with `HorovodInternalError` naming the operation, the ranks and
what differed, before any of its data moves, so the group stays usable. Starting a second
operation under the name of one still in flight is a ValueError on the rank that did it.

`join`: a rank that has joined counts as having made every allreduce (it adds zeros), and
`join` returns on every rank once all have joined, giving the rank that joined last.

`LIB_DIST_HVD_CHECKS=0` (read by `hvd.init`) turns negotiation off: requests run in the order
each rank starts them, unchecked, as lib_dist.horovod did before it negotiated (join then
needs every rank to have started the same operations).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..comm import CommError, Communicator, Handle
from . import negotiate
from .negotiate import HorovodInternalError

Runner = Callable[[list[Any]], Any]  # run(infos: every rank's `info` for this request)


@dataclass(eq=False)
class Request:
    """One operation a rank asked for. `signature` must be equal on every rank; `info` is
    this rank's own part (the rows it gathers, its splits) that the others learn."""

    kind: str
    name: str
    signature: dict[str, Any]
    run: Runner
    info: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    result: Any = None


class _RequestHandle(Handle):
    """A `lib_dist.comm.Handle` on a request (what `Buckets` waits on)."""

    def __init__(self, request: Request):
        self.request = request

    def wait(self) -> None:
        self.request.done.wait()
        if self.request.error is not None:
            raise self.request.error

    def is_completed(self) -> bool:
        return self.request.done.is_set()

    @property
    def error(self) -> BaseException | None:
        return self.request.error


@dataclass
class _Pending:
    request: Request
    finish: Callable[[], Any]


class Queue:
    """One rank's operations: negotiated with the other ranks and run on a background thread
    (see the module docstring). `check`: negotiate (the default) or run in start order."""

    def __init__(self, comm: Communicator, check: bool = True, stall_after: float = 60.0):
        self.comm, self.device, self.check = comm, comm.device, check
        self.stall_after = stall_after
        self._waiting: list[Request] = []
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._cycles = 0
        self._joined_at: dict[int, int] = {}

    # -- asking ----------------------------------------------------------------------------

    def request(self, kind: str, name: str, signature: dict[str, Any], run: Runner,
                info: Any = None) -> Request:
        """Queue a request; a ValueError if one of the same name is still in flight."""
        r = Request(kind, name, signature, run, info)
        with self._cond:
            if any(w.name == name for w in self._waiting):
                raise ValueError(f"{kind.lower()} {name!r}: another operation named {name!r} is "
                                 f"still in flight on rank {self.comm.rank}; names of operations "
                                 f"in flight must be unique (synchronize the first, or rename)")
            if self._broken is not None:
                r.error = self._broken
                r.done.set()
                return r
            self._waiting.append(r)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"hvd background rank {self.comm.rank}")
                self._thread.start()
            self._cond.notify_all()
        return r

    def start(self, kind: str, name: str, signature: dict[str, Any], run: Runner,
              info: Any = None) -> Handle:
        """Queue a request; its `Handle` (wait raises what the request raised)."""
        return _RequestHandle(self.request(kind, name, signature, run, info))

    def submit(self, request: Request, finish: Callable[[], Any]) -> int:
        """An int handle on a queued request; `synchronize(handle)` returns `finish()`."""
        with self._cond:
            number = next(self._ids)
            self._pending[number] = _Pending(request, finish)
        return number

    def wait(self, request: Request) -> Any:
        """Wait for `request`; raise its error, else return its result."""
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def poll(self, number: int) -> bool:
        """Whether the operation behind `number` has finished (successfully or not)."""
        return self._lookup(number).request.done.is_set()

    def synchronize(self, number: int) -> Any:
        """Wait for the operation behind `number` and return its output; the handle is used up."""
        pending = self._lookup(number)
        try:
            self.wait(pending.request)
        finally:
            with self._cond:
                self._pending.pop(number, None)
        return pending.finish()

    def drain(self) -> None:
        """Wait until every queued request has finished (their errors go to their owners)."""
        with self._cond:
            while self._waiting:
                self._cond.wait()

    def outstanding(self) -> int:
        """How many handles have not been synchronized yet."""
        with self._cond:
            return len(self._pending)

    def _lookup(self, number: int) -> _Pending:
        with self._cond:
            pending = self._pending.get(number)
        if pending is None:
            raise ValueError(f"handle {number!r} is not the handle of a running or unsynchronized "
                             f"operation (each handle can be synchronized once)")
        return pending

    # -- the background thread -----------------------------------------------------------

    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        idle = 0.0
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                mine = list(self._waiting)
            try:
                progress = self._cycle(mine)
            except CommError as e:  # the group is broken: everything waiting fails
                self._fail_all(e, broken=True)
                continue
            idle = 0.0 if progress else idle + self._pause(idle)
            if idle > self.stall_after:
                self._fail_all(HorovodInternalError(self._stalled(mine)))
                idle = 0.0

    def _pause(self, idle: float) -> float:
        """Sleep a little between cycles that ran nothing (every rank waits on another's
        request); the same schedule on every rank, so every rank counts the same time."""
        delay = min(0.05, 0.0005 * 2 ** min(int(idle / 0.0005).bit_length(), 7))
        time.sleep(delay)
        return delay

    def _cycle(self, mine: list[Request]) -> bool:
        """One negotiation over `mine`; runs (or fails) what every rank asked for."""
        self._cycles += 1
        if not self.check or self.comm.world_size == 1:
            for request in mine:
                self._run(request, [request.info] * self.comm.world_size)
            return True
        everyone = negotiate.exchange(self.comm, [(r.kind, r.name, r.signature, r.info)
                                                  for r in mine])
        ready = negotiate.ready(everyone, self._joined_at, self._cycles)
        by_name = {r.name: r for r in mine}
        for entry in ready:
            r = by_name.get(entry.name)
            if entry.error is not None:
                if r is not None:
                    self._finish(r, error=HorovodInternalError(entry.error))
            elif entry.kind == "JOIN":
                self._joined_at.clear()
                if r is not None:
                    r.result = entry.last_joined
                    self._finish(r)
            elif r is not None:
                self._run(r, entry.infos)
            else:  # this rank has joined: take part with zeros
                negotiate.take_part(self.comm, entry)
        return bool(ready)

    def _run(self, r: Request, infos: list[Any]) -> None:
        try:
            r.result = r.run(infos)
        except CommError:
            raise
        except Exception as e:  # noqa: BLE001 - the owner's synchronize raises it
            self._finish(r, error=e)
            return
        self._finish(r)

    def _finish(self, r: Request, error: BaseException | None = None) -> None:
        r.error = error
        with self._cond:
            self._waiting.remove(r)
            r.done.set()
            self._cond.notify_all()

    def _fail_all(self, error: BaseException, broken: bool = False) -> None:
        with self._cond:
            if broken:
                self._broken = error
            for r in self._waiting:
                r.error = error
                r.done.set()
            self._waiting.clear()
            self._cond.notify_all()

    def _stalled(self, mine: list[Request]) -> str:
        names = ", ".join(f"{r.kind.lower()} {r.name!r}" for r in mine)
        return (f"rank {self.comm.rank}: no operation could run for {self.stall_after:.0f} s: "
                f"this rank waits for {names}, which some rank has not started (every rank "
                f"must start the same operations, under the same names)")


def now() -> float:
    """The clock of the timeline (`time.monotonic`, as `lib_dist.comm.trace` uses)."""
    return time.monotonic()
