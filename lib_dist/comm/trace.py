"""Message traces: what each rank sent and received, when, and what it would cost.

Every communicator records one `Event` per completed operation on its rank. Pairing the
k-th send from `src` to `dst` with the k-th receive at `dst` from `src` (channels are FIFO,
as in MPI and torch.distributed) turns events into `Message`s. Labs grade the pattern:
how many messages each rank sent and how many bytes, not only the final tensor.

The alpha-beta model prices a message of b bytes at `alpha + b / beta`. `modeled_time`
replays a trace under that model: a message starts once its sender's outbound link and its
receiver's inbound link are free (links are full duplex) and once every operation its rank
had completed before posting it has finished in the model, so program order is respected.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

P2P_KINDS = ("send", "recv")


@dataclass(frozen=True)
class Event:
    """One completed operation on one rank.

    `after` counts the operations this rank had completed before posting this one: the
    operation depends on those, and on nothing it posted later. `seq` orders completions.
    Times are `time.monotonic()` seconds, comparable between processes on one machine.
    `vstart`/`vend` are the same on a simulated world's virtual clock (`lib_dist.comm.clock`),
    None elsewhere. `kind` "compute" is work a rank declared (`Communicator.compute`), named
    by `label` (e.g. "F3": the forward of micro-batch 3).
    """

    rank: int
    kind: str  # "send", "recv", or a collective's name such as "all_reduce"
    peer: int  # -1 for collectives
    nbytes: int
    start: float
    end: float
    seq: int
    after: int
    label: str = ""
    vstart: float | None = None
    vend: float | None = None

    @property
    def name(self) -> str:
        """What a timeline shows: the label, else "send to 2", "recv from 1", "barrier"."""
        if self.label:
            return self.label
        if self.kind in P2P_KINDS:
            return f"{self.kind} {'to' if self.kind == 'send' else 'from'} {self.peer}"
        return self.kind

    def times(self, clock: str = "wall") -> tuple[float, float]:
        """(start, end) on the wall clock or the virtual one."""
        if clock == "wall":
            return self.start, self.end
        if self.vstart is None or self.vend is None:
            raise ValueError(f"rank {self.rank}'s {self.name} has no virtual time: it was not "
                             f"recorded by a SimulatedWorld with a clock")
        return self.vstart, self.vend


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    nbytes: int
    start: float
    end: float


@dataclass(frozen=True)
class RankTraffic:
    sent_messages: int = 0
    sent_bytes: int = 0
    recv_messages: int = 0
    recv_bytes: int = 0


@dataclass(frozen=True)
class AlphaBeta:
    """Latency `alpha` in seconds per message, bandwidth `beta` in bytes per second."""

    alpha: float = 5e-6
    beta: float = 12.5e9  # 100 Gbit/s

    def cost(self, nbytes: int) -> float:
        return self.alpha + nbytes / self.beta


@dataclass
class Trace:
    """The events of one or more ranks. Thread-safe to record into."""

    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Pickle the events only, so traces can travel back from other processes."""
        with self._lock:
            return {"events": list(self.events)}

    def __setstate__(self, state: dict) -> None:
        self.events = state["events"]
        self._lock = threading.Lock()

    def record(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    @classmethod
    def merge(cls, traces: list[Trace]) -> Trace:
        """One trace from the per-rank traces of a multi-process run."""
        return cls([e for t in traces for e in t.events])

    def of_rank(self, rank: int) -> list[Event]:
        return sorted((e for e in self.events if e.rank == rank), key=lambda e: e.seq)

    def messages(self) -> list[Message]:
        """Sends paired with their receives, in order of sending."""
        return [Message(s.rank, s.peer, s.nbytes, s.start, max(s.end, r.end) if r else s.end)
                for s, r in self.pairs()]

    def pairs(self) -> list[tuple[Event, Event | None]]:
        """Each send event with the receive that took it (None if none was traced), in order
        of sending: the k-th send of a channel meets its k-th receive (FIFO)."""
        recvs = _receives_by_channel(self.events)
        out: list[tuple[Event, Event | None]] = []
        for s in sorted(self.events, key=lambda e: (e.start, e.rank, e.seq)):
            if s.kind == "send":
                queue = recvs[(s.rank, s.peer)]
                out.append((s, queue.popleft() if queue else None))
        return out

    def summary(self) -> dict[int, RankTraffic]:
        """Messages and bytes sent and received by each rank that appears in the trace."""
        counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for e in self.events:
            c = counts[e.rank]
            if e.kind == "send":
                c[0] += 1
                c[1] += e.nbytes
            elif e.kind == "recv":
                c[2] += 1
                c[3] += e.nbytes
        return {rank: RankTraffic(*counts[rank]) for rank in sorted(counts)}

    def format_summary(self) -> str:
        lines = ["rank  sent msgs  sent bytes  recv msgs  recv bytes"]
        for rank, t in self.summary().items():
            lines.append(
                f"{rank:>4}  {t.sent_messages:>9}  {t.sent_bytes:>10}"
                f"  {t.recv_messages:>9}  {t.recv_bytes:>10}"
            )
        return "\n".join(lines)

    def modeled_time(self, model: AlphaBeta = AlphaBeta()) -> float:
        """Seconds the traced point-to-point pattern takes under the alpha-beta model."""
        by_rank: dict[int, list[Event]] = defaultdict(list)
        for e in self.events:
            by_rank[e.rank].append(e)
        for events in by_rank.values():
            events.sort(key=lambda e: e.seq)
        end: dict[tuple[int, int], float] = {}  # (rank, seq) -> modeled completion

        def ready(e: Event) -> float | None:
            """When e may start in the model, or None while one of its dependencies is unpriced."""
            deps = [end.get((e.rank, d.seq)) for d in by_rank[e.rank] if d.seq < e.after]
            priced = [t for t in deps if t is not None]
            return None if len(priced) < len(deps) else max(priced, default=0.0)

        recvs = _receives_by_channel(self.events)
        todo: list[tuple[Event, Event | None]] = []
        for e in sorted(self.events, key=lambda e: (e.start, e.rank, e.seq)):
            if e.kind == "send":
                queue = recvs[(e.rank, e.peer)]
                todo.append((e, queue.popleft() if queue else None))
            elif e.kind not in P2P_KINDS:
                todo.append((e, None))
        todo += [(r, None) for q in recvs.values() for r in q]  # receives nobody sent

        out_free: dict[int, float] = defaultdict(float)
        in_free: dict[int, float] = defaultdict(float)
        while todo:
            for i, (e, partner) in enumerate(todo):
                starts = [ready(x) for x in (e, partner) if x is not None]
                known = [s for s in starts if s is not None]
                if len(known) == len(starts):
                    break
            else:  # a cycle can only come from a malformed trace
                raise ValueError("trace has circular dependencies; was it merged twice?")
            del todo[i]
            t = max(known)
            if e.kind == "send":
                t = max(t, out_free[e.rank], in_free[e.peer]) + model.cost(e.nbytes)
                out_free[e.rank] = in_free[e.peer] = t
            end[(e.rank, e.seq)] = t
            if partner:
                end[(partner.rank, partner.seq)] = t
        return max(end.values(), default=0.0)

    def to_chrome_trace(self, path: str | Path | None = None, clock: str = "wall") -> dict:
        """Chrome-trace JSON (open in Perfetto or chrome://tracing): one row per rank.
        `clock="virtual"`: virtual times, one unit drawn as one millisecond."""
        scale = 1e6 if clock == "wall" else 1e3
        t0 = min((e.times(clock)[0] for e in self.events), default=0.0)
        rows: list[dict[str, Any]] = []
        for e in self.events:
            start, end = e.times(clock)
            rows.append({
                "name": e.name,
                "cat": ("p2p" if e.kind in P2P_KINDS else
                        "compute" if e.kind == "compute" else "collective"),
                "ph": "X",
                "pid": 0,
                "tid": e.rank,
                "ts": (start - t0) * scale,
                "dur": max((end - start) * scale, 0.001),
                "args": {"bytes": e.nbytes, "peer": e.peer},
            })
        rows += [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
            for r in sorted({e.rank for e in self.events})
        ]
        doc = {"traceEvents": rows, "displayTimeUnit": "ms"}
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc

    def to_dicts(self) -> list[dict]:
        return [asdict(e) for e in self.events]


def _receives_by_channel(events: list[Event]) -> dict[tuple[int, int], deque[Event]]:
    """The receives of each (src, dst) channel in the order they were posted, which is the
    order FIFO matching pairs them with sends; not `seq`, the order they were waited on."""
    recvs: dict[tuple[int, int], deque[Event]] = defaultdict(deque)
    for e in sorted(events, key=lambda e: (e.rank, e.start, e.seq)):
        if e.kind == "recv":
            recvs[(e.peer, e.rank)].append(e)
    return recvs
