"""`python -m grader`: the instructor's commands, over nbgrader's Python API.

    release [LAB ...]          labs/ from solutions/ (default: every lab)
    check                      labs/ is current, solutions pass, releases fail
    autograde SUBMISSIONS      grade <student>/<lab>.ipynb or <student>/<lab>/<lab>.ipynb
                               (--own-answers: later labs on the student's earlier answers)
    feedback [LAB ...]         HTML feedback per student, hidden tests hidden
    report                     CSV of scores (student x lab), a figure, flagged similarity
    similarity [LAB ...]       answers nearly another student's or the reference (copydetect)
    demo                       the whole cycle for three synthetic students
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .course import REPO, Course
from .errors import GradingError
from .sandbox import Limits


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limits = Limits(args.memory_mb, args.total_memory_mb, args.processes, args.file_size_mb)
    course = Course(args.root, db_url=args.db, cell_timeout=args.cell_timeout,
                    sandbox=not args.no_sandbox, limits=limits)
    try:
        return args.command(course, args) or 0
    except (GradingError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _release(course: Course, args) -> int:
    from .grading import release

    for lab in release(course, args.labs):
        print(f"released {course.released_notebook(lab).relative_to(course.root)}")
    return 0


def _check(course: Course, args) -> int:
    from .check import check

    problems = check(course)
    for p in problems:
        print(f"check: {p}")
    print("check: all good" if not problems else f"check: {len(problems)} problem(s)")
    return 1 if problems else 0


def _autograde(course: Course, args) -> int:
    from .grading import autograde, find_submissions
    from .pool import default_jobs

    course.own_answers = args.own_answers
    subs, problems = find_submissions(course, args.submissions)
    for p in problems:
        print(f"skipped: {p}", file=sys.stderr)
    outcomes = autograde(course, subs, jobs=args.jobs or default_jobs(course.limits))
    for o in outcomes:
        s = o.submission
        result = f"{o.score:g}/{o.max_score:g}" if o.error == "" else f"FAILED: {o.error}"
        note = f"  ({o.strays} stray processes ended)" if o.strays else ""
        print(f"{s.student:>20} {s.lab:>16}  {result}  {o.seconds:5.1f} s{note}")
    return 1 if problems or any(o.error for o in outcomes) else 0


def _feedback(course: Course, args) -> int:
    from .feedback import generate

    for lab in args.labs or course.lab_names():
        for path in generate(course, lab, args.students):
            print(f"wrote {path.relative_to(course.root)}")
    return 0


def _report(course: Course, args) -> int:
    from .report import format_table, write
    from .similarity import format_flagged, similarity

    print(format_table(course))
    for path in write(course, args.out):
        print(f"wrote {path}")
    out = (args.out or course.work / "reports") / "similarity"
    print("\n" + format_flagged(similarity(course, out=out), out=out))
    return 0


def _similarity(course: Course, args) -> int:
    from .similarity import THRESHOLD, format_flagged, similarity

    threshold = THRESHOLD if args.threshold is None else args.threshold
    out = args.out or course.work / "reports" / "similarity"
    results = similarity(course, args.labs, args.submissions, out, threshold)
    print(format_flagged(results, threshold, out))
    print(f"every pair's scores: {out / 'similarity.csv'}")
    return 0


def _demo(course: Course, args) -> int:
    from .demo import run

    return run(args.out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--root", type=Path, default=REPO, help="course directory (default: the repo)")
    p.add_argument("--db", help="gradebook SQLAlchemy URL (default: instructor/gradebook.db)")
    p.add_argument("--cell-timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run student code WITHOUT isolation, with the instructor's rights")
    d = Limits()
    p.add_argument("--memory-mb", type=int, default=d.memory_mb, help="per process, sandboxed")
    p.add_argument("--total-memory-mb", type=int, default=d.total_memory_mb,
                   help="per submission, sandboxed")
    p.add_argument("--processes", type=int, default=d.processes,
                   help="processes and threads per submission, sandboxed")
    p.add_argument("--file-size-mb", type=int, default=d.file_size_mb, help="per file, sandboxed")
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    c = sub.add_parser("release", help="generate labs/ from solutions/")
    c.add_argument("labs", nargs="*")
    c.set_defaults(command=_release)
    c = sub.add_parser("check", help="labs/ is current; solutions pass; releases fail")
    c.set_defaults(command=_check)
    c = sub.add_parser("autograde", help="grade a folder of submissions")
    c.add_argument("submissions", type=Path)
    c.add_argument("--jobs", type=int, help="submissions graded at once, each in its own "
                   "sandbox (default: one per core, as many as memory holds at "
                   "--total-memory-mb each)")
    c.add_argument("--own-answers", action="store_true",
                   help="a later lab runs lib_dist on the student's own earlier answers where "
                   "it uses them (lib_dist.extend.LABS' uses: lab04 and lab07 on lab03's "
                   "ring_all_reduce), from the submitted/ folder; default: the reference, so "
                   "that one wrong lab does not cost points twice")
    c.set_defaults(command=_autograde)
    c = sub.add_parser("feedback", help="HTML feedback per student")
    c.add_argument("labs", nargs="*")
    c.add_argument("--student", dest="students", action="append")
    c.set_defaults(command=_feedback)
    c = sub.add_parser("report", help="CSV and figure of the scores")
    c.add_argument("--out", type=Path)
    c.set_defaults(command=_report)
    c = sub.add_parser("similarity", help="answers nearly the same as another student's or "
                       "the reference, ranked, with a page per lab (copydetect)")
    c.add_argument("labs", nargs="*")
    c.add_argument("--submissions", type=Path, help="<student>/<lab>.ipynb or nbgrader's "
                   "layout (default: instructor/submitted)")
    c.add_argument("--threshold", type=float,
                   help="flag pairs scoring above this (default: grader.similarity.THRESHOLD)")
    c.add_argument("--out", type=Path, help="default: instructor/reports/similarity")
    c.set_defaults(command=_similarity)
    c = sub.add_parser("demo", help="release, grade three synthetic students, report")
    c.add_argument("--out", type=Path, default=Path("build/grader-demo"))
    c.set_defaults(command=_demo)
    return p
