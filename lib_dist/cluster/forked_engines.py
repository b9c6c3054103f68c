"""Start N local engines as forks of one process that has already imported torch.

Each ipyparallel engine is a Python process that must import torch before it can join a
group: about a CPU-second each, which on a 2-core laptop made 4 engines take over 5 s to be
ready. Here one process imports torch, lib_dist and the engine machinery once, then forks
the N engines, which share those pages copy-on-write. It plugs into ipyparallel as an engine
launcher (the same extension point as its MPI launcher: one process, N engines), so the
controller, the client and `%%px` see ordinary engines. Other launchers are untouched.
"""

from __future__ import annotations

import os
import signal
import sys

from ipyparallel.cluster.launcher import EngineLauncher, LocalProcessLauncher


class ForkedEngineSetLauncher(LocalProcessLauncher, EngineLauncher):
    """ipyparallel engine-set launcher: `python -m lib_dist.cluster.forked_engines N ARGS`."""

    def find_args(self) -> list[str]:
        return ([sys.executable, "-m", "lib_dist.cluster.forked_engines", str(self.n)]
                + self.cluster_args + self.engine_args)

    def start(self, n: int):
        self.n = n
        return super().start()


def main() -> None:
    n, engine_argv = int(sys.argv[1]), sys.argv[2:]
    import lib_dist.cluster.engine  # noqa: F401 - torch, torch.distributed, lib_dist.comm
    from ipyparallel.engine.app import launch_new_instance

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


if __name__ == "__main__":
    main()
