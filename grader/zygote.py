"""Judges that start with torch already imported: a process that imported it once (the zygote)
forks each judge into its submission's sandbox.

An optimisation of grading, not course material. Every graded submission's judge used to
start a Python that imported torch, `torch._dynamo` and ipyparallel: about 5 CPU-seconds,
on a 2-core machine a third of what a class's grading costs. bubblewrap cannot take in a
process it did not start, but a process may join namespaces (`setns`): so the sandbox is
built by bubblewrap as before, around a placeholder that waits, and a child forked from the
zygote joins that sandbox's namespaces (user, mount, network, IPC, UTS, PID), its cgroups and
limits, drops every capability, becomes nobody as bubblewrap's processes are, and carries on
as the judge's command would (`lib_dist.cluster.standby`: forks the engine and controller
hosts, runs the judge). When the judge ends, the zygote's child writes its exit status to the
placeholder, which exits with it: to the grader, the sandbox ended as the judge did.

The zygote is this file run by path: it imports only the standard library and the modules it
is given, never lib_dist (the judged edition is what the sandbox mounts, and the judge imports
it inside), and it holds nothing of the grader's: the job reaches the judge on its own pipe.
Where joining fails (no `setns`, or not permitted), the grader starts judges as before.

    python grader/zygote.py SOCKET_FD STANDBY_PATH [MODULE ...]
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import importlib.util
import json
import os
import resource
import signal
import socket
import sys
from typing import Any

NS_GET_USERNS = 0xB701  # ioctl: the user namespace that owns a namespace
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
CAPABILITY_VERSION_3 = 0x20080522
FDS = ("job", "log", "channel", "status", "reply")  # what each request hands over, in order


def serve(sock: socket.socket, standby: Any) -> None:
    """Fork a joined judge for each request until the grader closes the socket."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the zygote's children reap themselves
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, len(FDS))
        except OSError:
            return
        if not message:
            return
        if os.fork() == 0:
            sock.close()
            _join_and_judge(json.loads(message), dict(zip(FDS, fds)), standby)
        for fd in fds:
            os.close(fd)


def _join_and_judge(request: dict[str, Any], fds: dict[str, int], standby: Any) -> None:
    """In the zygote's child: join the sandbox, fork the judge there, say whether it worked,
    then wait for the judge and hand its exit status to the placeholder. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for group in request["cgroups"]:
            with open(os.path.join(group, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        _limit(request["limits"])
        _join(request["target"])
        judge = os.fork()  # the first process in the sandbox's PID namespace
        if judge == 0:
            _become_judge(request, fds, standby)
        for name in ("job", "log", "channel"):
            os.close(fds[name])
        os.write(fds["reply"], b"ok\n")
        os.close(fds["reply"])
        _, status = os.waitpid(judge, 0)
        os.write(fds["status"], str(os.waitstatus_to_exitcode(status)).encode())
        code = 0
    except BaseException as e:  # noqa: BLE001 - said to the grader, which starts it as before
        try:
            os.write(fds["reply"], f"no {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def _limit(limits: dict[str, int]) -> None:
    """The per-process limits `grader.jail` sets for bubblewrap's processes."""
    resource.setrlimit(resource.RLIMIT_DATA, (limits["memory_mb"] << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _join(target: int) -> None:
    """Join the namespaces of the sandbox's process `target`: first the user namespace that
    owns its mounts (bubblewrap nests a second one to become nobody), then the others, then
    its own user namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    kinds = ("mnt", "net", "ipc", "uts", "pid", "user")
    fds = {kind: os.open(f"/proc/{target}/ns/{kind}", os.O_RDONLY) for kind in kinds}
    owner = fcntl.ioctl(fds["mnt"], NS_GET_USERNS)
    order = [owner, *(fds[kind] for kind in kinds[:-1])]
    if os.fstat(owner).st_ino != os.fstat(fds["user"]).st_ino:
        order.append(fds["user"])
    for fd in order:
        if libc.setns(fd, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns: {os.strerror(error)}")
    for fd in (owner, *fds.values()):
        os.close(fd)


def _become_judge(request: dict[str, Any], fds: dict[str, int], standby: Any) -> None:
    """In the sandbox: no capabilities, a session of its own, the judge's pipes, directory and
    environment; then run the judge's command. Never returns."""
    code = 1
    try:
        _drop_capabilities()
        os.setsid()
        channel = int(request["channel"])
        kept = {fd: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, channel + 1)
                for fd in (fds["job"], fds["log"], fds["channel"])}
        os.dup2(kept[fds["job"]], 0)
        os.dup2(kept[fds["log"]], 1)
        os.dup2(kept[fds["log"]], 2)
        os.dup2(kept[fds["channel"]], channel)  # the number the job names
        os.closerange(3, channel)
        os.closerange(channel + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        importlib.invalidate_caches()  # lib_dist is the sandbox's: its judged edition
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and "torch" in sys.modules:  # read when torch was imported
            sys.modules["torch"].set_num_threads(int(threads))
        command = request["command"]
        if command[1:2] == ["-m"]:
            standby.run_module(command[2:])
        else:  # python standby.py [--import MODULE ...] -- python -m lib_dist.integrity.judge
            sys.argv = command[1:]
            standby.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:  # noqa: BLE001 - the judge's own log says what
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(code)


def _drop_capabilities() -> None:
    """Joining a user namespace grants every capability in it: give them all up, for good, as
    bubblewrap does before it runs a sandbox's command."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # past the last capability: EINVAL, ignored

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    if libc.capset(ctypes.byref(Header(CAPABILITY_VERSION_3, 0)), (Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")


def main() -> None:
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: grader's modules must not shadow top-level ones
    fd, standby_path, *modules = sys.argv[1:]
    sock = socket.socket(fileno=int(fd))
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # ends with the grader
    spec = importlib.util.spec_from_file_location("lib_dist_standby_for_zygote", standby_path)
    assert spec is not None and spec.loader is not None
    standby = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standby)
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a missed saving: the judge imports it itself
    sock.send(b"ready")  # read only by whoever times the start (`Zygote.ready`)
    serve(sock, standby)


if __name__ == "__main__":
    main()
