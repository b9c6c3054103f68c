"""Processes started ahead of time, so that their imports overlap the kernel's own.

An optimisation of the grader's start-up, not course material. A cluster needs a controller
(a process that imports ipyparallel) and engines forked from one host that has imported torch
(`forked_engines`); started when the notebook asks for a cluster, those imports (well over a
CPU-second) come after the kernel's. Run a kernel as

    python path/to/lib_dist/cluster/standby.py [--import MODULE ...] -- KERNEL_CMD ...

and an engine host and a controller host start at once, in standby, importing while the
kernel starts; the wrapper then becomes the kernel, with `LIB_DIST_STANDBY` naming each
standby's pid and the pipe it listens on. The first local cluster the kernel starts claims
them (`claim`, from `launchers`): a standby receives the command line, output file, directory
and environment the launcher would have given a new process, and carries on as that process.
`--import MODULE`: imported once, ahead, rather than by every engine on its own: before the
fork below (the kernel then shares it too), else by the engine host.
Unclaimed, a standby dies with the kernel (parent-death signal) or when its pipe closes.

When the kernel is this Python running a module (`python -m ipykernel_launcher ...`, what
Jupyter starts), the wrapper imports torch and ipyparallel's controller first, forks the
engine host and the controller host from itself and runs the module in-process: kernel,
engines and controller then share one import of torch and ipyparallel (about three
CPU-seconds saved per graded submission), and of each `--import` module, instead of each
paying for its own. Otherwise it execs the kernel.

Apart from those imports, this file is run by path and imports only the standard
library: importing `lib_dist` (in a graded kernel, torch with it, and the lab's switched-off
answers) is the kernel's business, after the grader arms its guard.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import subprocess
import sys
import threading
import traceback
from typing import Any

ENV = "LIB_DIST_STANDBY"
ENGINE_HOST = "from lib_dist.cluster.forked_engines import main; main()"
CONTROLLER = "ipyparallel.controller.app"


def claim(kind: str, argv: list[str], output: str, cwd: str, env: dict[str, str]) -> int | None:
    """Hand this kernel's standby `kind` ("engines" or "controller") its command line; its
    pid, or None when there is none (claimed before, never started, or dead)."""
    standbys = dict(item.split("=") for item in os.environ.get(ENV, "").split(",") if item)
    found = standbys.pop(kind, "")
    os.environ[ENV] = ",".join(f"{k}={v}" for k, v in standbys.items())
    if not found:
        return None
    pid, fd = (int(part) for part in found.split(":"))
    request = json.dumps({"argv": argv, "output": output, "cwd": cwd, "env": env}).encode()
    try:
        os.write(fd, request)  # a few KB: within the pipe's buffer, so this does not block
        os.close(fd)
        os.kill(pid, 0)
    except OSError:
        return None
    return pid


def wait_for_claim(fd: int) -> dict | None:
    """In a standby: the request `claim` sent, or None once the pipe closed without one."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    if not chunks:
        return None
    return json.loads(b"".join(chunks))


def become_claimed(request: dict) -> None:
    """Take the directory, environment and output file a launched process would have had,
    in a session of its own."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.setsid()


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it (the kernel) ends."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe closing still ends it
        pass


def standby(kind: str, extra: list[str], fd: int, kernel: int) -> None:
    """Be the standby `kind`: import what it needs, wait for a claim, then run as claimed.

    The imports run on a thread of lower priority: on a machine with few cores they then take
    what the kernel, on the critical path, leaves. The process itself keeps its priority, and
    so do the engines it forks."""
    die_with_parent()
    if os.getppid() != kernel:
        return  # the kernel ended before we could ask to die with it
    imported: dict[str, Any] = {}
    importer = threading.Thread(target=_import_for, args=(kind, extra, imported))
    importer.start()
    request = wait_for_claim(fd)
    importer.join()
    if request is not None:
        become_claimed(request)
        imported["run"](request["argv"])


def _import_for(kind: str, extra: list[str], imported: dict[str, Any]) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # this thread only
    except (OSError, AttributeError):
        pass
    if kind == "engines":
        from lib_dist.cluster.forked_engines import fork_engines, import_engine_modules

        import_engine_modules()
        for name in extra:
            _import_if_there(name)  # once here, not once in every engine
        imported["run"] = fork_engines
    else:
        main = importlib.import_module(CONTROLLER).main

        def run(argv: list[str]) -> None:
            sys.argv = ["ipcontroller", *argv]
            main()
        imported["run"] = run


def _import_if_there(name: str) -> None:
    """Import `name` ahead; one missing is only a missed saving, so it is said and skipped."""
    try:
        importlib.import_module(name)
    except ImportError as e:
        print(f"lib_dist standby: not imported ahead: {e}", file=sys.stderr)


def start(kind: str, extra: list[str]) -> str:
    """Start a standby of `kind` as a new process; its entry for `LIB_DIST_STANDBY`."""
    read, write = os.pipe()
    command = [sys.executable, __file__, "--standby", kind, ",".join(extra)]
    host = subprocess.Popen([*command, str(read), str(os.getpid())], pass_fds=(read,),
                            stdin=subprocess.DEVNULL)
    os.close(read)
    os.set_inheritable(write, True)
    return f"{kind}={host.pid}:{write}"


def fork(kind: str, extra: list[str], earlier: tuple[str, ...] = ()) -> str:
    """Fork a standby of `kind` from this process, with everything it has imported; its entry
    for `LIB_DIST_STANDBY`. `earlier`: the entries of standbys forked before it, whose pipes
    it must not hold open. The child never returns."""
    read, write = os.pipe()
    kernel = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # else a pipe never closes when the kernel has written its claim, or left it
            # unclaimed: this standby's, and those of the standbys forked before it
            for fd in (write, *(int(entry.rpartition(":")[2]) for entry in earlier)):
                os.close(fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            standby(kind, extra, read, kernel)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(read)
    os.set_inheritable(write, True)
    return f"{kind}={pid}:{write}"


def python_module(command: list[str]) -> list[str] | None:
    """[MODULE, ARGS...] when `command` is this Python running a module, else None."""
    if len(command) < 3 or command[1] != "-m":
        return None
    same = os.path.realpath(command[0]) == os.path.realpath(sys.executable)
    return command[2:] if same else None


def run_module(module_and_args: list[str]) -> None:
    """Carry on as `python -m MODULE ARGS...` would, in this process."""
    module, *args = module_and_args
    sys.argv = [module, *args]
    sys.path.insert(0, os.getcwd())  # as -m puts it
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: this folder's modules must not shadow top-level ones
    if sys.argv[1:2] == ["--standby"]:  # --standby KIND MODULE,... FD KERNEL_PID
        kind, modules, fd, kernel = sys.argv[2:6]
        standby(kind, [m for m in modules.split(",") if m], int(fd), int(kernel))
        return
    command, imports = sys.argv[1:], []
    while command[:1] == ["--import"] and len(command) > 1:
        imports.append(command[1])
        command = command[2:]
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        sys.exit(f"usage: python {__file__} [--import MODULE ...] -- KERNEL_CMD ...")
    module = python_module(command)
    if module is not None:
        import torch  # noqa: F401 - once, for the kernel and the engine host forked from it

        for name in (*imports, CONTROLLER):
            _import_if_there(name)
        engines = fork("engines", [])
        controller = fork("controller", [], earlier=(engines,))
    else:
        engines, controller = start("engines", imports), start("controller", [])
    os.environ[ENV] = f"{engines},{controller}"
    if module is not None:
        run_module(module)
    else:
        os.execvp(command[0], command)


if __name__ == "__main__":
    main()
