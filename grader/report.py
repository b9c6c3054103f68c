"""The class at a glance: a CSV of scores (student x lab) and a figure of their spread."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from nbgrader.api import Gradebook, MissingEntry  # noqa: E402

from .course import Course  # noqa: E402


def score_table(course: Course) -> tuple[list[str], dict[str, dict[str, float | None]]]:
    """Labs, and for each student the score of each lab (None: not submitted)."""
    with Gradebook(course.db_url, course.course_id) as gb:
        labs = sorted(a.name for a in gb.assignments)
        table: dict[str, dict[str, float | None]] = {}
        for student in sorted(s.id for s in gb.students):
            row: dict[str, float | None] = {}
            for lab in labs:
                try:
                    row[lab] = gb.find_submission(lab, student).score
                except MissingEntry:
                    row[lab] = None
            table[student] = row
        maxima = {lab: gb.find_assignment(lab).max_score for lab in labs}
    return labs, table | {"(max)": maxima}


def write(course: Course, out: Path | None = None) -> tuple[Path, Path]:
    """Write scores.csv and scores.png into `out` (default: instructor/reports)."""
    out = Path(out or course.work / "reports")
    out.mkdir(parents=True, exist_ok=True)
    labs, table = score_table(course)
    csv_path, png_path = out / "scores.csv", out / "scores.png"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *labs])
        for student, row in table.items():
            writer.writerow([student, *("" if row[lab] is None else f"{row[lab]:g}"
                                        for lab in labs)])
    _plot(labs, table, png_path)
    return csv_path, png_path


def format_table(course: Course) -> str:
    labs, table = score_table(course)
    width = max([len(s) for s in table] + [7])
    lines = [f"{'student':<{width}}  " + "  ".join(f"{lab:>12}" for lab in labs)]
    for student, row in table.items():
        cells = ("-" if row[lab] is None else f"{row[lab]:g}" for lab in labs)
        lines.append(f"{student:<{width}}  " + "  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def _plot(labs: list[str], table: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, max(len(labs), 1), figsize=(4 * max(len(labs), 1), 3),
                             squeeze=False)
    maxima = table["(max)"]
    for ax, lab in zip(axes[0], labs):
        got = [row[lab] for s, row in table.items() if s != "(max)" and row[lab] is not None]
        top = maxima[lab] or 1
        ax.hist(got, bins=[x - 0.5 for x in range(int(top) + 2)], color="#4c72b0",
                edgecolor="white")
        ax.set_xlim(-0.5, top + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{lab}  (n={len(got)}, median {statistics.median(got) if got else 0:g})")
        ax.set_xlabel(f"score out of {top:g}")
        ax.set_ylabel("students")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
