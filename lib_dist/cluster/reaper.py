"""A watchdog that outlives its parent just long enough to clean up after it.

`Cluster` starts this file as a script (through `Watchdog`) with a pipe on its stdin and
writes the PID and start time of every controller and engine it launches, one per
line (the start time guards against a PID the system has since given to another process),
and the files they write that would outlive them (their logs, the controller's engine list).
When the pipe closes, because the cluster stopped or because the notebook's kernel died
however it died, the reaper kills whatever of those processes (and their descendants) is
still alive, deletes those files, then exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import psutil


class Watchdog:
    """The cluster's end of the reaper: tell it what to watch, and close it when done."""

    def __init__(self) -> None:
        self._reaper: subprocess.Popen[str] | None = None

    def start(self) -> None:
        # Run as a file, not `-m lib_dist.cluster.reaper`: importing the package would
        # import torch, a CPU-second that the engines starting meanwhile need more.
        self._reaper = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                        text=True, start_new_session=True)

    def watch(self, launcher: Any) -> None:
        """Watch an ipyparallel launcher's process, where it has one on this host, and
        delete its output file at the end."""
        process = getattr(launcher, "process", None)
        if process is not None:
            self.watch_pid(process.pid)
        if getattr(launcher, "output_file", ""):
            self.delete_at_end(launcher.output_file)

    def watch_pid(self, pid: int) -> None:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return
        self._tell(f"pid {pid} {created}")

    def delete_at_end(self, path: str) -> None:
        """Delete the file at `path` once the processes have ended (if it is there)."""
        self._tell(f"file {path}")

    def _tell(self, line: str) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            self._reaper.stdin.write(line + "\n")
            self._reaper.stdin.flush()

    def stop(self) -> None:
        """Close the pipe: the reaper ends what is left, then exits."""
        if self._reaper is not None:
            if self._reaper.stdin is not None:
                self._reaper.stdin.close()
            self._reaper.wait(10)
            self._reaper = None


def kill_now(pids: list[int]) -> None:
    """SIGKILL the processes and their descendants at once (a rank stuck in a collective
    ignores SIGTERM)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            pass
    kill_trees(found, grace=0)


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def kill_trees(pids: dict[int, float], grace: float = 1.0) -> None:
    """Terminate the processes (pid -> create_time) and all their descendants; kill what
    ignores SIGTERM."""
    procs = []
    for pid, created in pids.items():
        try:
            root = psutil.Process(pid)
            if abs(root.create_time() - created) < 0.01:
                procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    alive = _survivors(procs, grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _survivors(alive, grace)


def _survivors(procs: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """Those of `procs` still running after up to `grace` seconds. A zombie counts as gone:
    it has ended, and waiting for a parent that may never reap it would take all of `grace`."""
    deadline = time.monotonic() + grace
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    pids: dict[int, float] = {}
    files: list[str] = []
    for line in sys.stdin:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "pid":
            pid, created = rest.split()
            pids[int(pid)] = float(created)
        elif kind == "file":
            files.append(rest)
    kill_trees(pids)
    for path in files:
        try:
            os.remove(path)
        except OSError:  # gone already (a clean stop removes the logs itself), or never made
            pass


if __name__ == "__main__":
    main()
