"""What a pipeline timeline measures: makespan, bubble, live activations, and the formulas.

Every measure takes a `Trace` with "compute" events labelled "F3"/"B3" (as
`lib_dist.pipeline.simulate` makes, and as a `Stage` records on a rank), so a schedule on
paper and a run on simulated or real ranks are measured the same way.

With p stages of equal cost, m micro-batches, a forward costing f and a backward b, and free
messages, GPipe and 1F1B both take (m + p - 1)(f + b): each rank works m(f + b) of it, so the
bubble, the share of the ranks' time spent idle, is (p - 1) / (m + p - 1).
"""

from __future__ import annotations

from ..comm.trace import Event, Trace


def compute_events(trace: Trace, rank: int | None = None) -> list[Event]:
    """The trace's compute events (of one rank), in the order they ran."""
    return sorted((e for e in trace.events
                   if e.kind == "compute" and (rank is None or e.rank == rank)),
                  key=lambda e: (e.rank, e.seq))


def makespan(trace: Trace, clock: str = "virtual") -> float:
    """From the first step's start to the last step's end."""
    spans = [e.times(clock) for e in compute_events(trace)]
    if not spans:
        raise ValueError("no compute events: nothing ran")
    return max(b for _, b in spans) - min(a for a, _ in spans)


def busy_time(trace: Trace, rank: int, clock: str = "virtual") -> float:
    """How long `rank` computed."""
    return sum(b - a for a, b in (e.times(clock) for e in compute_events(trace, rank)))


def bubble_fraction(trace: Trace, clock: str = "virtual") -> float:
    """The share of the ranks' time (ranks x makespan) spent not computing."""
    ranks = sorted({e.rank for e in compute_events(trace)})
    total = makespan(trace, clock) * len(ranks)
    return 1.0 - sum(busy_time(trace, r, clock) for r in ranks) / total


def live_activations(trace: Trace, rank: int) -> list[int]:
    """After each of `rank`'s steps, how many micro-batches' activations it holds: a forward
    keeps them, a backward frees them; a backward split in two frees them with its second
    half, the weight-gradient step "W" (the input-gradient step "I" still needs them)."""
    held: set[str] = set()
    counts = []
    for e in compute_events(trace, rank):
        kind, key = e.label[:1], e.label[1:]
        if kind == "F":
            held.add(key)
        elif kind in ("B", "W"):
            held.discard(key)
        counts.append(len(held))
    return counts


def peak_live(trace: Trace, rank: int) -> int:
    """The most micro-batches' activations `rank` held at once."""
    return max(live_activations(trace, rank), default=0)


def formula_makespan(p: int, m: int, forward: float = 1.0, backward: float = 2.0) -> float:
    """(m + p - 1)(f + b): GPipe's and 1F1B's makespan with equal stages and free messages."""
    return (m + p - 1) * (forward + backward)


def formula_bubble(p: int, m: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of GPipe and 1F1B."""
    return (p - 1) / (m + p - 1)
