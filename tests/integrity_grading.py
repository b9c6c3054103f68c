"""What the integrity tests (tests/test_integrity*.py) share: one lab released into a scratch
course, its solution, its untouched release and each cheating submission graded once, in the
sandbox, as `python -m grader autograde` does (`graded_lab`, the module-scoped fixture every
lab's tests use), and the checks of a cheat's and the blank release's scores."""

from __future__ import annotations

import textwrap

import nbformat
import pytest

from conftest import course_with_lab
from grader import synthetic
from grader.grading import autograde, cell_scores, find_submissions


def code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def graded_lab(lab: str, cheats: dict, solution: bool = True):
    """The module-scoped fixture of `lab` graded (`grade`): in a test module,
    `lab04 = graded_lab(LAB04, LAB04_CHEATS)` makes `lab04` a fixture, graded once per module."""
    @pytest.fixture(scope="module")
    def graded(tmp_path_factory):
        """The lab graded once for this module: (course, {student: cell scores})."""
        return grade(tmp_path_factory, lab, cheats, solution)
    return graded


def grade(tmp_path_factory, lab, cheats, solution=True):
    """Grade the solution (unless not `solution`), the untouched release (student "release")
    and each cheat once; (course, {student: cell scores})."""
    root = tmp_path_factory.mktemp(lab)
    course = course_with_lab(root, lab)
    solved = synthetic.solved(course, lab)
    folder = root / "incoming"
    if solution:
        synthetic.save(solved, folder, "solution", lab)
    synthetic.save(synthetic.blank(course, lab), folder, "release", lab)
    for student, (cells, _) in cheats.items():
        nb = solved
        for grade_id, source in cells.items():
            nb = (dressed_as_locked(nb, grade_id[1:], source) if grade_id.startswith("+")
                  else synthetic.with_cell(nb, grade_id, source))
        synthetic.save(nb, folder, student, lab)
    subs, problems = find_submissions(course, folder)
    assert problems == []
    outcomes = autograde(course, subs, progress=False)
    assert [o.error for o in outcomes if o.error] == []
    scores = {o.submission.student: cell_scores(course, lab, o.submission.student)
              for o in outcomes}
    return course, scores


def dressed_as_locked(nb, after: str, source: str):
    """`nb` with a new cell after `after`, whose metadata claims it is one of the lab's own
    locked cells."""
    nb = nbformat.from_dict(nb)
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "grade_id": "helpers-2", "locked": True,
                                 "schema_version": 3, "solution": False, "task": False}
    nb.cells.insert(at + 1, cell)
    return nb


def error_text(course, lab, student) -> str:
    nb = nbformat.read(course.autograded_notebook(lab, student), as_version=4)
    return "\n".join(f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells
                     for o in c.get("outputs", []) if o.get("output_type") == "error")


def check_blank_release(graded):
    """The untouched release scores 0 on every graded cell: no test passes without an answer
    (what `grader check` checks; lab00's is in test_grader)."""
    _, scores = graded
    assert scores["release"] and not any(scores["release"].values()), scores["release"]


def check_cheat(graded, lab, cheats, student):
    course, scores = graded
    full = scores["solution"]
    assert full and all(full.values()), f"the solution lost points: {full}"
    zeroed = set(full) if cheats[student][1] == "all" else cheats[student][1]
    expected = {cell: 0.0 if cell in zeroed else points for cell, points in full.items()}
    assert scores[student] == expected
    return error_text(course, lab, student)
