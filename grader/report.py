"""The class at a glance: a CSV of scores (student x lab) and a figure of their spread, one
panel per lab in a grid that a laptop's screen shows whole."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from nbgrader.api import Gradebook, MissingEntry  # noqa: E402

from .course import Course, put_own_scripts_on_path  # noqa: E402


def score_table(course: Course) -> tuple[list[str], dict[str, dict[str, float | None]]]:
    """Labs, and for each student the score of each lab (None: not submitted)."""
    put_own_scripts_on_path()  # a course graded nothing yet: nbgrader creates the gradebook
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
    plot(labs, table, png_path)
    return csv_path, png_path


def format_table(course: Course) -> str:
    labs, table = score_table(course)
    width = max([len(s) for s in table] + [7])
    lines = [f"{'student':<{width}}  " + "  ".join(f"{lab:>12}" for lab in labs)]
    for student, row in table.items():
        cells = ("-" if row[lab] is None else f"{row[lab]:g}" for lab in labs)
        lines.append(f"{student:<{width}}  " + "  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


COLUMNS = 3  # panels per row: nine labs make a 3x3 grid
WIDTH_IN, ROW_IN, DPI = 10.0, 2.6, 120  # 1200 px wide, 312 px per row: a laptop's screen
MARK = "#c44e52"  # the maximum's line and label


def plot(labs: list[str], table: dict, path: Path) -> tuple[int, int]:
    """Draw each lab's histogram of scores in its own panel of a grid, `COLUMNS` to a row,
    with the lab's maximum marked; save it to `path` (1200 px wide). Returns (rows, columns).

    One panel per lab keeps each readable at a laptop's width (a single row of nine was
    4320 px wide); panels left over in the last row are blank."""
    count = max(len(labs), 1)
    columns = min(COLUMNS, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(WIDTH_IN, ROW_IN * rows), squeeze=False)
    maxima = table["(max)"]
    for ax, lab in zip(axes.flat, labs):
        got = [row[lab] for s, row in table.items() if s != "(max)" and row[lab] is not None]
        top = maxima[lab] or 1
        ax.hist(got, bins=[x - 0.5 for x in range(int(top) + 2)], color="#4c72b0",
                edgecolor="white")
        ax.axvline(top, color=MARK, linestyle="--", linewidth=1.5)
        ax.set_xlim(-0.5, top + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(lab, loc="left", fontsize=10)
        ax.set_title(f"max {top:g}", loc="right", fontsize=10, color=MARK)
        ax.set_xlabel(f"score (n={len(got)}, median "
                      f"{statistics.median(got) if got else 0:g})", fontsize=9)
        ax.set_ylabel("students", fontsize=9)
    for ax in list(axes.flat)[len(labs):]:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return rows, columns
