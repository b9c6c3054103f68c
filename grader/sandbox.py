"""Each submission runs in a sandbox: its kernel and everything the kernel starts (engines,
controller, anything a student forks) live in bubblewrap's namespaces.

What a submission can see and do:
- the installed software, read-only, a private writable copy of its own folder at the path
  nbgrader runs it from, the same student's other graded labs, read-only (a later lab may
  reuse an earlier one's definitions), and the machine's calibrations of lib_dist's
  all-reduce tuner, read-only (`grader.tuner_cache`); the course directory (solutions,
  gradebook, other students' work, feedback) is hidden behind an empty tmpfs, and so are the
  instructor's home and /tmp;
- its own PID namespace: when its kernel ends, however it ends, every process in the
  sandbox ends with it (new sessions, double forks and daemons included);
- its own network namespace with only a loopback interface, which is all the engines need;
  it talks to the grader over unix sockets in a private folder (ZMQ's ipc transport);
- a user namespace in which it is nobody, without capabilities; and limits: memory per process (RLIMIT_DATA), memory for the
  whole sandbox and number of processes and threads (cgroups, where the machine lets us),
  file size (RLIMIT_FSIZE), and wall time (the grader's timeouts).

bubblewrap is Debian's `bubblewrap` package (`apt-get install bubblewrap`); where it is
missing the grader refuses to grade unless told `--no-sandbox`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Int, List, Unicode

from lib_dist.comm.fast.calibration import CACHE_ENV, cache_dir

NOBODY = 65534
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Memory is per process and for the whole sandbox."""

    memory_mb: int = 3072
    total_memory_mb: int = 8192
    processes: int = 512  # processes and threads, as Linux counts them
    file_size_mb: int = 512


def unavailable() -> str | None:
    """Why sandboxing cannot work on this machine, or None when it can."""
    if shutil.which("bwrap") is None:
        return ("bubblewrap is not installed: install it (Debian/Ubuntu: apt-get install "
                "bubblewrap) or grade without isolation with --no-sandbox")
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net",
                            "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return (f"bubblewrap cannot create namespaces here ({probe.stderr.strip()}); enable "
                f"user namespaces, or grade without isolation with --no-sandbox")
    return None


class StandbyKernelManager(AsyncKernelManager):
    """A kernel started beside the standbys of its lab's cluster (`with_engines_started`):
    what grading without the sandbox uses."""

    lab = Unicode("", help="the lab whose notebook the kernel runs")

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        await super()._async_launch_kernel(with_engines_started(kernel_cmd, self.lab), **kw)


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager that starts the kernel inside a fresh sandbox (module docstring)."""

    hidden = List(Unicode(), help="folders the submission must not see").tag(config=True)
    memory_mb = Int(Limits.memory_mb).tag(config=True)
    total_memory_mb = Int(Limits.total_memory_mb).tag(config=True)
    processes = Int(Limits.processes).tag(config=True)
    file_size_mb = Int(Limits.file_size_mb).tag(config=True)
    edition = Unicode("", help="a folder holding the lib_dist to mount in lib_dist's place "
                               "(grader.edition)").tag(config=True)
    lab = Unicode("", help="the lab whose notebook the kernel runs")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.private = Path(tempfile.mkdtemp(prefix="lib_dist-sandbox-"))
        self.transport = "ipc"
        self.ip = str(self.private / "kernel")
        self.connection_file = str(self.private / "connection.json")
        self.cgroups = _make_cgroups(f"lib_dist-{uuid.uuid4().hex[:12]}", self.limits)

    @property
    def limits(self) -> Limits:
        return Limits(self.memory_mb, self.total_memory_mb, self.processes, self.file_size_mb)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        argv, kw["env"] = self.sandboxed(kernel_cmd, Path(kw.get("cwd") or os.getcwd()),
                                         kw.get("env") or dict(os.environ), self.lab or None)
        # A signal would reach bwrap, not the kernel in its own session: ask by message.
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        await super()._async_launch_kernel(argv, **kw)

    def sandboxed(self, command: list[str], cwd: Path, env: dict[str, str],
                  lab: str | None = None) -> tuple[list[str], dict[str, str]]:
        """`command` (run from `cwd`) as a command line that runs it in this sandbox, and its
        environment; beside the standby engines of `lab` when it starts a cluster."""
        cwd = cwd.resolve()
        work = self.private / "work"
        if work.exists():  # a judge started again: a fresh copy of the submission's folder
            shutil.rmtree(work)
        shutil.copytree(cwd, work)
        return (self._wrap(with_engines_started(command, lab), cwd, work),
                sandbox_env(env, _tuner_cache()))

    def release(self) -> None:
        """Remove the sandbox's cgroups and private folder (a kernel's are removed with it)."""
        _remove_cgroups(self.cgroups)
        shutil.rmtree(self.private, ignore_errors=True)

    def wrapped(self, command: list[str], cwd: Path, bwrap_options: list[str]) -> list[str]:
        """`command` in this sandbox, with more of bubblewrap's options, once `sandboxed` has
        copied the work folder (`grader.joining`)."""
        return self._wrap(command, cwd.resolve(), self.private / "work", bwrap_options)

    def _wrap(self, kernel_cmd: list[str], cwd: Path, work: Path,
              bwrap_options: list[str] | None = None) -> list[str]:
        limits = self.limits
        jail = [sys.executable, "-m", "grader.jail", f"--memory-mb={limits.memory_mb}", f"--file-size-mb={limits.file_size_mb}",
                f"--processes={limits.processes}"]
        jail += [f"--cgroup={g}" for g in self.cgroups]
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                 "--tmpfs", "/tmp", "--dir", "/tmp/home", "--tmpfs", str(Path.home())]
        for folder in self.hidden:
            bwrap += ["--tmpfs", folder]
        for keep in _software_under([*self.hidden, str(Path.home()), "/tmp"]):
            bwrap += ["--ro-bind", keep, keep]
        if self.edition:  # over lib_dist, wherever it is: the lab's answers are not in it
            bwrap += ["--ro-bind", str(Path(self.edition) / "lib_dist"), str(_lib_dist_folder())]
        bwrap += ["--bind", str(self.private), str(self.private), "--bind", str(work), str(cwd)]
        for own in _other_labs_of_this_student(cwd):  # a later lab may reuse an earlier one
            bwrap += ["--ro-bind", str(own), str(own)]
        if (cache := _tuner_cache()) is not None:
            bwrap += ["--ro-bind", str(cache), str(cache)]
        bwrap += [*(bwrap_options or []), "--chdir", str(cwd), "--unshare-pid", "--unshare-net",
                  "--unshare-ipc", "--unshare-uts", "--unshare-user",
                  "--uid", str(NOBODY), "--gid", str(NOBODY), "--die-with-parent", "--new-session",
                  "--setenv", "JPY_PARENT_PID", "1"]  # bwrap's init: the parent in here
        return jail + ["--", *bwrap, "--", *kernel_cmd]

    def memory_limit_hit(self) -> bool:
        """Did the sandbox's cgroup kill a process for memory?"""
        return any(_oom_kills(g) for g in self.cgroups)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if not restart:
            _remove_cgroups(self.cgroups)
            shutil.rmtree(self.private, ignore_errors=True)


def with_engines_started(kernel_cmd: list[str], lab_name: str | None) -> list[str]:
    """The command, started beside an engine host in standby when the lab starts a cluster of
    engines: their import of torch then overlaps the command's."""
    from lib_dist.cluster import standby
    from lib_dist.extend import LABS

    lab = LABS.get(lab_name or "")
    if lab is None or not lab.engines:
        return kernel_cmd
    imports = [word for name in lab.preload for word in ("--import", name)]
    return [sys.executable, standby.__file__, *imports, "--", *kernel_cmd]


def _lib_dist_folder() -> Path:
    import lib_dist

    return Path(lib_dist.__file__).resolve().parent


def _other_labs_of_this_student(cwd: Path) -> list[Path]:
    """The student's other graded labs: siblings of <autograded>/<student>/<lab>."""
    return sorted(p for p in cwd.parent.iterdir() if p.is_dir() and p != cwd)


def sandbox_env(env: dict[str, str], tuner_cache: Path | None = None) -> dict[str, str]:
    """The kernel's environment, minus the instructor's secrets, with a home of its own,
    the tuner's cache where there is one (else its calibrations go to that home), and one
    torch thread per process unless the instructor sets OMP_NUM_THREADS: the kernel and its
    engines share the machine's cores with each other and with whatever else runs, and
    threads that spin on cores others need slow everything down (lab02's training took 78 s
    with torch's default of a thread per core on a loaded 2-core machine, 29 s with one)."""
    secret = ("TOKEN", "SECRET", "PASSWORD", "GRADEBOOK", "KEY", "CREDENTIAL")
    keep = {k: v for k, v in env.items() if not any(s in k.upper() for s in secret)}
    keep.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for each rank
    if tuner_cache is not None:
        keep[CACHE_ENV] = str(tuner_cache)
    return keep | {"HOME": "/tmp/home", "JUPYTER_RUNTIME_DIR": "/tmp/home/runtime",
                   "IPYTHONDIR": "/tmp/home/.ipython", "MPLCONFIGDIR": "/tmp/home/mpl"}


def _tuner_cache() -> Path | None:
    """The machine's calibrations of lib_dist's all-reduce tuner, where they exist."""
    directory = cache_dir()
    return directory.resolve() if directory is not None and directory.is_dir() else None


def _software_under(masked: list[str]) -> list[str]:
    """The Python installation and lib_dist's package, where a masked folder holds them
    (a venv or an editable install inside the repository, a pyenv Python in the home)."""
    import lib_dist

    needed = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix,
                                                Path(lib_dist.__file__).parent)}
    return sorted(p for p in needed if any(Path(p).is_relative_to(Path(m)) for m in masked))


def _make_cgroups(name: str, limits: Limits) -> list[str]:
    """Memory and pids cgroups (v1 or v2) for one sandbox; [] where we may not create them."""
    made = []
    settings = {
        "memory": {"memory.limit_in_bytes": limits.total_memory_mb << 20},
        "pids": {"pids.max": limits.processes},
    }
    for controller, values in settings.items():
        group = CGROUP_ROOT / controller / name
        try:
            group.mkdir()
            for key, value in values.items():
                (group / key).write_text(str(value))
            made.append(str(group))
        except OSError:
            if group.exists():
                group.rmdir()
    if not made and (CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2
        group = CGROUP_ROOT / name
        try:
            group.mkdir()
            (group / "memory.max").write_text(str(limits.total_memory_mb << 20))
            (group / "pids.max").write_text(str(limits.processes))
            made.append(str(group))
        except OSError:
            pass
    return made


def _oom_kills(group: str) -> int:
    for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
        path = Path(group) / name
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(key + " "):
                    return int(line.split()[1])
    return 0


def _remove_cgroups(groups: list[str]) -> None:
    """Remove the sandbox's cgroups once the processes in them are gone (a killed kernel's
    namespace takes a moment to empty)."""
    import time

    deadline = time.monotonic() + 5
    for group in groups:
        while True:
            try:
                Path(group).rmdir()
                break
            except OSError:
                if time.monotonic() > deadline or not Path(group).exists():
                    break
                time.sleep(0.02)
