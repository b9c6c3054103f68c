"""What each rank runs for `python -m lib_dist.run`: the user's script (or module, `-m`), as
`__main__`.

The script runs inside the rank's engine process, where `lib_dist.horovod.init()` (and
anything else that asks `lib_dist.cluster.engine`) finds the rank's communicator. It sees
`sys.argv = [script, *args]`, its own directory first on `sys.path` and the launcher's working
directory as its own, as `python script.py args` would give it; a module (`-m pytest ...`)
sees the working directory first on `sys.path`, as `python -m` gives it. Horovod's
environment variables are set as `horovodrun` sets them (`horovod_environment`), for programs
that read them. `sys.exit(0)` (or `None`) is success; any other exit status, like any
exception, is this rank's failure.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from typing import Any


class ScriptExit(RuntimeError):
    """The script called `sys.exit` with a failing status."""


def run_script(comm: Any, path: str, args: list[str], cwd: str, module: bool = False) -> None:
    """Run the script at `path` (with `module`, the module named `path`) with `args` on this
    rank (`comm` is the rank's communicator, which the script reaches through
    `lib_dist.horovod` or `lib_dist.cluster.engine`)."""
    argv, search_path, here = sys.argv, list(sys.path), os.getcwd()
    environment = dict(os.environ)
    os.environ.update(horovod_environment(comm))
    os.chdir(cwd)
    sys.argv = [path, *args]
    sys.path.insert(0, cwd if module else os.path.dirname(path))
    succeeded = False
    what = path if module else os.path.basename(path)
    try:
        if module:
            runpy.run_module(path, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(path, run_name="__main__")
        succeeded = True
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptExit(f"{what} exited with status {e.code!r}") from None
        succeeded = True
    except BaseException as e:
        raise e if module else e.with_traceback(_from_the_script(e, path))
    finally:
        sys.argv, sys.path[:] = argv, search_path
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(here)
        if succeeded:
            _shut_horovod_down()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()


def horovod_environment(comm: Any) -> dict[str, str]:
    """What `horovodrun` tells each rank in its environment: `HOROVOD_RANK`, `HOROVOD_SIZE`,
    `HOROVOD_LOCAL_RANK` / `_SIZE` (among the ranks on this host, in rank order),
    `HOROVOD_CROSS_RANK` / `_SIZE` (among the ranks with this local rank), `HOROVOD_HOSTNAME`
    and the controller (gloo). Collective: every rank calls it (it gathers the hostnames)."""
    from ..horovod import wire  # the launcher's one use of lib_dist.horovod

    host = socket.gethostname()
    hosts = ([host] if comm.world_size == 1 else
             [b.decode() for b in wire.all_gather_bytes(comm, host.encode())])
    local = [r for r, h in enumerate(hosts) if h == host]
    local_rank = local.index(comm.rank)
    cross = [r for r, h in enumerate(hosts) if hosts[:r].count(h) == local_rank]
    values = dict(RANK=comm.rank, SIZE=comm.world_size, LOCAL_RANK=local_rank,
                  LOCAL_SIZE=len(local), CROSS_RANK=cross.index(comm.rank),
                  CROSS_SIZE=len(cross), HOSTNAME=host, CONTROLLER="gloo",
                  CPU_OPERATIONS="gloo")
    return {f"HOROVOD_{k}": str(v) for k, v in values.items()}


def _from_the_script(e: BaseException, path: str) -> Any:
    """The traceback of `e` from the script's first frame on (without runpy's frames)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    return tb if tb is not None else e.__traceback__


def _shut_horovod_down() -> None:
    """A script that used lib_dist.horovod is shut down as at the end of a process: pending
    operations finish and the timeline, if recorded, is written."""
    hvd = sys.modules.get("lib_dist.horovod")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()
