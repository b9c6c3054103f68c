"""Stored outputs are current: course/ and solutions/ are stored executed, top to bottom, by
`make notebooks` (grader.notebooks), and labs/ without outputs.

The staleness checks read JSON only. The mechanism itself is tested on a two-cell notebook.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from grader import notebooks
from grader.notebooks import KEY, code_hash, default_notebooks, execute, problems

REPO = Path(__file__).resolve().parent.parent
STORED = default_notebooks(REPO)
RELEASED = sorted((REPO / "labs").glob("*/*.ipynb"))


def test_every_course_and_solution_notebook_is_stored():
    names = [p.relative_to(REPO).as_posix() for p in STORED]
    assert names[:3] == ["course/01_cross_entropy.ipynb", "course/02_single_device_training.ipynb",
                         "course/03_collectives.ipynb"]
    assert "solutions/lab00_ranks/lab00_ranks.ipynb" in names
    assert len(RELEASED) == len([n for n in names if n.startswith("solutions/")])


@pytest.mark.parametrize("path", STORED, ids=[f"{p.parent.name}/{p.stem}" for p in STORED])
def test_stored_outputs_are_current(path):
    found = problems(path)
    assert found == [], (f"{path.relative_to(REPO)}: " + "; ".join(found)
                         + f". Run `make notebooks NOTEBOOKS={path.relative_to(REPO)}`")
    nb = nbformat.read(path, as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", RELEASED, ids=[p.stem for p in RELEASED])
def test_the_student_release_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert [c.get("execution_count") for c in nb.cells if c.cell_type == "code"
            if c.get("outputs") or c.get("execution_count")] == []


def tiny(path: Path, *code: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny")] + [nbformat.v4.new_code_cell(c)
                                                              for c in code]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def edit(path: Path, index: int, source: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[index].source = source
    nbformat.write(nb, path)


def test_executing_stores_outputs_and_staleness_is_caught(tmp_path):
    path = tiny(tmp_path / "tiny.ipynb", "import os\nprint(os.getcwd())", "x = 6 * 7\nx")
    assert problems(path) == ["it was never executed by `make notebooks` (no record in its "
                              "metadata)", "cells 2, 3 were not run"]
    execute(path, timeout=60)
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[1].outputs[0].text.strip() == str(tmp_path)  # ran in its own folder
    assert nb.cells[2].outputs[0].data["text/plain"] == "42"
    assert nb.metadata[KEY] == {"code_sha256": code_hash(nb)}
    assert "language_info" not in nb.metadata  # nothing of the kernel's but the record
    assert problems(path) == []

    edit(path, 0, "# tiny, retitled")                    # prose: still current
    assert problems(path) == []
    edit(path, 2, "x = 6 * 8\nx")
    assert problems(path) == ["its code changed since it was executed"]

    nb = nbformat.read(path, as_version=4)               # as if cell 3 had been re-run alone
    nb.cells[2].source = "x = 6 * 7\nx"
    nb.cells[2].execution_count = 5
    nbformat.write(nb, path)
    assert problems(path) == ["its cells were not run once each, top to bottom, in one kernel "
                              "(execution counts [1, 5])"]


def test_a_failing_notebook_is_not_stored_and_an_error_output_is_stale(tmp_path):
    path = tiny(tmp_path / "fails.ipynb", "1 / 0")
    before = path.read_text()
    with pytest.raises(Exception, match="ZeroDivisionError"):
        execute(path, timeout=60)
    assert path.read_text() == before
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].execution_count = 1
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError",
                                                  evalue="division by zero", traceback=[])]
    nb.metadata[KEY] = {"code_sha256": code_hash(nb)}
    nbformat.write(nb, path)
    assert problems(path) == ["cell 2 holds an error: ZeroDivisionError: division by zero"]


def test_outputs_go_into_the_file_as_it_is_now_unless_its_code_changed(tmp_path):
    path = tiny(tmp_path / "shared.ipynb", "print('hi')")
    executed = nbformat.read(path, as_version=4)
    ran = code_hash(executed)
    executed.cells[1].outputs = [
        nbformat.v4.new_output("display_data", data={notebooks.WIDGET: {"model_id": "x"},
                                                     "text/plain": "  0%|   | 0/300"}),
        nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    executed.cells[1].execution_count = 1
    edit(path, 0, "# edited by someone else meanwhile")
    notebooks._store(path, executed, ran)
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].source == "# edited by someone else meanwhile"
    assert [o.text for o in nb.cells[1].outputs] == ["hi\n"]   # the progress bar is dropped
    assert problems(path) == []

    edit(path, 1, "print('changed')")
    with pytest.raises(RuntimeError, match="changed while it ran"):
        notebooks._store(path, executed, ran)
    assert nbformat.read(path, as_version=4).cells[1].source == "print('changed')"
