"""Unix accounts and folder modes for the hub test (tests/test_jupyterhub.py): commands run as
a user, folders made reachable by every user or kept to a staff group, and the hub stopped."""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path


def as_user(user: str, command: str, env: dict[str, str]) -> str:
    done = subprocess.run(["su", user, "-s", "/bin/sh", "-c", command], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{user}: {command}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def scratch_root() -> Path:
    """A folder of its own under /tmp for the hub's exchange and logs; not under pytest's
    temporary folder, which a pytest session starting meanwhile sets back to 0o700, locking
    the students out of the exchange."""
    return Path(tempfile.mkdtemp(prefix="lib-dist-hub-"))


def traversable(paths: list[Path]) -> dict[Path, int]:
    """Let every user reach the environment (o+x on each folder above it); the old modes."""
    changed = {}
    for path in paths:
        for folder in [path, *path.parents]:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                changed[folder] = mode
                folder.chmod(mode | stat.S_IXOTH)
    return changed


def kept_from_students(folders: list[Path], staff: str) -> dict[Path, tuple[int, int]]:
    """Each folder readable by its owner and the group `staff` only (0o750); the old (mode,
    gid) of each."""
    old = {}
    for folder in folders:
        info = folder.stat()
        old[folder] = (info.st_mode, info.st_gid)
        shutil.chown(folder, group=staff)
        folder.chmod(0o750)
    return old


def server_environment(student: str) -> dict[str, str]:
    """The environment of `student`'s single-user server: what their kernels inherit."""
    pid = subprocess.run(["pgrep", "-u", student, "-f", "jupyterhub-singleuser"],
                         capture_output=True, text=True).stdout.split()[0]
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def stop_hub(hub_process: subprocess.Popen) -> None:
    """SIGTERM: the hub stops the proxy and each student's server (interrupt, then terminate:
    over a minute on a loaded machine); killed if it has not finished in three."""
    hub_process.send_signal(signal.SIGTERM)
    try:
        hub_process.wait(180)
    except subprocess.TimeoutExpired:
        hub_process.kill()
        hub_process.wait(10)
