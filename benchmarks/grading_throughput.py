"""Autograding throughput: seconds per lab00 submission (4 engines), and a class's grading time.

Grades N synthetic full-marks submissions of lab00 through the grader in the sandbox, one at a
time (by the judge, and by running the notebook in a kernel as the grader did before the judge:
the judge's cost is its ratio to that) and then as `python -m grader autograde` does by default
(`grader.pool.default_jobs` at once), then the same N one at a time without the sandbox, then the same lab with the engine
cluster swapped for a SimulatedWorld of 4 threads (same tests, no processes), all in the same
process. Prints seconds per submission for each (wall time of the run over N: with several at
once, the class's throughput; one submission's own seconds are longer), the price of the
sandbox, of real engines and the gain of grading at once as ratios, and whether the time per
submission stays flat as the class grows.

Then grades 4 copies of the solution of every lab in solutions/ (`--per-lab`), in the
sandbox, the default number at once, `--rounds` times (each lab's median is taken), and
projects a class of 30 students x every lab: 30 times the sum of those seconds per submission,
plus what is paid once: the all-reduce tuner's calibration on a new machine
(`grader.tuner_cache`; this benchmark starts from an empty cache and times it first), the
grader's own preparation per grading run (the tuner's check and the start of the zygote the
judges are forked from, `grader.joining`: this benchmark starts one and keeps it), and each lab's judged edition of lib_dist
(`grader.edition`, built once per lab and kept: timed apart, before its lab is graded).
The capstone (lab11), with 8 engines and whole training runs, grades longer than any other
lab: the projection says its share.

`--kernel-too` grades every lab the same way in a kernel as well (the grader before the judge)
and projects the class for it too, in the same run: the judge's cost over the whole course.

    python benchmarks/grading_throughput.py [--students 6] [--per-lab 4] [--rounds 1]
                                            [--kernel-too] [--class-size 30] [--jobs J]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import nbformat

from grader import synthetic
from grader.course import REPO, Course
from grader.edition import judged_edition
from grader.grading import Outcome, autograde, find_submissions, release
from grader.joining import zygote
from grader.pool import default_jobs
from grader.sandbox import Limits
from grader.tuner_cache import prepare
from lib_dist.comm.fast.calibration import CACHE_ENV

LAB = "lab00_ranks"
CAPSTONE = "lab11_capstone"  # the longest to grade, named in the projection
THREADS_INSTEAD_OF_ENGINES = '''
from lib_dist.comm import SimulatedWorld


class ThreadCluster:
    """Cluster's run/trace/stop on a SimulatedWorld: the lab without engine processes."""

    def __init__(self, n, timeout=30):
        self.world = SimulatedWorld(n, timeout=timeout)

    def start(self):
        return self

    def run(self, fn, *args, timeout=None, **kwargs):
        return self.world.run(fn, *args, **kwargs)

    @property
    def trace(self):
        return self.world.trace

    def stop(self):
        pass


cluster = ThreadCluster(4, timeout=30).start()
'''


def seconds_per_submission(root: Path, lab: str, students: int, engines: bool = True,
                           sandbox: bool = True, jobs: int = 1, judged: bool = True,
                           paid_once: dict[str, float] | None = None) -> list[Outcome]:
    """Grade `students` copies of `lab`'s solution in a scratch course; their outcomes, each
    full marks (else it raises, saying where). The lab's judged edition is built first, as a
    course's first grading run builds it once for every later one; `paid_once[lab]` gets its
    seconds."""
    course = Course(root, sandbox=sandbox, judged=judged)
    shutil.copytree(REPO / "solutions" / lab, course.solutions / lab)
    if not engines:
        source = course.source_notebook(lab)
        nb = nbformat.read(source, as_version=4)
        setup = next(c for c in nb.cells if c.metadata["nbgrader"]["grade_id"] == "setup")
        engines_line = "cluster = Cluster(4, timeout=30).start()"
        assert engines_line in setup.source, setup.source  # the rest (fresh_seed...) stays
        setup.source = setup.source.replace(engines_line, THREADS_INSTEAD_OF_ENGINES)
        nbformat.write(nb, source)
    release(course, [lab])
    if judged:  # the kernel has no use for it
        start = time.monotonic()
        judged_edition(course.work / "editions", lab)  # where GradedExecute finds it
        if paid_once is not None:
            paid_once[lab] = time.monotonic() - start
    folder = root / "incoming"
    for i in range(students):
        synthetic.save(synthetic.solved(course, lab), folder, f"student{i:02d}", lab)
    subs, _ = find_submissions(course, folder)
    outcomes = autograde(course, subs, progress=False, jobs=jobs)
    for outcome in outcomes:  # each must score full marks, or the timing means nothing
        if outcome.score != outcome.max_score:
            raise AssertionError(f"{lab} ({options_said(engines, sandbox, jobs, judged)}): "
                                 f"{outcome.submission.student} scored {outcome.score} of "
                                 f"{outcome.max_score} {outcome.error}\n"
                                 + failures(course.autograded_notebook(
                                     lab, outcome.submission.student)))
    return outcomes


def options_said(engines: bool, sandbox: bool, jobs: int, judged: bool) -> str:
    return (f"{'engines' if engines else 'threads'}, {'' if sandbox else 'no '}sandbox, "
            f"{jobs} at once, {'judge' if judged else 'kernel'}")


def failures(notebook: Path) -> str:
    """The cells of an autograded notebook that ended with an error, and the error."""
    if not notebook.is_file():
        return f"(no {notebook})"
    nb = nbformat.read(notebook, as_version=4)
    return "\n".join(f"  {cell.metadata.get('nbgrader', {}).get('grade_id')}: "
                     f"{out.get('ename')}: {str(out.get('evalue'))[:500]}"
                     for cell in nb.cells for out in cell.get("outputs", [])
                     if out.get("output_type") == "error")


def in_scratch(lab: str, students: int, **options) -> list[Outcome]:
    with tempfile.TemporaryDirectory() as tmp:
        return seconds_per_submission(Path(tmp), lab, students, **options)


def wall_per_submission(outcomes: list[Outcome]) -> float:
    """From the first one's start to the last one's end, over their number."""
    start = min(o.started for o in outcomes)
    return (max(o.started + o.seconds for o in outcomes) - start) / len(outcomes)


def labs() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "solutions").glob("*/*.ipynb")
                  if p.stem == p.parent.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--per-lab", type=int, default=4, help="submissions of each lab")
    parser.add_argument("--rounds", type=int, default=1, help="of every lab (medians)")
    parser.add_argument("--kernel-too", action="store_true",
                        help="every lab graded in a kernel too, and its class projected")
    parser.add_argument("--class-size", type=int, default=30)
    parser.add_argument("--jobs", type=int, help="at once (default: the grader's default)")
    args = parser.parse_args()
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="lib_dist-bench-tuner-")  # a new machine
    start = time.monotonic()
    prepare([REPO / "solutions" / lab / f"{lab}.ipynb" for lab in labs()])
    calibration = time.monotonic() - start
    start = time.monotonic()
    prepare([REPO / "solutions" / LAB / f"{LAB}.ipynb"])  # what each grading run pays
    per_run = time.monotonic() - start
    start = time.monotonic()
    forker = zygote()  # what each grading run starts once (`grader.joining`); kept from here on
    if forker is None or not forker.ready(120):
        raise SystemExit("the grader's zygote did not start")
    per_run += time.monotonic() - start

    jobs = args.jobs or default_jobs(Limits())
    runs = {name: in_scratch(LAB, args.students, **options)
            for name, options in (("sandbox", {}), ("kernel", {"judged": False}),
                                  ("at once", {"jobs": jobs}),
                                  ("no sandbox", {"sandbox": False}),
                                  ("threads", {"engines": False, "sandbox": False}))}
    each = {name: wall_per_submission(outcomes) for name, outcomes in runs.items()}
    print(f"submissions per run: {args.students}")
    print(f"4 engines in the sandbox:   {each['sandbox']:5.2f} s per submission, one at a time")
    print(f"  {jobs} at a time:             {each['at once']:5.2f} s per submission (each took "
          f"{statistics.median(o.seconds for o in runs['at once']):.2f} s, median)")
    print(f"the notebook in a kernel:   {each['kernel']:5.2f} s per submission, one at a "
          f"time, in the sandbox (the grader before the judge: its verdicts came from the "
          f"student's own process)")
    print(f"judge / kernel:             {each['sandbox'] / each['kernel']:.2f} (goal: at most "
          f"1.25)")
    print(f"4 engines, no sandbox:      {each['no sandbox']:5.2f} s")
    print(f"threads instead of engines: {each['threads']:5.2f} s (no sandbox)")
    print(f"sandbox / no sandbox:       {each['sandbox'] / each['no sandbox']:.2f}")
    print(f"engines / threads:          {each['no sandbox'] / each['threads']:.2f}")
    print(f"sandbox / threads:          {each['sandbox'] / each['threads']:.2f}")
    print(f"{jobs} at a time / one:        {each['at once'] / each['sandbox']:.2f}")
    real = [o.seconds for o in runs["sandbox"]]
    half = len(real) // 2
    print(f"first half {statistics.mean(real[:half]):.2f} s, second half "
          f"{statistics.mean(real[half:]):.2f} s per submission (flat = linear in students)")

    ways = {"judge": {}, "kernel": {"judged": False}} if args.kernel_too else {"judge": {}}
    rounds: dict[tuple[str, str], list[float]] = {}
    editions: dict[str, float] = {}
    for turn in range(args.rounds):
        for lab in labs():
            for way, options in ways.items():  # interleaved: the machine's moods hit both
                outcomes = in_scratch(lab, args.per_lab, jobs=jobs, paid_once=editions,
                                      **options)
                seconds = rounds.setdefault((way, lab), [])
                seconds.append(wall_per_submission(outcomes))
                print(f"{lab:22s} {seconds[-1]:5.1f} s per submission by the {way} "
                      f"({args.per_lab} of its solution, {jobs} at a time, in the sandbox; "
                      f"each took {statistics.median(o.seconds for o in outcomes):.1f} s, "
                      f"median; round {turn + 1} of {args.rounds})", flush=True)
    once = calibration + len(labs()) * per_run + sum(editions.values())
    print(f"once: tuner calibration {calibration:.1f} s (new machine), {per_run:.1f} s per "
          f"grading run to check it and start its zygote, {sum(editions.values()):.1f} s for the {len(editions)} "
          f"labs' judged editions")
    projected = {}
    for way in ways:
        per_lab = sum(statistics.median(rounds[way, lab]) for lab in labs())
        projected[way] = args.class_size * per_lab + once
        print(f"projected {args.class_size} students x {len(labs())} labs, by the {way}: "
              f"{projected[way] / 60:.1f} min ({args.class_size} x {per_lab:.1f} s + "
              f"{once:.0f} s once)")
        if CAPSTONE in labs():  # it grades longer than any lab: say how much of the total
            capstone = statistics.median(rounds[way, CAPSTONE])
            print(f"  of which the capstone ({CAPSTONE}: 8 engines, whole training runs) "
                  f"{args.class_size * capstone / 60:.1f} min ({capstone:.1f} s a submission, "
                  f"{capstone / (per_lab / len(labs())):.1f}x the mean lab's)")
    if args.kernel_too:
        print(f"judge / kernel, the whole class: {projected['judge'] / projected['kernel']:.2f}")
    shutil.rmtree(os.environ[CACHE_ENV], ignore_errors=True)


if __name__ == "__main__":
    main()
