"""Horovod Timeline: what each rank's Horovod operations did and when, as a Chrome trace.

Set `HOROVOD_TIMELINE=/path/timeline.json` before `hvd.init()` (the launcher passes its
environment to every rank), or call `hvd.start_timeline(path)` / `hvd.stop_timeline()`. Every
rank records its own operations; at `stop_timeline()` or `hvd.shutdown()` the ranks' records
are gathered and rank 0 writes one file, as Horovod does, for chrome://tracing or Perfetto
(https://ui.perfetto.dev). Each operation shows as two spans on its rank's row: `QUEUE`, from
the call until its turn came (the operations started before it were still running), then the
operation itself, named by its kind and tensor name (`ALLREDUCE avg_loss`; a fused all-reduce
lists its tensors). The file is `lib_dist.comm.Trace.to_chrome_trace`'s format.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..comm import Event, Trace


class Timeline:
    """One rank's record of its Horovod operations, to be written to `path`."""

    def __init__(self, path: str | Path, rank: int):
        self.path = Path(path)
        self.rank = rank
        self.trace = Trace()
        self._count = 0
        self._lock = threading.Lock()

    def record(self, kind: str, name: str, nbytes: int, queued: float, started: float,
               ended: float) -> None:
        """One operation: called at `queued`, began at `started`, finished at `ended`."""
        with self._lock:
            first = self._count
            self._count += 2
        label = f"{kind} {name}" if name else kind
        if started > queued:
            self.trace.record(Event(self.rank, f"QUEUE {label}", -1, nbytes, queued, started,
                                    seq=first, after=first))
        self.trace.record(Event(self.rank, label, -1, nbytes, started, ended,
                                seq=first + 1, after=first))

    def events(self) -> list[Event]:
        return list(self.trace.events)


def write(path: str | Path, events: list[Event]) -> None:
    """Write every rank's `events` to `path` as a Chrome trace (one row per rank)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Trace(sorted(events, key=lambda e: (e.start, e.rank))).to_chrome_trace(path)
