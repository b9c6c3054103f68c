"""Every lecture notebook in course/ runs top to bottom without an error, in a fresh kernel
(three of them on the lecture edition, in tests/test_lecture_edition.py).

The notebooks check their own formulas (autograd, finite differences, measured memory), so a
notebook that runs is a notebook whose claims hold on this machine. The notebooks are stored
executed (`make notebooks`); tests/test_stored_notebooks.py checks, from the JSON alone, that the
stored outputs come from their current code. This test runs a copy again, in memory, and so also
catches a change in lib_dist that breaks a notebook whose own code did not change.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import test_lecture_edition as lecture_edition

COURSE = Path(__file__).resolve().parent.parent / "course"
NOTEBOOKS = sorted(COURSE.glob("*.ipynb"))
# tests/test_lecture_edition.py runs these top to bottom on the lecture edition (the same source,
# its references compiled), with the same check: not a second time here
HERE = [p for p in NOTEBOOKS if p.stem not in lecture_edition.LECTURES]

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_there_are_course_notebooks():
    assert [p.name for p in NOTEBOOKS][:2] == ["01_cross_entropy.ipynb",
                                              "02_single_device_training.ipynb"]


def test_the_lectures_not_run_here_run_on_the_lecture_edition():
    assert {p.stem for p in NOTEBOOKS} - {p.stem for p in HERE} == set(lecture_edition.LECTURES)


@pytest.mark.parametrize("path", HERE, ids=[p.stem for p in HERE])
def test_notebook_runs_without_error(path, tmp_path):
    nb = nbformat.read(path, as_version=4)   # run in memory: the stored file is not changed
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(COURSE)}},
                            extra_arguments=["--HistoryManager.hist_file=:memory:"])
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert errors == []
