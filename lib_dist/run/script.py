"""What each rank runs for `python -m lib_dist.run`: the user's script, as `__main__`.

The script runs inside the rank's engine process, where `lib_dist.horovod.init()` (and
anything else that asks `lib_dist.cluster.engine`) finds the rank's communicator. It sees
`sys.argv = [script, *args]`, its own directory first on `sys.path` and the launcher's working
directory as its own, as `python script.py args` would give it. `sys.exit(0)` (or `None`) is
success; any other exit status, like any exception, is this rank's failure.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any


class ScriptExit(RuntimeError):
    """The script called `sys.exit` with a failing status."""


def run_script(comm: Any, path: str, args: list[str], cwd: str) -> None:
    """Run the script at `path` with `args` on this rank (`comm` is the rank's communicator,
    which the script reaches through `lib_dist.horovod` or `lib_dist.cluster.engine`)."""
    argv, search_path, here = sys.argv, list(sys.path), os.getcwd()
    os.chdir(cwd)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    succeeded = False
    try:
        runpy.run_path(path, run_name="__main__")
        succeeded = True
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptExit(f"{os.path.basename(path)} exited with status {e.code!r}") from None
        succeeded = True
    except BaseException as e:
        raise e.with_traceback(_from_the_script(e, path))
    finally:
        sys.argv, sys.path[:] = argv, search_path
        os.chdir(here)
        if succeeded:
            _shut_horovod_down()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()


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
