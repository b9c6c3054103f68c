"""Hidden tests stay hidden: nbgrader's own feedback prints their source (jupyter/nbgrader#917),
and a failing hidden test's traceback quotes the line that failed. Before nbgrader renders the
feedback, `RedactHiddenTests` puts back the visible part of each test cell that has hidden
tests (as the source notebook defines it) and cuts every traceback in such a cell to its last
line: the error and its message, no code.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?",
                    re.MULTILINE | re.DOTALL)
NOTICE = "# (hidden tests ran here; their code is not shown)"


def hidden_test_cells(source_notebook: Path) -> dict[str, str]:
    """grade_id -> visible source, for every cell of the source notebook with hidden tests."""
    nb = nbformat.read(source_notebook, as_version=4)
    return {cell.metadata["nbgrader"]["grade_id"]: HIDDEN.sub(NOTICE + "\n", cell.source).rstrip()
            for cell in nb.cells
            if "nbgrader" in cell.metadata and HIDDEN.search(cell.source)}


class RedactHiddenTests(NbGraderPreprocessor):
    """Replace hidden tests by a notice, and their tracebacks by the error's last line."""

    solutions = Unicode(help="the course's solutions/ folder").tag(config=True)

    def preprocess(self, nb, resources):
        lab, notebook = resources["nbgrader"]["assignment"], resources["nbgrader"]["notebook"]
        source = Path(self.solutions) / lab / f"{notebook}.ipynb"
        visible = hidden_test_cells(source)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in visible:
                cell.source = visible[grade_id]
                for output in cell.get("outputs", []):
                    if output.output_type == "error":
                        output.traceback = [f"{output.ename}: {output.evalue}"]
        return nb, resources
