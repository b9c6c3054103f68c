"""Nothing a submission starts outlives its grading.

The grader makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a process that a
submission detaches (a new session, a double fork, a daemon) is re-parented to the grader
instead of to init, so it stays a descendant, and `sweep` ends every descendant that was not
there before the submission started.
"""

from __future__ import annotations

import ctypes
import os
import sys

import psutil

from lib_dist.cluster.reaper import kill_trees

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants. Returns False where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants() -> dict[int, float]:
    """pid -> start time of every living descendant of this process (zombies are reaped)."""
    _reap_zombies()
    found = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass
    return found


def sweep(keep: dict[int, float]) -> list[int]:
    """End every descendant not in `keep` (pid -> start time); return the PIDs ended."""
    strays = {pid: t for pid, t in descendants().items() if keep.get(pid) != t}
    kill_trees(strays, grace=1.0)
    _reap_zombies()
    return sorted(strays)


def _reap_zombies() -> None:
    """Collect the exit status of orphans adopted as a subreaper, so they vanish."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
