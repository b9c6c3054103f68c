"""A watchdog that outlives its parent just long enough to clean up after it.

`Cluster` starts `python -m lib_dist.cluster.reaper` with a pipe on its stdin and writes the
PID and start time of every controller and engine it launches, one per line (the start time
guards against a PID the system has since given to another process). When the pipe closes, because
the cluster stopped or because the notebook's kernel died however it died, the reaper kills
whatever of those processes (and their descendants) is still alive, then exits.
"""

from __future__ import annotations

import sys

import psutil


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
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


def main() -> None:
    pids: dict[int, float] = {}
    for line in sys.stdin:
        pid, created = line.split()
        pids[int(pid)] = float(created)
    kill_trees(pids)


if __name__ == "__main__":
    main()
