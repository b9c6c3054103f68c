"""Start N local engines as forks of one process that has already imported torch.

Each ipyparallel engine is a Python process that must import torch before it can join a
group: about a CPU-second each, which on a 2-core laptop made 4 engines take over 5 s to be
ready. Here one process imports torch, lib_dist and the engine machinery once, then forks
the N engines, which share those pages copy-on-write. `launchers.ForkedEngineSetLauncher`
starts this host, or hands the engines to one started in standby with the kernel (`standby`).

    python -c "from lib_dist.cluster.forked_engines import main; main()" N ENGINE_ARGS...
"""

from __future__ import annotations

import importlib
import os
import signal
import sys


# What an engine imports only once it has registered (its kernel's debugger, IPython's
# inspector and history): imported here, they are paid once, not once in every engine.
REGISTRATION_IMPORTS = ("ipykernel.debugger", "IPython.core.completerlib", "IPython.core.logger",
                        "IPython.core.oinspect", "IPython.extensions.storemagic", "sqlite3",
                        "tornado.platform.asyncio", "tornado.queues", "http.server", "pydoc")


def import_engine_modules() -> None:
    """Import what every engine needs, in the host that forks them."""
    import lib_dist.cluster.engine  # noqa: F401 - torch, torch.distributed, lib_dist.comm
    import ipyparallel.engine.app  # noqa: F401

    for name in REGISTRATION_IMPORTS:
        importlib.import_module(name)


def fork_engines(argv: list[str]) -> None:
    """Fork N engines from this process (argv: N ENGINE_ARGS...), pass them SIGTERM and SIGINT, and exit with the
    worst of their exit codes once they have all ended."""
    import_engine_modules()
    from ipyparallel.engine.app import launch_new_instance

    n, engine_argv = int(argv[0]), argv[1:]
    children = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sys.argv = ["ipengine", *engine_argv]
                launch_new_instance()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            finally:
                os._exit(code)
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    worst = 0
    for child in children:
        _, status = os.waitpid(child, 0)
        worst = max(worst, abs(os.waitstatus_to_exitcode(status)))
    sys.exit(worst)


def main() -> None:
    fork_engines(sys.argv[1:])


if __name__ == "__main__":
    main()
