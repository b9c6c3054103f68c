"""Collectives that run while the caller computes: what gradient hooks need.

`Communicator.all_reduce_async(tensor)` returns a `Handle` at once and runs the all-reduce on
a thread of this rank's. Started operations run one after another in the order they were
started, each on its own short-lived thread that first waits for the one before: every rank
starts the same operations in the same order (as with any collective), so the messages of
different operations never cross. This is how DDP and Horovod overlap communication with
the rest of backward: the main thread keeps computing gradients while earlier buckets travel.

Until every started operation has been waited for, the rank calls nothing else on the
communicator: its messages would interleave with the background ones.

A handle remembers when its operation ran (`started`, `finished`: `time.monotonic()`), so a
timeline can show communication beside computation (`lib_dist.data_parallel.timeline`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from .point_to_point import Handle
from .errors import CommError


class BackgroundHandle(Handle):
    """An operation running on its own thread after `previous` (if any) has finished."""

    def __init__(self, run: Callable[[], Any], previous: BackgroundHandle | None, what: str):
        self._run, self._previous, self._what = run, previous, what
        self.error: BaseException | None = None
        self.result: Any = None  # what `run` returned (an all-gather's list), once waited for
        self.started: float | None = None  # when the operation itself began, after `previous`
        self.finished: float | None = None
        self._thread = threading.Thread(target=self._body, daemon=True, name=f"async {what}")
        self._thread.start()

    def _body(self) -> None:
        before, self._previous = self._previous, None  # no chain of finished handles
        if before is not None:
            before._thread.join()
            if before.error is not None:
                self.error = CommError(f"{self._what} not started: an earlier asynchronous "
                                       f"operation failed ({before.error})")
                return
        self.started = time.monotonic()
        try:
            self.result = self._run()
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            self.error = e
        self.finished = time.monotonic()

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def is_completed(self) -> bool:
        return not self._thread.is_alive()


def start_after(last: BackgroundHandle | None, run: Callable[[], Any],
                what: str) -> BackgroundHandle:
    """Run `run()` once `last` has finished; a failure of `last` fails this one too."""
    if last is not None and last.is_completed() and last.error is None:
        last = None
    return BackgroundHandle(run, last, what)
