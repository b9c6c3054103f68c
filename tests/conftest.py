"""Shared helpers for tests that start real processes."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

import psutil

# The tuner's calibrations go to a cache of this test session's own, not the user's
# (`lib_dist.comm.fast.calibration`); processes the tests start inherit it.
os.environ["LIB_DIST_TUNER_CACHE"] = tempfile.mkdtemp(prefix="lib_dist-test-tuner-")
atexit.register(shutil.rmtree, os.environ["LIB_DIST_TUNER_CACHE"], True)


def alive(pids: set[int] | list[int]) -> list[int]:
    """The PIDs that still belong to a running (not zombie) process."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_until_dead(pids: set[int] | list[int], within: float = 15.0) -> list[int]:
    """Poll until none of the PIDs is alive or `within` seconds pass; return survivors."""
    deadline = time.monotonic() + within
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def course_with_lab(root, lab: str, **options):
    """A scratch course directory holding one lab of the repository, released."""
    import shutil

    from grader.course import REPO, Course
    from grader.grading import release

    course = Course(root, **options)
    shutil.copytree(REPO / "solutions" / lab, course.solutions / lab)
    release(course, [lab])
    return course
