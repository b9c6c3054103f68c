"""Horovod's background work: asynchronous operations in start order, and their int handles.

Horovod hands every operation to one background thread and gives the caller an int handle;
`synchronize(handle)` waits for it and returns its output, `poll(handle)` says whether it has
finished. Here each started operation runs on a thread of its own that first waits for the one
started before it (`lib_dist.comm.background.start_after`), so operations run one after another
in start order, as every rank starts them in the same order and the messages of two operations
must never interleave. The same rule makes a blocking operation wait until everything started
before it is done (`Queue.blocking`): it would otherwise talk on the communicator while a
background operation does.

An operation that fails with a `CommError` (a broken group) fails every operation started
after it; one that every rank refused alike (a ValueError for mismatched shapes, say) fails
only itself, raised by `synchronize` of its handle.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..comm import CommError
from ..comm.background import BackgroundHandle, start_after

T = TypeVar("T")


@dataclass
class _Pending:
    """One started operation: its background handle and what turns its work into the output."""

    handle: BackgroundHandle
    finish: Callable[[], Any]


class Queue:
    """One rank's operations in start order. `device`: the rank's device, made current on the
    background threads (a CUDA operation must run on the rank's own GPU)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._last: BackgroundHandle | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, run: Callable[[], Any], what: str) -> BackgroundHandle:
        """Start `run()` after every operation started before it; returns its handle."""
        device = self.device

        def body() -> None:
            if device.type == "cuda":
                with torch.cuda.device(device):
                    run()
            else:
                run()

        with self._lock:
            last = self._last
            if last is not None and last.is_completed() and not isinstance(last.error, CommError):
                last = None  # a finished one, or one refused on every rank (a ValueError): go on
            self._last = start_after(last, body, what)
            return self._last

    def submit(self, run: Callable[[], Any], what: str, finish: Callable[[], Any]) -> int:
        """Start `run()` in order and return an int handle; `synchronize(handle)` waits for
        it and returns `finish()`."""
        handle = self.start(run, what)
        with self._lock:
            number = next(self._ids)
            self._pending[number] = _Pending(handle, finish)
        return number

    def poll(self, number: int) -> bool:
        """Whether the operation behind `number` has finished (successfully or not)."""
        return self._lookup(number).handle.is_completed()

    def synchronize(self, number: int) -> Any:
        """Wait for the operation behind `number` and return its output; the handle is used up."""
        pending = self._lookup(number)
        try:
            pending.handle.wait()
        finally:
            with self._lock:
                self._pending.pop(number, None)
        return pending.finish()

    def blocking(self, run: Callable[[], T]) -> T:
        """Run `run()` on this thread once every operation started before has finished."""
        self.drain()
        return run()

    def drain(self) -> None:
        """Wait until every started operation has finished. An operation's error is raised
        by `synchronize` of its own handle, not here."""
        with self._lock:
            last = self._last
        if last is not None:
            try:
                last.wait()
            except Exception:  # noqa: BLE001 - its owner sees it
                pass

    def outstanding(self) -> int:
        """How many handles have not been synchronized yet."""
        with self._lock:
            return len(self._pending)

    def _lookup(self, number: int) -> _Pending:
        with self._lock:
            pending = self._pending.get(number)
        if pending is None:
            raise ValueError(f"handle {number!r} is not the handle of a running or unsynchronized "
                             f"operation (each handle can be synchronized once)")
        return pending


def now() -> float:
    """The clock of the timeline (`time.monotonic`, as `lib_dist.comm.trace` uses)."""
    return time.monotonic()
