"""The grader's half of lab integrity that runs before grading (`lib_dist.integrity` is the
library's half, and `grader.judge` where verdicts come from).

nbgrader's sanitizing steps take the submission as the student left it; before the judge sees
it, every locked cell of the release is put back where the student deleted one
(`RestoreLockedCells`: a deleted test is graded as shipped), and a cell the student dressed in
nbgrader's metadata loses it (`ForgetForeignCells`: it runs as the student's own code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode


def released_cells(resources: dict[str, Any], locked_only: bool = False) -> set[str]:
    """The grade ids of the lab's cells as the gradebook holds them from the release (or of
    its locked cells only): a cell a student added with such metadata is not among them."""
    meta = resources["nbgrader"]
    with Gradebook(meta["db_url"]) as gb:
        notebook = gb.find_notebook(meta["notebook"], meta["assignment"])
        return {c.name for c in notebook.source_cells if not locked_only or c.locked}


class ForgetForeignCells(NbGraderPreprocessor):
    """A cell whose nbgrader metadata names no cell of the release is the student's own: it
    loses that metadata before nbgrader restores the lab's cells (which would otherwise stop
    at it), and counts as the student's code."""

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]):
        known = released_cells(resources)
        for cell in nb.cells:
            if "nbgrader" in cell.metadata and cell_name(cell) not in known:
                del cell.metadata["nbgrader"]
        return nb, resources


class RestoreLockedCells(NbGraderPreprocessor):
    """Put back, from the released notebook, every locked cell the submission lacks, after the
    released cell it followed (nbgrader's own `add_missing_cells` fails when that cell is not a
    graded one); `OverwriteCells` then gives it the gradebook's source, hidden tests included."""

    release = Unicode("", help="the course's labs/ folder").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]):
        lab = resources["nbgrader"]["notebook"]
        shipped = Path(self.release) / resources["nbgrader"]["assignment"] / f"{lab}.ipynb"
        if not self.release or not shipped.is_file():
            return nb, resources
        locked = released_cells(resources, locked_only=True)
        present = {cell_name(c) for c in nb.cells}
        previous = None
        for cell in nbformat.read(shipped, as_version=4).cells:
            name = cell_name(cell)
            if name in locked and name not in present:
                at = _index_after(nb, previous)
                cell.outputs = [] if cell.cell_type == "code" else cell.get("outputs")
                nb.cells.insert(at, cell if cell.cell_type == "code" else _without_outputs(cell))
                present.add(name)
            if name in present:
                previous = name
        return nb, resources


def _index_after(nb: NotebookNode, name: str | None) -> int:
    if name is None:
        return 0
    return next(i + 1 for i, c in enumerate(nb.cells) if cell_name(c) == name)


def _without_outputs(cell: NotebookNode) -> NotebookNode:
    cell.pop("outputs", None)
    return cell


def cell_name(cell: NotebookNode) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")
