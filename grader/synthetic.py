"""Synthetic students, for the demo and the tests: the same release, filled in differently."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

from .course import Course

MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[^\n]*\n?", re.MULTILINE)


def blank(course: Course, lab: str) -> NotebookNode:
    """The release, untouched."""
    return nbformat.read(course.released_notebook(lab), as_version=4)


def solved(course: Course, lab: str) -> NotebookNode:
    """The release with every solution cell answered as the instructor's solution does."""
    source = nbformat.read(course.source_notebook(lab), as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: MARKERS.sub("", c.source)
               for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    nb = blank(course, lab)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def with_cell(nb: NotebookNode, grade_id: str, source: str) -> NotebookNode:
    """A copy of `nb` whose cell `grade_id` holds `source` instead."""
    nb = nbformat.from_dict(nb)
    cell = next((c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id),
                None)
    if cell is None:
        raise KeyError(f"no cell with grade_id {grade_id!r}")
    cell.source = source
    return nb


def without_cell(nb: NotebookNode, grade_id: str) -> NotebookNode:
    nb = nbformat.from_dict(nb)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def save(nb: NotebookNode, folder: Path, student: str, lab: str) -> Path:
    """Write it where a flat submissions folder keeps it: <folder>/<student>/<lab>.ipynb."""
    path = Path(folder) / student / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
