"""Autograding throughput: seconds per submission of lab00 (9 graded cells, 4 engines).

Grades N synthetic full-marks submissions through the grader, as `python -m grader autograde`
does (in the sandbox), then the same N without the sandbox, then the same lab with the engine
cluster swapped for a SimulatedWorld of 4 threads (same tests, no processes), all in the same
process. Prints seconds per submission for each, the price of the sandbox and of real engines
as ratios, whether the time per submission stays flat as the class grows, and the projection
to 30 students x 3 labs.

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


def seconds_per_submission(root: Path, students: int, engines: bool = True,
                           sandbox: bool = True) -> list[float]:
    course = Course(root, sandbox=sandbox)
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
    runs = {}
    for name, options in (("sandbox", {}), ("no sandbox", {"sandbox": False}),
                          ("threads", {"engines": False, "sandbox": False})):
        with tempfile.TemporaryDirectory() as tmp:
            runs[name] = seconds_per_submission(Path(tmp), args.students, **options)
    median = {name: statistics.median(times) for name, times in runs.items()}
    print(f"submissions per run: {args.students}")
    print(f"4 engines in the sandbox:  {median['sandbox']:5.2f} s per submission (median)")
    print(f"4 engines, no sandbox:     {median['no sandbox']:5.2f} s")
    print(f"threads instead of engines: {median['threads']:5.2f} s (no sandbox)")
    print(f"sandbox / no sandbox:      {median['sandbox'] / median['no sandbox']:.2f}")
    print(f"engines / threads:         {median['no sandbox'] / median['threads']:.2f}")
    real = runs["sandbox"]
    half = len(real) // 2
    print(f"first half {statistics.mean(real[:half]):.2f} s, second half "
          f"{statistics.mean(real[half:]):.2f} s per submission (flat = linear in students)")
    print(f"projected 30 students x 3 such labs: {90 * median['sandbox'] / 60:.1f} min")

if __name__ == "__main__":
    main()
