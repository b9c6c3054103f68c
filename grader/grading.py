"""Release labs and autograde submissions through nbgrader's Python API."""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning
from tqdm import tqdm

from .course import Course
from .edition import student_edition
from .lectures import lecture_edition
from .errors import GradingError
from .pool import grade_at_once
from .joining import zygote, zygote_for_this_run
from .processes import become_subreaper, descendants, sweep
from .sandbox import unavailable
from .submission import Outcome, Submission
from .tuner_cache import prepare as prepare_tuner_cache

# nbgrader 0.9's gradebook trips SQLAlchemy 2's autoflush warnings on every submission.
warnings.filterwarnings("ignore", category=SAWarning)


def release(course: Course, labs: list[str] | None = None, lectures: bool = True) -> list[str]:
    """Generate labs/<lab>/ from solutions/<lab>/ for each lab (default: all), and the
    editions of lib_dist students get (`lectures=False`: only the student edition)."""
    labs = labs or course.lab_names()
    for lab in labs:
        course.check_lab(lab)
        _check_notebook(course.source_notebook(lab))
    for lab in labs:
        result = course.api().generate_assignment(lab, force=True, create=True)
        if not result["success"]:
            raise GradingError(f"nbgrader could not release {lab}:\n{result.get('error', '')}"
                               f"\n{result.get('log', '')}")
    student_edition(course.student_edition)  # lib_dist without the answers, for students
    if lectures:
        lecture_edition(course.lecture_edition)  # the answers compiled, for lectures
    return labs


def find_submissions(course: Course, folder: Path) -> tuple[list[Submission], list[str]]:
    """Submissions in nbgrader's layout (<student>/<lab>/<lab>.ipynb) or a flat one
    (<student>/<lab>.ipynb). Returns them, and one message per file that cannot be graded."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingError(f"no folder of submissions at {folder}")
    labs = set(course.lab_names())
    found, problems = [], []
    for path in sorted(folder.glob("*/*.ipynb")) + sorted(folder.glob("*/*/*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        student = path.relative_to(folder).parts[0]
        if path.stem not in labs:
            problems.append(f"{path}: no lab named {path.stem!r} (labs: {', '.join(sorted(labs))})")
            continue
        try:
            _check_notebook(path)
        except GradingError as e:
            problems.append(str(e))
            continue
        found.append(Submission(student, path.stem, path))
    if not found and not problems:
        raise GradingError(f"no notebooks in {folder}: expected <student>/<lab>.ipynb or "
                           f"<student>/<lab>/<lab>.ipynb")
    return found, problems


def autograde(course: Course, submissions: list[Submission], progress: bool = True,
              jobs: int = 1) -> list[Outcome]:
    """Grade each submission, `jobs` at a time (`grader.pool`); whatever one does, the next
    starts clean."""
    if course.sandbox and (problem := unavailable()):
        raise GradingError(f"cannot isolate submissions: {problem}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1 (submissions graded at once), not {jobs}")
    with zygote_for_this_run(course.sandbox and course.judged):
        return _autograde(course, submissions, progress, jobs)


def _autograde(course: Course, submissions: list[Submission], progress: bool,
               jobs: int) -> list[Outcome]:
    compile_library()
    # the tuner's calibration: measured once here, outside the sandbox, not in every submission
    prepare_tuner_cache([course.source_notebook(lab) for lab in {s.lab for s in submissions}])
    for lab in unreleased(course, sorted({sub.lab for sub in submissions})):
        if progress:
            print(f"[grader] {lab} is not in the gradebook yet: releasing it from solutions/ "
                  f"first (python -m grader release {lab})")
        release(course, [lab], lectures=False)
    bar = tqdm(total=len(submissions), desc="autograde", unit="submission",
               disable=not progress)
    with bar:
        if jobs > 1 and len(submissions) > 1:
            return grade_at_once(course, submissions, jobs, grade_one,
                                 lambda sub: bar.update())
        become_subreaper()
        outcomes = []
        for sub in submissions:
            bar.set_postfix_str(f"{sub.student}/{sub.lab}")
            outcomes.append(grade_one(course, sub))
            bar.update()
        return outcomes


def compile_library() -> None:
    """lib_dist's bytecode, written here once: a sandboxed kernel sees the library read-only
    and cannot keep what it compiles (nor can any Python run with PYTHONDONTWRITEBYTECODE),
    so each kernel and engine host would compile the modules it imports again (~0.2 s)."""
    import compileall

    import lib_dist

    compileall.compile_dir(Path(lib_dist.__file__).parent, quiet=2)  # where it may write


def grade_one(course: Course, sub: Submission) -> Outcome:
    """Grade one submission with nbgrader, then end whatever it left running."""
    if course.sandbox and course.judged:
        zygote()  # started, if not already, before what the submission may leave is noted
    started, start, before = time.time(), time.monotonic(), descendants()
    target = course.submitted_notebook(sub.lab, sub.student)
    if sub.path.resolve() != target.resolve():  # else it is there already: `nbgrader collect`
        if target.parent.exists():
            shutil.rmtree(target.parent)
        target.parent.mkdir(parents=True)
        shutil.copyfile(sub.path, target)
        stamp = sub.path.parent / "timestamp.txt"  # nbgrader's: feedback is released by it
        if stamp.is_file():
            shutil.copyfile(stamp, target.parent / stamp.name)
    result = course.api().autograde(sub.lab, sub.student, force=True, create=True)
    strays = sweep(before)
    error = "" if result["success"] else (result.get("error") or result.get("log") or "failed")
    score, max_score = scores(course, sub.lab, sub.student) if result["success"] else (None, None)
    return Outcome(sub, score, max_score, time.monotonic() - start, len(strays), error, started)


def unreleased(course: Course, labs: list[str]) -> list[str]:
    """The labs nbgrader cannot grade yet: never released into this course's gradebook."""
    if not labs:
        return []
    course.api()  # makes the instructor folder, where a new gradebook goes
    with Gradebook(course.db_url, course.course_id) as gb:
        known = {a.name for a in gb.assignments}
    return [lab for lab in labs if lab not in known]


def scores(course: Course, lab: str, student: str) -> tuple[float, float]:
    with Gradebook(course.db_url, course.course_id) as gb:
        submission = gb.find_submission(lab, student)
        return submission.score, submission.max_score


def cell_scores(course: Course, lab: str, student: str) -> dict[str, float]:
    """grade_id -> score of every graded cell of the student's submission."""
    with Gradebook(course.db_url, course.course_id) as gb:
        try:
            notebook = gb.find_submission_notebook(lab, lab, student)
        except MissingEntry:
            return {}
        return {g.name: g.score for g in notebook.grades}


def _check_notebook(path: Path) -> None:
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001 - JSON, schema or encoding: all the same to a user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GradingError(f"{path}: not a valid notebook ({first}); fix or replace the file "
                           f"and grade it again") from None
