"""`python -m grader autograde --own-answers`: a later lab's graded run uses the student's own
earlier answers where it depends on them; by default lib_dist's reference, so that one wrong
lab does not cost points twice.

One real course, one student, two real gradings of lab01 (no cluster: the cheapest lab). The
lab is declared, for this test only, to use lab03's `ring_all_reduce` (`Lab.uses`; lab04 and
lab07 really do, but grading them takes minutes). The student's lab03 in submitted/ has a ring
that zeroes the tensor; their lab01 `binary_cross_entropy_with_logits` is the solution's, scaled
by an all-reduce of ones over two simulated ranks divided by two: 1 on lib_dist's all-reduce,
0 on the student's broken ring. So Q3 passes by default and fails with --own-answers, which
proves that the judge ran lib_dist on the student's earlier answer.
"""

from __future__ import annotations

import dataclasses

import nbformat
import pytest

from conftest import course_with_lab
from grader import synthetic
from grader.cli import main as cli
from grader.course import REPO
from grader.grading import autograde, cell_scores, find_submissions
from grader.judged import earlier_answers
from lab_solutions import answer_source
from lib_dist.extend import LABS


LAB, EARLIER = "lab01_cross_entropy", "lab03_collectives"
Q3 = ("q3-test-values", "q3-test-extreme", "q3-test-grad")
BROKEN_RING = '''
def ring_all_reduce(comm, tensor, op="sum"):
    """A ring that never sends: every rank's tensor comes back zeroed."""
    return tensor.zero_()
'''
ON_ALL_REDUCE = '''

def binary_cross_entropy_with_logits(logit, target, reduction="mean"):
    from lib_dist.comm import SimulatedWorld

    twice = SimulatedWorld(2).run(lambda comm: comm.all_reduce(torch.ones(1)))[0].item()
    return _bce(logit, target, reduction) * (twice / 2)
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_own_answers_grades_a_later_lab_on_the_students_earlier_answer(tmp_path, monkeypatch):
    monkeypatch.setitem(LABS, LAB, dataclasses.replace(LABS[LAB], uses=("ring_all_reduce",)))
    course = course_with_lab(tmp_path / "course", LAB)
    bce = answer_source(LAB, "q3-solution").replace(
        "def binary_cross_entropy_with_logits(", "def _bce(") + ON_ALL_REDUCE
    synthetic.save(synthetic.with_cell(synthetic.solved(course, LAB), "q3-solution", bce),
                   tmp_path / "incoming", "ada", LAB)
    earlier = nbformat.read(REPO / "labs" / EARLIER / f"{EARLIER}.ipynb", as_version=4)
    earlier_path = course.submitted_notebook(EARLIER, "ada")
    earlier_path.parent.mkdir(parents=True)
    nbformat.write(synthetic.with_cell(earlier, "q4-solution", BROKEN_RING), earlier_path)

    subs, problems = find_submissions(course, tmp_path / "incoming")
    assert not problems
    [by_default] = autograde(course, subs, progress=False)
    assert by_default.error == ""
    reference_scores = cell_scores(course, LAB, "ada")
    assert all(reference_scores[q] > 0 for q in Q3), reference_scores
    assert "own answers" not in _first_locked_output(course)

    assert cli(["--root", str(course.root), "--cell-timeout", "120", "autograde",
                "--own-answers", str(tmp_path / "incoming")]) == 0
    own_scores = cell_scores(course, LAB, "ada")
    assert [own_scores[q] for q in Q3] == [0, 0, 0], own_scores
    assert {k: v for k, v in own_scores.items() if k not in Q3} == {
        k: v for k, v in reference_scores.items() if k not in Q3}
    said = _first_locked_output(course)
    assert "graded on your own answers of earlier labs: ring_all_reduce (lab03_collectives)" in said
    nb = nbformat.read(course.autograded_notebook(LAB, "ada"), as_version=4)
    errors = {c.metadata["nbgrader"]["grade_id"]: o.ename for c in nb.cells
              if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"}
    assert set(errors) == set(Q3) and "AssertionError" in errors.values(), errors  # wrong values


def _first_locked_output(course) -> str:
    nb = nbformat.read(course.autograded_notebook(LAB, "ada"), as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))


def test_what_the_judge_is_handed_from_the_submitted_folder(tmp_path):
    """lab04 uses lab03's ring: the code cells of the student's submitted lab03, or nothing
    where the student submitted none (the reference is used then)."""
    lab = "lab04_data_parallel"
    submitted = tmp_path / "submitted" / "ada" / lab / f"{lab}.ipynb"
    assert earlier_answers(lab, submitted) == {}
    assert earlier_answers(lab, None) == {}
    earlier = tmp_path / "submitted" / "ada" / EARLIER / f"{EARLIER}.ipynb"
    earlier.parent.mkdir(parents=True)
    nb = nbformat.read(REPO / "labs" / EARLIER / f"{EARLIER}.ipynb", as_version=4)
    nbformat.write(synthetic.with_cell(nb, "q4-solution", BROKEN_RING), earlier)
    handed = earlier_answers(lab, submitted)
    assert list(handed) == [EARLIER] and handed[EARLIER]["names"] == ["ring_all_reduce"]
    assert BROKEN_RING in handed[EARLIER]["cells"]
    assert earlier_answers("lab05_pipeline", submitted) == {}  # uses nothing
