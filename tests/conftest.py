"""Shared helpers for tests that start real processes."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import pytest_timeout

from lib_dist.patience import stretched

# The tuner's calibrations go to a cache of this test session's own, not the user's
# (`lib_dist.comm.fast.calibration`); processes the tests start inherit it.
os.environ["LIB_DIST_TUNER_CACHE"] = tempfile.mkdtemp(prefix="lib_dist-test-tuner-")
atexit.register(shutil.rmtree, os.environ["LIB_DIST_TUNER_CACHE"], True)

# `make test` runs the tests in two pytest-xdist workers, one per core: each (and every
# notebook kernel it starts) gets one torch thread, as the grader's sandbox gives every process;
# two workers each running two threads on two cores wait for each other's threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """A test's timeout (pytest-timeout's), stretched by the machine's load as the cluster's
    and the grader's waits are: a busy machine slows the tests, it does not fail them."""
    return pytest_timeout.pytest_timeout_set_timer(
        item, settings._replace(timeout=stretched(settings.timeout)))


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


def other_workers() -> set[int]:
    """The other pytest-xdist workers of this run (none when the tests run in one process):
    the processes they start are theirs, not leftovers of this worker's tests."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return set()
    me = psutil.Process()
    parent = me.parent()
    return {c.pid for c in parent.children()} - {me.pid} if parent else set()


def running(matches) -> list[psutil.Process]:
    """Running processes whose command line (a list) `matches`, leaving out those that descend
    from another xdist worker."""
    others, found = other_workers(), []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if matches(p.info["cmdline"] or []) and not {a.pid for a in p.parents()} & others:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def profile_files(cluster_id: str) -> list[Path]:
    """Files of the cluster `cluster_id` in the default IPython profile (its logs, connection
    and cluster files): none should be left once the cluster has ended."""
    profile = Path.home() / ".ipython" / "profile_default"
    return [f for f in profile.glob("*/*") if cluster_id in f.name]


def wait_until_empty(found: Callable[[], list], within: float) -> list:
    """Poll `found()` until it returns nothing or `within` seconds (stretched by the machine's
    load) pass; its last answer."""
    deadline = time.monotonic() + stretched(within)
    while (left := found()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def wait_until_dead(pids: set[int] | list[int], within: float = 15.0) -> list[int]:
    """Poll until none of the PIDs is alive or `within` seconds pass; return survivors."""
    return wait_until_empty(lambda: alive(pids), within)


def course_with_lab(root, lab: str, **options):
    """A scratch course directory holding one lab of the repository, released."""
    import shutil

    from grader.course import REPO, Course
    from grader.grading import release

    course = Course(root, **options)
    shutil.copytree(REPO / "solutions" / lab, course.solutions / lab)
    release(course, [lab], lectures=False)
    return course
