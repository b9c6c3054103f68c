"""lib_dist's ipyparallel launchers for local clusters: engines forked from one host that
has imported torch (`forked_engines`), and a controller; both take over a process started
ahead of time with the kernel where there is one (`standby`), else start a new one.

They plug in where ipyparallel's own launchers do (as its MPI launcher does: one process,
N engines), so the controller, the client and `%%px` see an ordinary cluster.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

import psutil
from ipyparallel.cluster.launcher import (EngineLauncher, LocalControllerLauncher,
                                          LocalProcessLauncher)

from . import standby


class _TakesOverStandby(LocalProcessLauncher):
    """Claims the kernel's standby of `kind` instead of starting a process, where it can."""

    kind = ""

    def standby_args(self) -> list[str]:
        """The command line's arguments after the words that start the process."""
        raise NotImplementedError

    def start(self) -> None:
        pid = standby.claim(self.kind, self.standby_args(), self.output_file,
                            self.work_dir, dict(os.environ) | self.get_env())
        if pid is None:
            return super().start()
        self.pid, self.process = pid, psutil.Process(pid)
        self.notify_start(pid)
        self._start_waiting()


class ForkedEngineSetLauncher(_TakesOverStandby, EngineLauncher):
    """N engines forked from one process: `forked_engines.main` with `N ARGS`."""

    kind = "engines"

    def find_args(self) -> list[str]:
        return [sys.executable, "-c", standby.ENGINE_HOST, *self.standby_args()]

    def standby_args(self) -> list[str]:
        return [str(self.n), *self.cluster_args, *self.engine_args]

    def start(self, n: int) -> None:  # type: ignore[override]
        self.n = n
        return super().start()


class StandbyControllerLauncher(_TakesOverStandby, LocalControllerLauncher):
    """ipyparallel's local controller, taking over the kernel's standby one if any."""

    kind = "controller"

    def standby_args(self) -> list[str]:
        return [*self.cluster_args, *self.controller_args]


def every_launcher(engine_sets: Iterable[Any]) -> list[Any]:
    """The launchers of a cluster's engine sets: each set's own, or the set itself."""
    found = []
    for es in engine_sets:
        found += list(getattr(es, "launchers", {}).values()) or [es]
    return found


def engine_hosts(engine_sets: Iterable[Any]) -> list[int]:
    """PIDs of the processes that forked local engines (`ForkedEngineSetLauncher`)."""
    return [launcher.process.pid for launcher in every_launcher(engine_sets)
            if isinstance(launcher, ForkedEngineSetLauncher) and launcher.process]


def engine_list_file(controller: Any) -> str:
    """Where a controller records its engines (the profile's log folder): a file ipyparallel
    never deletes, one per cluster ever started."""
    return os.path.join(controller.profile_dir, "log", f"engines{controller.cluster_id}.json")
