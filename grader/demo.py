"""`make demo`: a whole grading cycle in a scratch course directory, on real engine clusters.

Releases every lab, submits it for three synthetic students (alice: the solution, bob: the
untouched release, carol: a typical bug), autogrades all of them on local engines, prints the
gradebook and the similarity report's flagged pairs, and writes the report (CSV and figure) and
carol's feedback.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from . import report, synthetic
from .course import REPO, Course
from .feedback import generate
from .grading import autograde, find_submissions, release
from .pool import default_jobs
from .similarity import format_flagged, similarity
from .typical_bugs import TYPICAL_BUGS


def with_typical_bug(course: Course, lab: str):
    """The solution with one typical bug; for a lab without one, its last answer left blank."""
    solved = synthetic.solved(course, lab)
    if lab in TYPICAL_BUGS:
        return synthetic.with_cell(solved, *TYPICAL_BUGS[lab])
    blank = synthetic.blank(course, lab)
    last = [c for c in blank.cells if c.metadata.get("nbgrader", {}).get("solution")][-1]
    return synthetic.with_cell(solved, last.metadata["nbgrader"]["grade_id"], last.source)


def run(out: Path) -> int:
    out = Path(out).resolve()
    if out.exists():
        shutil.rmtree(out)
    course = Course(out / "course")
    shutil.copytree(REPO / "solutions", course.solutions)
    start = time.monotonic()
    labs = release(course)
    print(f"released {', '.join(labs)} into {course.labs}")

    folder = out / "submissions"
    for lab in labs:
        synthetic.save(synthetic.solved(course, lab), folder, "alice", lab)
        synthetic.save(synthetic.blank(course, lab), folder, "bob", lab)
        synthetic.save(with_typical_bug(course, lab), folder, "carol", lab)
    subs, problems = find_submissions(course, folder)
    assert not problems, problems
    jobs = default_jobs(course.limits)
    grading = time.monotonic()
    outcomes = autograde(course, subs, jobs=jobs)
    grading = time.monotonic() - grading
    for o in outcomes:
        if o.error:
            print(f"grading {o.submission.student}/{o.submission.lab} failed:\n{o.error}")
            return 1

    print(f"\nGradebook ({course.db_url}):")
    print(report.format_table(course))
    pages = course.work / "reports" / "similarity"
    print("\n" + format_flagged(similarity(course, out=pages), out=pages))
    csv_path, png_path = report.write(course)
    feedback = [p for lab in labs for p in generate(course, lab, ["carol"])]
    print(f"\n{len(outcomes)} submissions graded in {grading:.1f} s, {jobs} at a time "
          f"({grading / len(outcomes):.1f} s each); whole demo {time.monotonic() - start:.1f} s")
    print(f"report:   {csv_path}\n          {png_path}")
    for path in feedback:
        print(f"feedback: {path}")
    return 0
