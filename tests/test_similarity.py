"""The similarity report (`python -m grader similarity`, copydetect) on real material: every
lab's solution, its untouched release and its typical bug (the demo's alice, bob and carol);
the solution and lib_dist's own code pasted in and disguised (variables renamed, functions
reordered, comments added); and, for labs 1 to 3, answers written independently of both
(`similarity_answers.INDEPENDENT`, shown correct by the lab's own tests) and a disguised copy
of them; for labs 1 and 3, the stand-ins the student edition runs in place of their references,
pasted and disguised. Every pair made from a common source scores above `THRESHOLD`, and no
other pair does; the test prints the precision, the recall and the gap they leave around the threshold.
"""

from __future__ import annotations

import os
import shutil

import nbformat
import pytest

import similarity_answers as answers
from lab_solutions import solution
from grader import synthetic
from grader.cli import main
from grader.course import REPO, Course
from grader.demo import with_typical_bug
from grader.similarity import THRESHOLD, Match, library_code, similarity, stand_in_code
from lib_dist.extend import definitions

# Where each answer came from: two answers are a copy when they share a source.
ORIGINS = {
    "alice": {"solution"},  # the instructor's solution, as handed in
    "bob": set(),  # the release, untouched: nothing of anyone's
    "carol": {"solution"},  # the solution with one answer replaced by a typical bug
    "frank": {"solution"},  # the solution, disguised
    "grace": {"lib_dist"},  # lib_dist's own code pasted into the first answer cell
    "heidi": {"lib_dist"},  # the same, disguised
    "ivan": {"lib_dist"},  # the student edition's stand-ins (labs 1 and 3), pasted, disguised
    "dave": {"dave"},  # written independently (labs 1 to 3)
    "erin": {"dave"},  # dave's answers, disguised
    "[solution]": {"solution"},
    "[lib_dist]": {"lib_dist"},
}


def map_answers(nb, change):
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = change(cell.source)
    return nb


def class_of(course: Course, lab: str) -> dict[str, nbformat.NotebookNode]:
    """The students of `lab`, by name (see ORIGINS)."""
    solved, blank = synthetic.solved(course, lab), synthetic.blank(course, lab)
    students = {"alice": solved, "bob": blank, "carol": with_typical_bug(course, lab),
                "frank": map_answers(solved, answers.disguised)}
    if library := library_code(lab):
        first = next(c.metadata.nbgrader.grade_id for c in blank.cells
                     if c.metadata.get("nbgrader", {}).get("solution"))
        students["grace"] = synthetic.with_cell(blank, first, library)
        students["heidi"] = synthetic.with_cell(blank, first, answers.disguised(library))
        if stand_ins := stand_in_code(lab):
            students["ivan"] = synthetic.with_cell(blank, first, answers.disguised(stand_ins))
    if lab in answers.INDEPENDENT:
        students["dave"] = answers.independent(blank, lab)
        students["erin"] = map_answers(students["dave"], answers.disguised)
    return students


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Every lab's class compared: {lab: matches}, and the folder of the pages."""
    folder, out = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("similarity")
    course = Course(REPO)
    for lab in course.lab_names():
        for student, nb in class_of(course, lab).items():
            synthetic.save(nb, folder, student, lab)
    return similarity(course, folder=folder, out=out), out


def is_copy(m: Match) -> bool:
    return bool(ORIGINS[m.first] & ORIGINS[m.second])


def describe(ms: list[Match]) -> str:
    return "; ".join(f"{m.lab} {m.first}-{m.second} {m.score:.2f}" for m in ms)


def test_every_copy_is_flagged_and_no_independent_answer(measured):
    results, _ = measured
    assert sorted(results) == sorted(Course(REPO).lab_names())
    matches = [m for ms in results.values() for m in ms]
    copies = [m for m in matches if is_copy(m)]
    flagged = [m for m in matches if m.score > THRESHOLD]
    caught = [m for m in flagged if is_copy(m)]
    precision, recall = len(caught) / len(flagged), len(caught) / len(copies)
    lowest_copy = min(m.score for m in copies)
    highest_other = max(m.score for m in matches if not is_copy(m))
    independent = max(m.score for m in matches if not is_copy(m)
                      and {m.first, m.second} & {"dave", "erin"})
    print(f"\n{len(matches)} pairs, {len(copies)} copies; flagged above {THRESHOLD}: "
          f"{len(flagged)}; precision {precision:.3f}, recall {recall:.3f}; lowest copy "
          f"{lowest_copy:.3f}, highest other pair {highest_other:.3f} (with an independent "
          f"answer: {independent:.3f})")
    missed = [m for m in copies if m.score <= THRESHOLD]
    wrong = [m for m in flagged if not is_copy(m)]
    assert missed == [], f"copies not flagged: {describe(missed)}"
    assert wrong == [], f"independent answers flagged: {describe(wrong)}"
    for lab, ms in results.items():  # each kind of copy is there, in every lab it applies to
        kinds = {(m.first, m.second) for m in ms if is_copy(m)}
        assert {("alice", "carol"), ("frank", "[solution]")} <= kinds, lab
        assert (("heidi", "[lib_dist]") in kinds) == bool(library_code(lab)), lab
        assert (("ivan", "[lib_dist]") in kinds) == bool(stand_in_code(lab)), lab
        assert (("dave", "erin") in kinds) == (lab in answers.INDEPENDENT), lab


def test_renaming_reordering_and_comments_change_the_code_not_the_verdict(measured):
    results, _ = measured
    lab = "lab01_cross_entropy"
    original = answers_of(synthetic.solved(Course(REPO), lab))["q2-solution"]
    frank = answers_of(map_answers(synthetic.solved(Course(REPO), lab), answers.disguised))
    disguised = frank["q2-solution"]
    assert "counted = " in original and "counted = " not in disguised  # a local, renamed
    assert "# step" in disguised and "# step" not in original
    assert original.index("class CrossEntropy") < original.index("def cross_entropy")
    assert disguised.index("class CrossEntropy") > disguised.index("def cross_entropy")
    score = {(m.first, m.second): m.score for m in results[lab]}
    assert score[("frank", "[solution]")] > THRESHOLD and score[("alice", "frank")] > THRESHOLD


def answers_of(nb) -> dict[str, str]:
    return {c.metadata.nbgrader.grade_id: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def test_the_demos_students_are_flagged_only_where_they_share_the_solution(measured):
    """carol's notebook is alice's (the solution) with one answer replaced: a copy, flagged;
    bob handed in the release, which is boilerplate: flagged with no one."""
    results, _ = measured
    for lab, matches in results.items():
        flagged = {(m.first, m.second) for m in matches if m.score > THRESHOLD}
        assert not any("bob" in pair for pair in flagged), (lab, flagged)
        assert {("alice", "carol"), ("alice", "[solution]"), ("carol", "[solution]")} <= flagged


def test_the_page_shows_each_flagged_pair_side_by_side(measured):
    results, out = measured
    page = (out / "lab03_collectives.html").read_text()
    assert "highlight-red" in page and "highlight-green" in page
    for m in results["lab03_collectives"]:
        if m.score > THRESHOLD:
            assert f"students/{m.first}.py" in page
    csv = (out / "similarity.csv").read_text().splitlines()
    assert csv[0].startswith("lab,first,second,score")
    assert len(csv) == 1 + sum(len(ms) for ms in results.values())


# -- the independent answers are correct: the lab's own tests pass on them -----------------

SLOW_CELLS = {"q4-setup", "q4-test-gpt", "sample"}  # lab02 trains a GPT for minutes


def student_answers(lab: str, disguise: bool) -> dict[str, str]:
    nb = answers.independent(nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", 4), lab)
    return answers_of(map_answers(nb, answers.disguised) if disguise else nb)


@pytest.mark.parametrize("lab", ["lab01_cross_entropy",
                                 pytest.param("lab02_training", marks=pytest.mark.slow)])
@pytest.mark.parametrize("disguise", [False, True], ids=["dave", "erin"])
def test_the_independent_answers_pass_the_labs_tests(lab, disguise, monkeypatch):
    """Every code cell of the instructor's notebook, hidden tests included, with the answer
    cells replaced, run in one namespace as the notebook runs."""
    mine = student_answers(lab, disguise)
    monkeypatch.chdir(REPO / "solutions" / lab)  # lab02 reads lab01's notebook beside it
    namespace: dict = {}
    for cell in nbformat.read(f"{lab}.ipynb", 4).cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.cell_type == "code" and grade_id not in SLOW_CELLS:
            exec(compile(mine.get(grade_id, cell.source), grade_id, "exec"), namespace)


@pytest.mark.parametrize("disguise", [False, True], ids=["dave", "erin"])
def test_the_independent_collectives_pass_the_labs_checks(disguise, tmp_path):
    """Lab 3's checks of values, traffic, the tree and the ring, on simulated ranks."""
    lab = "lab03_collectives"
    nb = answers.independent(nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", 4), lab)
    if disguise:
        nb = map_answers(nb, answers.disguised)
    nbformat.write(nb, tmp_path / f"{lab}.ipynb")
    names = ("broadcast", "all_gather", "reduce_scatter", "ring_all_reduce")
    mine = definitions(tmp_path / f"{lab}.ipynb", *names)
    c = solution(lab, "check_broadcast", "check_broadcast_tree", "check_all_gather",
                 "check_gather_traffic", "check_gather_ring", "check_reduce_scatter",
                 "check_scatter_traffic", "check_ring", "check_ring_trace", "data")
    for name in names:
        c.check_ring.__globals__[name] = getattr(mine, name)
    for n in range(1, 9):
        c.check_broadcast(n, n // 2, lambda r: c.data(r, 5))
        c.check_broadcast_tree(n, n - 1)
        c.check_all_gather(n, lambda r: c.data(r, 3))
        c.check_gather_traffic(n, 4)
        c.check_gather_ring(n)
        c.check_reduce_scatter(n, 2 * n + 1, op="avg")
        c.check_scatter_traffic(n, 2 * n)
        c.check_ring(n, 3 * n + 1)
        c.check_ring_trace(n, 4 * n)


# -- the commands ---------------------------------------------------------------------------

@pytest.fixture
def one_lab_course(tmp_path):
    """lab01 in a scratch course, its class handed in where nbgrader collects submissions."""
    lab, course = "lab01_cross_entropy", Course(tmp_path / "course")
    for folder in ("solutions", "labs"):
        shutil.copytree(REPO / folder / lab, course.root / folder / lab)
    for student, nb in class_of(course, lab).items():
        path = course.submitted_notebook(lab, student)
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return course, lab


def test_the_command_ranks_the_flagged_pairs(one_lab_course, capsys):
    course, lab = one_lab_course
    assert main(["--root", str(course.root), "similarity", lab]) == 0
    said = capsys.readouterr().out
    lines = [line.split() for line in said.splitlines() if line.startswith("  ")]
    scores = [float(line[0]) for line in lines]
    assert scores == sorted(scores, reverse=True) and min(scores) > THRESHOLD
    pairs = {(line[1], line[2]) for line in lines}
    assert ("dave", "erin") in pairs and ("heidi", "[lib_dist]") in pairs
    assert not [p for p in pairs if "bob" in p or {"dave", "alice"} <= set(p)]
    assert (course.work / "reports" / "similarity" / f"{lab}.html").is_file()


def test_the_report_has_a_section_of_flagged_pairs(one_lab_course, capsys):
    course, lab = one_lab_course
    assert main(["--root", str(course.root), "report"]) == 0
    said = capsys.readouterr().out
    section = said[said.index("Similarity (copydetect)"):]
    assert f"{lab}: " in section
    assert any(line.split()[1:3] == ["dave", "erin"] for line in section.splitlines()
               if line.startswith("  "))
    assert os.path.isfile(course.work / "reports" / "similarity" / f"{lab}.html")
