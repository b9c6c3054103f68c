"""Draw a trace as a timeline: one row per rank, its work and its waits, on either clock.

    world = SimulatedWorld(4, clock=VirtualClock())
    world.run(step)
    plot_trace(world.trace)                           # virtual time
    plot_trace(Trace.merge(traces), clock="wall")     # real engines: milliseconds

"compute" events (`Communicator.compute`) are bars labelled with their label ("F3", "B3":
forward and backward of micro-batch 3), coloured by its first letter; a receive the rank
waited in is a thin grey bar under the row, so a bubble shows as idle time with the wait that
caused it. The same trace exports to Chrome trace with `Trace.to_chrome_trace(clock=...)`.

`plot_overlap(trace, clock)` draws a virtual-clock trace with the communication in a lane of
its own under each rank's work: each message the rank sent, from the moment it could leave
(its send and its receive both posted) to its arrival, as the clock prices it, and each
collective the rank was in, as an outlined span. What overlaps shows as a message under a
compute bar.
"""

from __future__ import annotations

from typing import Any

from .clock import VirtualClock
from .trace import P2P_KINDS, Trace

COLORS = {"F": "tab:blue", "B": "tab:orange", "I": "tab:orange", "W": "tab:green"}
OTHER = "tab:purple"


def plot_trace(trace: Trace, clock: str = "virtual", ax: Any = None, title: str = "",
               labels: bool = True) -> Any:
    """The trace's compute events (and the receives ranks waited in) on one row per rank.
    Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in trace.events if e.kind in ("compute", "recv", "barrier")]
    if not any(e.kind == "compute" for e in events):
        raise ValueError("the trace has no compute events to draw: wrap the work in "
                         "comm.compute(label, cost)")
    ranks = sorted({e.rank for e in events})
    t0 = min(e.times(clock)[0] for e in events)
    scale = 1e3 if clock == "wall" else 1.0
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.8 + 0.55 * len(ranks)))
    waited = False
    for e in events:
        row = len(ranks) - 1 - ranks.index(e.rank)  # the lowest rank on top
        start, end = ((t - t0) * scale for t in e.times(clock))
        if e.kind != "compute":
            if end > start:
                ax.broken_barh([(start, end - start)], (row - 0.42, 0.1), facecolors="0.7")
                waited = True
            continue
        color = COLORS.get(e.label[:1], OTHER)
        ax.broken_barh([(start, end - start)], (row - 0.3, 0.6), facecolors=color,
                       edgecolor="black", linewidth=0.5)
        if labels and end > start:
            ax.text((start + end) / 2, row, e.label, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in reversed(ranks)])
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_xlabel("virtual time (units)" if clock == "virtual" else "milliseconds")
    kinds = sorted({e.label[:1] for e in events if e.kind == "compute"},
                   key=lambda k: ("FBIW".find(k) % 5, k))
    names = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)"}
    handles = [Patch(color=COLORS.get(k, OTHER), label=names.get(k, k)) for k in kinds]
    if waited:
        handles.append(Patch(color="0.7", label="waiting to receive"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


SHORT = {"all_to_all": "a2a", "all_to_all_check": "check", "all_gather": "gather",
         "reduce_scatter": "r-s", "all_reduce": "a-r", "broadcast": "bcast"}


def plot_overlap(trace: Trace, clock: VirtualClock, ax: Any = None, title: str = "",
                 labels: bool = True) -> Any:
    """A virtual-clock trace: per rank, its compute (upper lane) and its communication (lower
    lane): the messages it sent in flight, and its collectives (outlined, named short: "a2a"
    an all-to-all, "check" the agreement check before it). Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({e.rank for e in trace.events})
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.8 + 0.7 * len(ranks)))
    spans = [e.times("virtual") for e in trace.events]
    wide = 0.025 * (max(b for _, b in spans) - min(a for a, _ in spans))  # wide enough to name

    def row(rank: int) -> int:
        return len(ranks) - 1 - ranks.index(rank)  # the lowest rank on top

    kinds: set[str] = set()
    for e in trace.events:
        start, end = e.times("virtual")
        if end <= start or e.kind in P2P_KINDS or e.kind == "barrier":
            continue
        if e.kind == "compute":
            kinds.add(e.label[:1])
            ax.broken_barh([(start, end - start)], (row(e.rank) - 0.02, 0.4),
                           facecolors=COLORS.get(e.label[:1], OTHER), edgecolor="black",
                           linewidth=0.5)
            name, height = e.label, row(e.rank) + 0.18
        else:
            ax.broken_barh([(start, end - start)], (row(e.rank) - 0.44, 0.36),
                           facecolors="none", edgecolor="black", linewidth=0.8)
            name, height = SHORT.get(e.kind, e.kind), row(e.rank) - 0.26
        if labels and end - start >= wide:
            ax.text((start + end) / 2, height, name, ha="center", va="center", fontsize=7)
    for send, recv in trace.pairs():
        leaves = max(send.times("virtual")[0], recv.times("virtual")[0] if recv else 0.0)
        ax.broken_barh([(leaves, clock.message_cost(send.nbytes))],
                       (row(send.rank) - 0.4, 0.28), facecolors="tab:red", alpha=0.4)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in reversed(ranks)])
    ax.set_ylim(-0.6, len(ranks) - 0.5)
    ax.set_xlabel("virtual time (units)")
    names = {"F": "forward", "B": "backward", "A": "attention with a K/V block"}
    handles = [Patch(color=COLORS.get(k, OTHER), label=names.get(k, k))
               for k in sorted(kinds, key=lambda k: ("FBIW".find(k) % 5, k))]
    handles.append(Patch(color="tab:red", alpha=0.4, label="message in flight (sent)"))
    handles.append(Patch(facecolor="none", edgecolor="black", label="in a collective"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return ax
