"""The grader's side of `grader.zygote`: a judge forked, with torch imported, into a sandbox
that bubblewrap built around a placeholder.

`start_joined` builds the sandbox as `SandboxedKernelManager.sandboxed` does, but what runs in
it is a placeholder that waits for the judge's exit status; it asks this process's zygote to
fork the judge into the sandbox, and returns something the judge's reader (`grader.judge`)
uses as it uses a `subprocess.Popen`: the job goes to `stdin`, the sandbox's session is
`pid`'s, and `poll`/`wait`/`returncode` are the placeholder's, which exits as the judge did.
None where the zygote cannot join a sandbox: the caller then starts the judge as before.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lib_dist.cluster import standby
from lib_dist.cluster.forked_engines import REGISTRATION_IMPORTS
from lib_dist.patience import stretched

from . import zygote as zygote_file
from .sandbox import sandbox_env, with_engines_started

if TYPE_CHECKING:
    from .sandbox import SandboxedKernelManager

SANDBOX_SECONDS = 30  # bubblewrap's start, and the zygote's answer (its first: its imports)
# what every judge imports before the lab's own preloads: torch, `torch._dynamo` (which any
# torch.optim optimizer imports), ipyparallel's client and what an engine imports once it
# registers. Not ipyparallel's applications (controller, engine): their working directory is
# the one they were imported in, which must be the sandbox's (the judge imports them there).
IMPORTS = ("torch", "torch._dynamo", "torch.distributed", "ipyparallel", *REGISTRATION_IMPORTS)
# the placeholder in the sandbox: says the sandbox is built (bubblewrap runs it last), then
# exits as the judge did (a signal: by the same signal), once the zygote's child that waited
# for the judge has exited too (no process of the submission's outlives its sandbox)
PLACEHOLDER = ("import os, sys\n"
               "os.write(int(sys.argv[1]), b'ready\\n')\n"
               "said = chunk = os.read(int(sys.argv[2]), 64)\n"
               "while chunk:  # to the end: the zygote's child, the pipe's writer, has exited\n"
               "    chunk = os.read(int(sys.argv[2]), 64)\n"
               "    said += chunk\n"
               "said = said.strip()\n"
               "code = int(said) if said else 1\n"
               "if code < 0:\n"
               "    os.kill(os.getpid(), -code)\n"
               "sys.exit(code)\n")
_STARTED: list[Zygote] = []  # this process's zygote, or the one the grader started before it
# forked this process (a grading worker): forked workers share it


class Zygote:
    """A `grader/zygote.py` process serving this process and the workers it forks, over a
    socket only they hold. Its environment is a sandbox's (`sandbox_env`): a forked judge's
    /proc/self/environ shows the one its zygote started with."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, zygote_file.__file__, str(theirs.fileno()), standby.__file__,
             *IMPORTS], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=sandbox_env(dict(os.environ)))
        theirs.close()
        self.socket, self.usable, self.owner = mine, True, os.getpid()

    def alive(self) -> bool:
        if self.owner == os.getpid():
            return self.process.poll() is None
        try:  # a worker's: its parent's child, which only the parent may wait for
            os.kill(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def ready(self, seconds: float) -> bool:
        """Wait until it has imported what it forks judges with (a benchmark times its start
        apart: a grading run pays it once, whatever the number of submissions)."""
        self.socket.settimeout(seconds)
        try:
            return self.socket.recv(16) == b"ready"
        except OSError:
            return False
        finally:
            self.socket.settimeout(None)

    def stop(self) -> None:
        """End it: it exits when the socket closes (the judges it forked have ended by then)."""
        self.socket.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def fork_judge(self, request: dict[str, Any], fds: list[int]) -> None:
        socket.send_fds(self.socket, [json.dumps(request).encode()], fds)  # one message: workers
        # share the socket


@contextmanager
def zygote_for_this_run(wanted: bool) -> Iterator[None]:
    """A zygote for a grading run: started now where `wanted` and none is running, ended
    with the run if it was started here (one started before, as a benchmark does, stays)."""
    before = _STARTED[0] if _STARTED else None
    if wanted:
        zygote()  # its imports overlap the run's preparation; workers forked later share it
    started_here = bool(_STARTED) and _STARTED[0] is not before
    try:
        yield
    finally:
        if started_here and _STARTED and _STARTED[0].owner == os.getpid():
            _STARTED.pop().stop()


def zygote() -> Zygote | None:
    """This process's zygote (or its parent's), started on first use; None once one could not
    join a sandbox. Start it before the grader notes which processes a submission may leave
    (`sweep`), and before grading workers are forked (they then share it)."""
    if sys.platform != "linux":
        return None
    if not _STARTED or not _STARTED[0].alive():
        _STARTED[:] = [Zygote()]
    return _STARTED[0] if _STARTED[0].usable else None


class Joined:
    """The judge's process, as the grader's reader sees it (module docstring)."""

    def __init__(self, placeholder: subprocess.Popen[bytes], job: int):
        self.placeholder, self.stdin = placeholder, os.fdopen(job, "wb")
        self.pid = placeholder.pid

    @property
    def returncode(self) -> int | None:
        return self.placeholder.returncode

    def poll(self) -> int | None:
        return self.placeholder.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.placeholder.wait(timeout)


class SandboxLauncher:
    """What `grader.judge` starts judges with, in `sandbox`: a launcher (command line and
    environment in the sandbox) that can also `start` a joined judge."""

    def __init__(self, sandbox: SandboxedKernelManager, cwd: Path, lab: str | None):
        self.sandbox, self.cwd, self.lab = sandbox, cwd, lab

    def __call__(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return self.sandbox.sandboxed(argv, self.cwd, env, self.lab)

    def start(self, argv: list[str], env: dict[str, str], log: IO[bytes] | None,
              channel: int) -> Joined | None:
        return start_joined(self.sandbox, argv, self.cwd, env, self.lab, log, channel)


def start_joined(sandbox: SandboxedKernelManager, command: list[str], cwd: Path,
                 env: dict[str, str], lab: str | None, log: IO[bytes] | None,
                 channel: int) -> Joined | None:
    """The judge `command` forked by the zygote into a fresh sandbox (module docstring)."""
    forker = zygote()
    if forker is None:
        return None
    _, env = sandbox.sandboxed(command, cwd, env, lab)  # the work folder's fresh copy
    status_r, status_w = os.pipe()
    info_r, info_w = os.pipe()
    job_r, job_w = os.pipe()
    reply_r, reply_w = os.pipe()
    ready_r, ready_w = os.pipe()
    argv = sandbox.wrapped([sys.executable, "-I", "-S", "-c", PLACEHOLDER, str(ready_w),
                            str(status_r)], cwd, bwrap_options=["--info-fd", str(info_w)])
    placeholder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                                   stderr=log or subprocess.DEVNULL,
                                   pass_fds=(status_r, info_w, ready_w), cwd=cwd, env=env,
                                   start_new_session=True)
    for fd in (status_r, info_w, ready_w):
        os.close(fd)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        target = _sandbox_pid(info_r)
        if _read_line(ready_r, stretched(SANDBOX_SECONDS)) != "ready":  # its mounts all made
            raise OSError("the sandbox did not start")
        request = {"target": target, "cgroups": sandbox.cgroups, "cwd": str(cwd),
                   "env": env | {"JPY_PARENT_PID": "1"},
                   "command": with_engines_started(command, lab),
                   "channel": channel, "limits": vars(sandbox.limits)}
        forker.fork_judge(request, [job_r, log.fileno() if log else null, channel, status_w,
                                    reply_w])
        for fd in (job_r, status_w, reply_w):
            os.close(fd)
        job_r = status_w = reply_w = -1
        said = _read_line(reply_r, stretched(SANDBOX_SECONDS))
        if said != "ok":
            raise OSError(said or "the zygote did not answer")
        return Joined(placeholder, job_w)
    except (OSError, ValueError) as e:
        forker.usable = False  # judges start as before from now on
        if log is not None:
            log.write(f"[grader] judges start as before: the zygote could not join the "
                      f"sandbox ({e})\n".encode())
        _end(placeholder)
        os.close(job_w)
        return None
    finally:
        for fd in (info_r, ready_r, reply_r, null, job_r, status_w, reply_w):
            if fd >= 0:
                os.close(fd)


def _sandbox_pid(fd: int) -> int:
    """The pid of the sandbox's first process, as bubblewrap writes it to its info fd."""
    text = _read_until(fd, b"}", stretched(SANDBOX_SECONDS))
    return int(json.loads(text)["child-pid"])


def _read_line(fd: int, seconds: float) -> str:
    return _read_until(fd, b"\n", seconds).decode(errors="replace").strip()


def _read_until(fd: int, end: bytes, seconds: float) -> bytes:
    deadline, got = time.monotonic() + seconds, b""
    while end not in got:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise OSError(f"no answer within {seconds:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got


def _end(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
