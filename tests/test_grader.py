"""End-to-end grading of lab00 on real engines: every fixture submission's score, exactly.

One module-scoped run releases lab00 into a scratch course and autogrades every fixture
submission through the grader, as `python -m grader autograde` does; the tests read its
gradebook. Each fixture is the instructor's solution with one cell changed.
"""

from __future__ import annotations

import html
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest

from conftest import course_with_lab, running, wait_until_empty
from grader import synthetic
from grader.check import check
from grader.cli import main as cli
from grader.course import REPO, Course
from grader.demo import TYPICAL_BUGS
from grader.feedback import generate
from grader.grading import autograde, cell_scores, find_submissions
from grader.redact import HIDDEN
from grader.report import score_table, write

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB = "lab00_ranks"
FULL = {"q1-test": 1, "q2-test-cluster": 1, "q2-test-sizes": 1, "q3-test-cluster": 2,
        "q3-test-trace": 2, "q4-test-cluster": 2, "q4-test-sizes": 2, "q5-test-cluster": 1,
        "q5-test-float64": 1}
ZERO = dict.fromkeys(FULL, 0)


def answer(body: str) -> str:
    return body.strip() + "\n"


EXIT_ON_ENGINE = answer("""
import os
def square_of_rank(comm):
    if comm.rank == 2:
        os._exit(1)
    return comm.rank ** 2
""")
RAISE_ON_ONE_RANK = answer("""
def sum_over_ranks(comm, value):
    if comm.rank == 1:
        raise RuntimeError("rank 1 lost its value")
    t = torch.tensor([float(value)], dtype=torch.float64)
    comm.all_reduce(t)
    return t.item()
""")
RECV_THAT_NEVER_COMES = answer("""
def swap_with_partner(comm, t):
    received = torch.empty_like(t)
    if comm.rank == 0:
        comm.recv(received, 1)  # rank 1 never sends: rank 0 waits forever
        return received
    return t.clone()
""")
NOISY_MEAN = answer("""
import sys
def mean_over_ranks(comm, t):
    print(f"rank {comm.rank}: averaging {t.numel()} values", file=sys.stderr)
    return comm.all_reduce(t, op="avg")
""")
NOISY_WRONG_MEAN = answer("""
import sys
def mean_over_ranks(comm, t):
    print(f"rank {comm.rank}: summing instead", file=sys.stderr)
    return comm.all_reduce(t, op="sum")
""")
ENDLESS = answer("""
def square_of_rank(comm):
    while True:
        pass
""")
DETACHED_SLEEPER = answer("""
import subprocess
def square_of_rank(comm):
    if comm.rank == 0:  # on an engine, and in the judge on the hidden test's simulated ranks
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
    return comm.rank ** 2
""")


def moved_to_end(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(nb)
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells.append(nb.cells.pop(at))
    return nb


def fixtures(course: Course) -> dict[str, tuple[nbformat.NotebookNode, dict[str, int]]]:
    """student -> (submission, expected score of each test cell)."""
    solved = synthetic.solved(course, LAB)
    cell = synthetic.with_cell
    return {
        "full": (solved, FULL),
        "blank": (synthetic.blank(course, LAB), ZERO),
        "buggy": (cell(solved, *TYPICAL_BUGS[LAB]),
                  FULL | {"q3-test-cluster": 0, "q3-test-trace": 0}),
        "endless": (cell(solved, "q1-solution", ENDLESS), FULL | {"q1-test": 0}),
        "deadlock": (cell(solved, "q4-solution", RECV_THAT_NEVER_COMES),
                     FULL | {"q4-test-cluster": 0, "q4-test-sizes": 0}),
        "engine_exit": (cell(solved, "q1-solution", EXIT_ON_ENGINE), FULL | {"q1-test": 0}),
        # the top level never runs (the judge loads answers only): q3 is just unanswered
        "kernel_exit": (cell(solved, "q3-solution", "import os\nos._exit(1)\n"),
                        FULL | {"q3-test-cluster": 0, "q3-test-trace": 0}),
        "one_rank_raises": (cell(solved, "q2-solution", RAISE_ON_ONE_RANK),
                            FULL | {"q2-test-cluster": 0, "q2-test-sizes": 0}),
        "edited_test": (cell(cell(solved, "q1-solution",
                                  "def square_of_rank(comm):\n    return comm.rank\n"),
                             "q1-test", "assert True  # trust me\n"), FULL | {"q1-test": 0}),
        # the last test cell deleted and another moved to the end: graded as shipped
        "deleted_test": (moved_to_end(synthetic.without_cell(solved, "q5-test-float64"),
                                      "q2-test-sizes"), FULL),
        "stderr": (cell(solved, "q5-solution", NOISY_MEAN), FULL),
        "stderr_wrong": (cell(solved, "q5-solution", NOISY_WRONG_MEAN),
                         FULL | {"q5-test-cluster": 0, "q5-test-float64": 0}),
        "detached": (cell(solved, "q1-solution", DETACHED_SLEEPER), FULL),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    course = course_with_lab(root, LAB, cell_timeout=20)
    cases = fixtures(course)
    folder = root / "incoming"
    for student, (nb, _) in cases.items():
        synthetic.save(nb, folder, student, LAB)
    subs, problems = find_submissions(course, folder)
    assert problems == []
    # two at a time, as `python -m grader autograde` does on a 2-core machine
    outcomes = {o.submission.student: o for o in autograde(course, subs, progress=False, jobs=2)}
    return course, cases, outcomes


STUDENTS = ["full", "blank", "buggy", "endless", "deadlock", "engine_exit", "kernel_exit",
            "one_rank_raises", "edited_test", "deleted_test", "stderr", "stderr_wrong",
            "detached"]


@pytest.mark.parametrize("student", STUDENTS)
def test_each_submission_scores_exactly(graded, student):
    course, cases, outcomes = graded
    outcome = outcomes[student]
    assert outcome.error == "", outcome.error
    expected = cases[student][1]
    assert cell_scores(course, LAB, student) == pytest.approx(expected)
    assert outcome.score == sum(expected.values())
    assert outcome.max_score == sum(FULL.values())


def outputs(course: Course, student: str) -> dict[str, str]:
    nb = nbformat.read(course.autograded_notebook(LAB, student), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        f"{o.get('ename', '')}: {o.get('evalue', '')}" if o.output_type == "error"
        else o.get("text", "") for o in c.get("outputs", []))
        for c in nb.cells if c.cell_type == "code" and "nbgrader" in c.metadata}


def test_submissions_were_graded_two_at_a_time(graded):
    events = sorted(e for o in graded[2].values()
                    for e in ((o.started, 1), (o.started + o.seconds, -1)))
    in_flight = [sum(change for _, change in events[:i + 1]) for i in range(len(events))]
    assert max(in_flight) == 2, events
    busy = sum(b[0] - a[0] for a, b, n in zip(events, events[1:], in_flight) if n == 2)
    assert busy > 0.5 * sum(b[0] - a[0] for a, b, n in zip(events, events[1:], in_flight) if n)


def test_failures_are_explained_where_they_happened(graded):
    course = graded[0]
    assert "did not finish within 10 s" in outputs(course, "deadlock")["q4-test-cluster"]
    assert "rank 0: waiting in recv from rank 1" in outputs(course, "deadlock")["q4-test-cluster"]
    assert "rank 2 failed" in outputs(course, "engine_exit")["q1-test"]
    assert "RankFailure: rank 1 failed" in outputs(course, "one_rank_raises")["q2-test-cluster"]
    endless = outputs(course, "endless")["q1-test"]  # an answer that never returns
    assert "did not finish within 10 s" in endless and "running Python code" in endless
    died = outputs(course, "kernel_exit")  # its os._exit is top-level code: never run
    assert "shift_right could not be loaded" in died["setup"]
    assert "NameError: name 'shift_right' is not defined" in died["q3-test-cluster"]


def test_a_passing_test_keeps_its_stderr_visible_but_unscored(graded):
    course = graded[0]
    assert "rank 0: averaging" in outputs(course, "stderr")["q5-test-float64"]


def test_an_edited_or_deleted_test_is_graded_as_shipped(graded):
    course = graded[0]
    nb = nbformat.read(course.autograded_notebook(LAB, "edited_test"), as_version=4)
    q1 = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q1-test")
    assert "trust me" not in q1.source
    restored = nbformat.read(course.autograded_notebook(LAB, "deleted_test"), as_version=4)
    assert "q5-test-float64" in {c.metadata.get("nbgrader", {}).get("grade_id")
                                 for c in restored.cells}


def started_before(process: psutil.Process, when: float) -> bool:
    try:
        return process.create_time() <= when
    except psutil.NoSuchProcess:
        return False


def described(process: psutil.Process) -> str:
    try:
        return f"{process.pid}: {' '.join(process.cmdline())}"
    except psutil.NoSuchProcess:
        return f"{process.pid}: (gone)"


def test_no_process_outlives_its_submission(graded):
    outcomes = graded[2]
    assert all(o.strays == 0 for o in outcomes.values())  # the sandbox ended them all
    # Tests on the other xdist worker start engines too, and some of theirs outlive their
    # parent for a moment (a killed kernel's engines until the reaper ends them, Slurm's
    # engines): a stray of these gradings was started before the last of them ended, and stays.
    ended = max(o.started + o.seconds for o in outcomes.values())
    leftovers = wait_until_empty(lambda: [p for p in running(lambda cmdline: any(
        k in " ".join(cmdline) for k in ("forked_engines", "ipyparallel", "sleep 1000")))
        if started_before(p, ended)], within=30)
    assert leftovers == []
    # (earlier tests in this worker may have left helpers of their own, such as
    # multiprocessing's resource tracker, which lives as long as the worker)
    began = min(o.started for o in outcomes.values())
    left = [described(p) for p in psutil.Process().children(recursive=True)
            if p.is_running() and not started_before(p, began)]
    assert left == []


def test_feedback_shows_scores_but_not_hidden_tests(graded):
    course = graded[0]
    source = nbformat.read(course.source_notebook(LAB), as_version=4)
    released = nbformat.read(course.released_notebook(LAB), as_version=4)
    shown = {line.strip() for c in released.cells for line in c.source.splitlines()}
    # lines only the hidden tests have (a loop header they share with a visible test is no secret)
    hidden = [line.strip() for c in source.cells for m in HIDDEN.finditer(c.source)
              for line in m.group(0).splitlines()
              if len(line.strip()) > 20 and "###" not in line and line.strip() not in shown]
    assert len(hidden) > 10
    autograded = course.autograded_notebook(LAB, "buggy").read_text()
    assert any(line in autograded for line in hidden)  # the grader did run them
    (page,) = generate(course, LAB, ["buggy"])
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert [line for line in hidden if line in text] == []
    assert "hidden tests ran here" in text
    assert "Score: 9.0" in text or "9.0 / 13.0" in text or "9 / 13" in text


def test_report_has_every_student_and_a_figure(graded, tmp_path):
    course, cases, _ = graded
    labs, table = score_table(course)
    assert labs == [LAB]
    for student, (_, expected) in cases.items():
        assert table[student][LAB] == sum(expected.values())
    csv_path, png_path = write(course, tmp_path)
    rows = csv_path.read_text().splitlines()
    assert rows[0] == f"student,{LAB}" and "buggy,9" in rows
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def gradebook_rows(course: Course) -> list:
    path = course.db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        return db.execute("select * from grade order by id").fetchall()


def test_bad_input_is_named_and_loses_nothing(graded, tmp_path, capsys):
    course = graded[0]
    before = gradebook_rows(course)
    folder = tmp_path / "bad"
    (folder / "mallory").mkdir(parents=True)
    (folder / "mallory" / f"{LAB}.ipynb").write_text('{"cells": [')
    (folder / "trudy").mkdir()
    shutil.copy(course.released_notebook(LAB), folder / "trudy" / "lab99.ipynb")
    code = cli(["--root", str(course.root), "autograde", str(folder)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"mallory/{LAB}.ipynb: not a valid notebook" in err
    assert "trudy/lab99.ipynb: no lab named 'lab99'" in err
    assert gradebook_rows(course) == before
    assert cli(["--root", str(course.root), "release", "lab99"]) == 2
    assert "unknown lab 'lab99'" in capsys.readouterr().err
    assert cli(["--root", str(course.root), "autograde", str(tmp_path / "nowhere")]) == 2
    assert "no folder of submissions" in capsys.readouterr().err


def test_kernels_write_their_own_stderr_to_a_log_not_the_terminal(tmp_path, capfd):
    """The judge's process's, for a lab graded by it: what an answer writes to fd 2 as the
    tests call it (a student's top-level code never runs there)."""
    lab = "lab01_cross_entropy"  # no cluster: quick
    course = course_with_lab(tmp_path / "course", lab)
    loud = synthetic.with_cell(synthetic.blank(course, lab), "q1-solution", answer("""
import os
def log_softmax(logits, dim=-1):
    os.write(2, b'written to fd 2 by the kernel\\n')
    return logits
"""))
    synthetic.save(loud, tmp_path / "incoming", "ada", lab)
    subs, _ = find_submissions(course, tmp_path / "incoming")
    autograde(course, subs, progress=False)
    log = course.work / "logs" / f"ada-{lab}.log"
    assert "written to fd 2 by the kernel" in log.read_text()
    assert "written to fd 2" not in capfd.readouterr().err


def test_autograde_before_release_releases_first(tmp_path, capsys):
    lab = "lab01_cross_entropy"  # no cluster: quick
    course = Course(tmp_path / "course")
    shutil.copytree(REPO / "solutions" / lab, course.solutions / lab)
    blank = nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
    synthetic.save(blank, tmp_path / "incoming", "ada", lab)
    assert cli(["--root", str(course.root), "autograde", str(tmp_path / "incoming")]) == 0
    out = capsys.readouterr().out
    assert f"[grader] {lab} is not in the gradebook yet: releasing it from solutions/ first" in out
    assert re.search(rf"ada\s+{lab}\s+0/\d+\s", out), out  # graded, not FAILED


CHECKED = ("lab00_ranks", "lab02_training")  # the others' solutions and blank releases are
# graded by their tests/test_integrity*.py; `grader check` grades every lab


def test_check_passes_on_the_repository_and_catches_a_stale_release(tmp_path):
    course = Course(tmp_path)
    for lab in CHECKED:
        shutil.copytree(REPO / "solutions" / lab, course.solutions / lab)
        shutil.copytree(REPO / "labs" / lab, course.labs / lab)
    assert check(course, progress=False) == []
    for lab in set(CHECKED) - {LAB}:  # graded once is enough: the rest checks lab00's release
        shutil.rmtree(course.solutions / lab)
        shutil.rmtree(course.labs / lab)
    stale = course.released_notebook(LAB)
    nb = nbformat.read(stale, as_version=4)
    nb.cells[0].source += "\nedited by hand"
    nbformat.write(nb, stale)
    (course.labs / "lab42").mkdir()
    problems = check(course, progress=False)
    assert f"labs/{LAB}/{LAB}.ipynb differs from its release: run `python -m grader release " \
           f"{LAB}`" in problems
    assert "labs/lab42 has no source in solutions/" in problems


def test_the_cli_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "grader", "--help"], capture_output=True,
                         text=True, check=True)
    for command in ("release", "check", "autograde", "feedback", "report", "demo"):
        assert command in out.stdout


def test_plain_nbgrader_reads_the_course_config(tmp_path):
    env = {**__import__("os").environ, "JUPYTER_CONFIG_PATH": str(REPO / "grader"),
           "LIB_DIST_GRADEBOOK": f"sqlite:///{tmp_path}/gradebook.db",
           "PATH": f"{Path(sys.executable).parent}:{__import__('os').environ['PATH']}"}
    out = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "db", "student", "add",
                          "ada", "--last-name", "Lovelace"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(tmp_path / "gradebook.db") as db:
        assert db.execute("select id, last_name from student").fetchall() == [("ada", "Lovelace")]
