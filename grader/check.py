"""`check`: the repository's labs are what releasing its solutions produces, every solution
scores full marks, and every released lab scores zero, so each test can fail."""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

import nbformat

from .course import Course
from .grading import Submission, autograde, cell_scores, release
from .pool import default_jobs


def check(course: Course, progress: bool = True) -> list[str]:
    """Return every problem found (an empty list: all good). Works in a scratch copy."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="lib_dist-check-") as tmp:
        scratch = Course(Path(tmp), db_url=f"sqlite:///{tmp}/gradebook.db",
                         cell_timeout=course.cell_timeout)
        shutil.copytree(course.solutions, scratch.solutions)
        labs = release(scratch, lectures=False)
        problems += _compare_releases(course, scratch, labs)
        subs = [Submission("solution", lab, course.source_notebook(lab)) for lab in labs]
        subs += [Submission("release", lab, scratch.released_notebook(lab)) for lab in labs]
        for outcome in autograde(scratch, subs, progress=progress,
                                 jobs=default_jobs(scratch.limits)):
            sub = outcome.submission
            if outcome.error:
                problems.append(f"{sub.lab}: grading the {sub.student} failed: {outcome.error}")
                continue
            graded = cell_scores(scratch, sub.lab, sub.student)
            maxima = _max_points(course.source_notebook(sub.lab))
            if sub.student == "solution":
                problems += [f"{sub.lab}: the solution scores {graded.get(g, 0):g}/{m:g} on {g}"
                             for g, m in maxima.items() if graded.get(g) != m]
            else:
                problems += [f"{sub.lab}: the blank release scores {graded[g]:g} on {g}: "
                             f"that test cannot fail" for g in maxima if graded.get(g, 0) > 0]
    return problems


def _compare_releases(course: Course, scratch: Course, labs: list[str]) -> list[str]:
    problems = []
    for lab in labs:
        ours, fresh = course.labs / lab, scratch.labs / lab
        if not ours.is_dir():
            problems.append(f"labs/{lab} is missing: run `python -m grader release {lab}`")
            continue
        mine = {p.relative_to(ours) for p in ours.rglob("*") if p.is_file()}
        theirs = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
        for rel in sorted(mine ^ theirs):
            problems.append(f"labs/{lab}/{rel} {'should not exist' if rel in mine else 'is missing'}")
        for rel in sorted(mine & theirs):
            if not _same(ours / rel, fresh / rel):
                problems.append(f"labs/{lab}/{rel} differs from its release: run "
                                f"`python -m grader release {lab}`")
    extra = ({p.name for p in course.labs.iterdir() if p.is_dir()} - set(labs)
             - {course.student_edition.name, course.lecture_edition.name})  # release's, not git's
    problems += [f"labs/{name} has no source in solutions/" for name in sorted(extra)]
    return problems


def _same(a: Path, b: Path) -> bool:
    if a.suffix == ".ipynb":
        return nbformat.read(a, as_version=4) == nbformat.read(b, as_version=4)
    return filecmp.cmp(a, b, shallow=False)


def _max_points(source: Path) -> dict[str, float]:
    """grade_id -> points of every autograded test cell."""
    nb = nbformat.read(source, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")
            and not c.metadata["nbgrader"].get("solution")}
