"""Draw what data-parallel ranks did during one step: compute and all-reduces, rank by rank.

    logs = [log for log in cluster.run(lambda comm: model_on_rank.timeline.last)]  # by rank
    plot_timeline(logs)                      # matplotlib: one row per rank
    chrome_trace(logs, "out/step.json")      # the same, for Perfetto or chrome://tracing

Each `StepLog` is one rank's record of the same step (`DataParallel.timeline`); its `spans()`
give forward and backward (compute) and each bucket's all-reduce (communication, when it really
ran on the rank's background thread). Times are `time.monotonic()`, comparable between the
processes of one machine, so the ranks share one time axis, starting at the earliest mark.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .timeline import StepLog

COLORS = {"forward": "tab:blue", "backward": "tab:orange", "communication": "tab:green"}
LANES = ("compute", "communication")


def time_origin(logs: Sequence[StepLog]) -> float:
    """The earliest mark of any rank: time zero of the drawing."""
    starts = [log.marks[0].time for log in logs if log.marks]
    if not starts:
        raise ValueError("no marks to draw: run a step first")
    return min(starts)


def plot_timeline(logs: Sequence[StepLog], ax: Any = None, title: str = "") -> Any:
    """One row per rank, in milliseconds: forward and backward on the upper lane, each
    bucket's all-reduce on the lower one (labelled with its bucket; from when the rank's
    background thread began it, waiting for the other ranks included, to its end), and a
    triangle where each bucket's all-reduce was started. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = time_origin(logs)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.8 * len(logs)))
    height = 0.36
    for rank, log in enumerate(logs):
        row = len(logs) - 1 - rank  # rank 0 on top
        for span in log.spans():
            lane = 0 if span.kind == "compute" else 1
            y = row + (0.02 if lane == 0 else -0.02 - height)
            color = COLORS[span.name] if span.kind == "compute" else COLORS["communication"]
            start, width = (span.start - t0) * 1e3, (span.end - span.start) * 1e3
            ax.broken_barh([(start, width)], (y, height), facecolors=color,
                           edgecolor="black", linewidth=0.4)
            if span.kind == "communication":
                ax.text(start + width / 2, y + height / 2, span.name.split()[-1],
                        ha="center", va="center", fontsize=7)
        starts = [(m.time - t0) * 1e3 for m in log.of("bucket_start")]
        ax.plot(starts, [row - 0.02] * len(starts), "v", color="black", markersize=4)
    ax.set_yticks(range(len(logs)), [f"rank {r}" for r in reversed(range(len(logs)))])
    ax.set_ylim(-0.6, len(logs) - 0.4)
    ax.set_xlabel("milliseconds since the step's first mark")
    handles = [Patch(color=COLORS["forward"], label="forward"),
               Patch(color=COLORS["backward"], label="backward"),
               Patch(color=COLORS["communication"], label="all-reduce of bucket k"),
               plt.Line2D([], [], color="black", marker="v", ls="", markersize=4,
                          label="a bucket's all-reduce started")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(title or "one data-parallel step: compute (upper lane) and communication "
                 "(lower lane) per rank", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def chrome_trace(logs: Sequence[StepLog], path: str | Path | None = None) -> dict[str, Any]:
    """The step as Chrome-trace JSON: a process per rank, a thread per lane (compute,
    communication), a complete event ("X") per span and an instant event ("i") where each
    bucket's all-reduce was started. Written to `path` if given; returns the document."""
    t0 = time_origin(logs)
    events: list[dict[str, Any]] = []
    for rank, log in enumerate(logs):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": lane,
                    "args": {"name": name}} for lane, name in enumerate(LANES)]
        for span in log.spans():
            events.append({"name": span.name, "cat": span.kind, "ph": "X", "pid": rank,
                           "tid": LANES.index(span.kind), "ts": (span.start - t0) * 1e6,
                           "dur": max((span.end - span.start) * 1e6, 0.001)})
        events += [{"name": f"start all_reduce bucket {m.bucket}", "cat": "communication",
                    "ph": "i", "s": "t", "pid": rank, "tid": 0, "ts": (m.time - t0) * 1e6,
                    "args": {"bytes": m.nbytes}} for m in log.of("bucket_start")]
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
    return doc
