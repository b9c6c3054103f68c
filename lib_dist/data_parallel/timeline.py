"""What happened during each training step of one rank, in order: the evidence of overlap.

`DataParallel` and `Buckets` note a `Mark` at each moment that matters:

    forward_start, forward_end       the wrapped module's forward
    backward_start                   the gradient reached the module's output
    grad_ready      param            a parameter's gradient is complete (its hook fired)
    bucket_start    bucket, nbytes   its all-reduce was started (asynchronously)
    backward_end                     autograd finished; now wait for the buckets
    bucket_done     bucket, ran      waited for; `ran`: when its all-reduce really ran
    synced                           every gradient holds the average over the ranks

Marks are appended by one thread in the order things happened, so tests check overlap from
their order alone ("bucket 0 started before backward ended"), never from durations. The
`time.monotonic()` stamps are for drawing: `spans()` turns a step into compute and
communication intervals, comparable between the processes of one machine.

A step runs from the first forward after a synchronization to the next synchronization, so the
micro-batches of `no_sync()` belong to the step that finally sends their sum.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mark:
    """One moment of a step. `bucket` is -1 and `param` empty where they do not apply;
    `ran` is (start, end) of a bucket's all-reduce, for `bucket_done`."""

    what: str
    time: float
    bucket: int = -1
    param: str = ""
    nbytes: int = 0
    ran: tuple[float, float] | None = None


@dataclass(frozen=True)
class Span:
    """An interval to draw: `kind` is "compute" or "communication"."""

    name: str
    kind: str
    start: float
    end: float


@dataclass
class StepLog:
    """The marks of one step, in the order they were noted."""

    marks: list[Mark] = field(default_factory=list)

    def of(self, what: str) -> list[Mark]:
        return [m for m in self.marks if m.what == what]

    def position(self, what: str, bucket: int = -1) -> int:
        """Where the first such mark is in the order of the step (-1: it never happened)."""
        for i, m in enumerate(self.marks):
            if m.what == what and (bucket < 0 or m.bucket == bucket):
                return i
        return -1

    def hook_order(self) -> list[str]:
        """Names of the parameters, in the order their gradients became ready."""
        return [m.param for m in self.of("grad_ready")]

    def buckets_started(self) -> list[int]:
        """Bucket indices in the order their all-reduces were started."""
        return [m.bucket for m in self.of("bucket_start")]

    def started_during_backward(self) -> list[int]:
        """The buckets whose all-reduce started before backward ended: the overlapped ones."""
        end = self.position("backward_end")
        return [m.bucket for m in self.marks[:end] if m.what == "bucket_start"] if end >= 0 else []

    def spans(self) -> list[Span]:
        """Forward and backward (compute) and each bucket's all-reduce (communication)."""
        out = _pair(self, "forward_start", "forward_end", "forward")
        out += _pair(self, "backward_start", "backward_end", "backward")
        out += [Span(f"all_reduce bucket {m.bucket}", "communication", *m.ran)
                for m in self.of("bucket_done") if m.ran is not None]
        return sorted(out, key=lambda s: s.start)


class Timeline:
    """The step logs of one rank: the step being recorded and the last `keep` finished ones."""

    def __init__(self, keep: int = 16):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.current = StepLog()
        self.finished: deque[StepLog] = deque(maxlen=keep)

    def note(self, what: str, bucket: int = -1, param: str = "", nbytes: int = 0,
             ran: tuple[float, float] | None = None) -> None:
        self.current.marks.append(Mark(what, time.monotonic(), bucket, param, nbytes, ran))

    def end_step(self) -> None:
        self.finished.append(self.current)
        self.current = StepLog()

    @property
    def last(self) -> StepLog:
        """The most recent finished step."""
        if not self.finished:
            raise LookupError("no step has finished synchronizing yet")
        return self.finished[-1]


def _pair(log: StepLog, start: str, end: str, name: str) -> list[Span]:
    """Spans from each `start` mark to the next `end` mark."""
    spans, opened = [], None
    for m in log.marks:
        if m.what == start and opened is None:
            opened = m.time
        elif m.what == end and opened is not None:
            spans.append(Span(name, "compute", opened, m.time))
            opened = None
    return spans
