"""Autograding throughput: seconds per submission of lab00 (9 graded cells, 4 engines).

Grades N synthetic full-marks submissions through the grader, as `python -m grader autograde`
does, then the same N submissions of the same lab with the engine cluster swapped for a
SimulatedWorld of 4 threads (same tests, no processes): the baseline, run in the same process.
Prints seconds per submission for both, their ratio (the price of real engines), whether the
time per submission stays flat as the class grows, and the projection to 30 students x 3 labs.

    python benchmarks/grading_throughput.py [--students 6]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import nbformat

from grader import synthetic
from grader.course import REPO, Course
from grader.grading import autograde, find_submissions, release

LAB = "lab00_ranks"
THREADS_INSTEAD_OF_ENGINES = '''
import torch
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


def seconds_per_submission(root: Path, students: int, engines: bool) -> list[float]:
    course = Course(root)
    shutil.copytree(REPO / "solutions" / LAB, course.solutions / LAB)
    if not engines:
        source = course.source_notebook(LAB)
        nb = nbformat.read(source, as_version=4)
        setup = next(c for c in nb.cells if c.metadata["nbgrader"]["grade_id"] == "setup")
        setup.source = THREADS_INSTEAD_OF_ENGINES
        nbformat.write(nb, source)
    release(course, [LAB])
    folder = root / "incoming"
    for i in range(students):
        synthetic.save(synthetic.solved(course, LAB), folder, f"student{i:02d}", LAB)
    subs, _ = find_submissions(course, folder)
    outcomes = autograde(course, subs, progress=False)
    assert all(o.score == o.max_score for o in outcomes), [o.error for o in outcomes]
    return [o.seconds for o in outcomes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        real = seconds_per_submission(Path(a), args.students, engines=True)
        threads = seconds_per_submission(Path(b), args.students, engines=False)
    half = len(real) // 2
    per = statistics.median(real)
    print(f"submissions per run: {args.students}")
    print(f"4 engines:            {per:5.2f} s per submission (median)")
    print(f"threads, no engines:  {statistics.median(threads):5.2f} s per submission (median)")
    print(f"ratio engines/threads: {per / statistics.median(threads):.2f}")
    print(f"first half {statistics.mean(real[:half]):.2f} s, second half "
          f"{statistics.mean(real[half:]):.2f} s per submission (flat = linear in students)")
    print(f"projected 30 students x 3 such labs: {90 * per / 60:.1f} min")


if __name__ == "__main__":
    main()
