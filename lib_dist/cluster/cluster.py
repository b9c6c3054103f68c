"""Ranks of a torch.distributed group, one per ipyparallel engine.

    with Cluster(4) as cluster:                 # 4 engines, one process group
        sums = cluster.run(my_fn, 10)           # my_fn(comm, 10) on every rank, by rank

`Cluster` starts the engines with ipyparallel's own launchers (local processes by default;
pass `engines="mpi"`, `"slurm"`, `"ssh"` ... and their options through `ipp_options`), gives
each engine an explicit rank and device, and joins them into one group (gloo on CPU, NCCL
when every rank owns a GPU). In IPython it also activates `%%px`, where each engine sees
`comm`, `rank`, `world_size` and `device`.

What can go wrong is reported by rank: an exception on any rank raises `RankFailure` with
the remote tracebacks; a call that does not finish within its timeout raises `RankTimeout`
naming the ranks that hung, after the engines were restarted and the group rebuilt, so the
same cluster runs the next call. Processes never outlive the cluster, nor do the files they
write: `stop()` ends them, as do leaving the `with` block, interpreter exit, and, through a
watchdog process, the death of the kernel itself.
"""

from __future__ import annotations

import atexit
import logging
import socket
import weakref
from typing import Any, Callable

import ipyparallel as ipp
import torch

from ..comm import Trace
from ..errors import RankFailure, RankTimeout
from ..patience import CAP, stretched
from . import engine
from .arrivals import end_stragglers, start_more, wait_for_engines
from .launchers import (ForkedEngineSetLauncher, StandbyControllerLauncher, engine_hosts,
                        engine_list_file)
from .outcome import breaks_the_group, collect, failed_in_communication, whereabouts
from .placement import assign_devices, check_gpus
from .reaper import Watchdog, kill_now, running
from .sending import check_sendable

DEFAULT_TIMEOUT = 60.0
_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """`n` engines, each one rank of a torch.distributed group. See the module docstring.

    n: number of ranks (engines), at least 1.
    device: "auto" (GPU i for local rank i when every rank has a GPU, else CPU), "cpu"
        or "cuda" (an error when there are fewer GPUs than ranks on a host).
    timeout: seconds for group rendezvous, for each collective, and the default per `run`.
    heartbeat_ms: the controller's heartbeat period. A new engine counts as registered on
        its first heartbeat, so ipyparallel's 3000 ms default dominates start-up time; an
        engine is declared dead after 5 s without one (longer on a busy machine), whatever
        the period.
    ipp_options: passed to `ipyparallel.Cluster`, e.g. `{"engines": "mpi"}`.
    """

    def __init__(self, n: int, *, device: str = "auto", timeout: float = DEFAULT_TIMEOUT,
                 heartbeat_ms: int = 200, ipp_options: dict[str, Any] | None = None):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"a cluster needs at least one rank: n must be an integer >= 1, "
                             f"got {n!r}")
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
        options = dict(ipp_options or {})
        options.setdefault("engines", ForkedEngineSetLauncher)
        # No cluster file: one a killed kernel left tripped ipcluster's and JupyterLab's lists.
        options.setdefault("cluster_file", "")
        local = options["engines"] in ("local", ForkedEngineSetLauncher)
        if device == "cuda" and local:
            check_gpus(n, torch.cuda.device_count() if torch.cuda.is_available() else 0,
                       "this machine")
        if local:  # engines read the controller's file themselves: start them at once
            options.setdefault("send_engines_connection_env", False)
            options.setdefault("controller", StandbyControllerLauncher)
        self.n, self.device, self.timeout = n, device, timeout
        self.trace = Trace()
        self.ranks: list[dict[str, Any]] = []  # by rank: engine id, host, pid, device
        self.backend: str | None = None
        # On a busy machine the controller may answer an engine's registration or the client's
        # connection, and hear an engine's first heartbeat (and an engine the controller's),
        # minutes late: ipyparallel's 5 s, 10 s, 30 s and 35 s would drop them for good.
        self._patience = patience = max(timeout, 60) * CAP
        self._ipp = ipp.Cluster(
            n=n, delay=0, shutdown_atexit=False, log_level=logging.ERROR,
            controller_args=[f"--HeartMonitor.period={heartbeat_ms}",
                             f"--HeartMonitor.max_heartmonitor_misses="
                             f"{stretched(5000) // heartbeat_ms:.0f}",
                             f"--IPController.registration_timeout={patience:.0f}",
                             "--log-level=WARN"],
            **options)
        # Every launcher reads these; a nanny process per engine would only slow start-up.
        self._ipp.config.EngineLauncher.engine_args = [
            "--log-level=WARN", "--IPEngine.enable_nanny=False",
            f"--IPEngine.wait_for_url_file={patience:g}", f"--IPEngine.timeout={patience:g}",
            f"--IPEngine.max_heartbeat_misses={patience * 1000 // (heartbeat_ms + 500):.0f}",
            "--IPEngine.startup_command=import lib_dist.cluster.engine"]
        self._client: ipp.Client | None = None
        self._calls = 0
        self._store_address: tuple[str, int] = ("127.0.0.1", 0)
        self._watchdog = Watchdog()

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start the controller and engines and join them into one group. Returns self."""
        if self._client is not None:
            return self
        _live.add(self)
        self._watchdog.start()
        try:
            self._ipp.start_controller_sync()
            self._watchdog.watch(self._ipp.controller)
            self._watchdog.delete_at_end(engine_list_file(self._ipp.controller))
            self._launch_engines()  # local ones import torch while the controller starts
            self._client = self._ipp.connect_client_sync(timeout=self._patience)
            self._join_engines(before=set())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every engine and the controller. Safe to call twice."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._kill_local_engines()
        for step in (self._ipp.stop_engines_sync, self._ipp.stop_controller_sync):
            try:
                step()
            except Exception:  # noqa: BLE001 - the reaper below finishes the job
                pass
        self._watchdog.stop()
        self.ranks = []
        _live.discard(self)

    def restart(self) -> None:
        """Replace every engine with a fresh one and rebuild the group."""
        client = self._require_started()
        self._kill_local_engines()
        self._ipp.stop_engines_sync()
        before = set(client.ids)
        self._launch_engines()
        self._join_engines(before)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- running code on every rank ----------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call `fn(comm, *args, **kwargs)` on every rank; return the results by rank.

        Raises `RankFailure` if any rank raised, and `RankTimeout` naming the ranks that
        had not finished after `timeout` s (default: the cluster's, stretched by the load; one
        given is kept). Ranks waiting on a failed rank get a few seconds before they count as
        hung; after a hang or a communication error, the engines are restarted, group rebuilt.
        """
        __tracebackhide__ = True  # IPython shows the student's call, then the rank's error
        return self._run(fn, args, kwargs, timeout)

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             timeout: float | None, watch: Callable[[dict[int, Any]], Any] | None = None,
             restart: bool = True) -> list[Any]:
        """`run`. `watch(pending)` (`streaming`) gets each rank's AsyncResult and returns an
        object whose `stop(final)` is called once they are in. `restart=False` leaves the
        engines as they are after a hang or a broken group."""
        __tracebackhide__ = True
        client = self._require_started()
        check_sendable(fn, args, kwargs)
        timeout = stretched(self.timeout) if timeout is None else timeout  # busy: longer
        self._calls += 1
        pending = {rank: client[info["engine"]].apply_async(
            engine.call, fn, args, kwargs, self._calls, timeout * 0.9)
            for rank, info in enumerate(self.ranks)}
        stop_watching = watch(pending).stop if watch is not None else lambda final: None
        try:
            got = collect(pending, timeout, self._dead_engines)
        except KeyboardInterrupt:  # the kernel was interrupted: engines may still be busy
            stop_watching(final=False)
            if restart:
                self.restart()
            raise
        stop_watching(final=True)
        exceptions = got.exceptions()
        where = (whereabouts(self._store_address, self._calls, got.hung)
                 if got.hung and not got.failed else {})
        if restart and (got.hung or any(breaks_the_group(e) for e in exceptions.values())):
            self.restart()
        if got.failed:
            raise RankFailure(got.failures(), exceptions, still_running=got.hung, consequences={
                r for r, e in exceptions.items() if failed_in_communication(e)})
        if got.hung:
            raise RankTimeout(got.hung, timeout, where)
        self.trace = Trace.merge([Trace(list(o.events)) for o in got.done.values()])
        return got.results(self.n, getattr(fn, "__qualname__", "the function on the ranks"))

    def _dead_engines(self, ranks: set[int]) -> list[int]:
        """Ranks whose engine process on this host is gone (faster than the heartbeat)."""
        here = socket.gethostname()
        return [r for r in sorted(ranks) if self.ranks[r]["host"] == here
                and not running(self.ranks[r]["pid"])]

    # -- helpers -----------------------------------------------------------------------------

    @property
    def client(self) -> ipp.Client:
        return self._require_started()

    @property
    def view(self) -> ipp.DirectView:
        """A blocking view of every engine, in rank order (what `%%px` uses)."""
        view = self.client[[info["engine"] for info in self.ranks]]
        view.block = True
        return view

    def pids(self) -> set[int]:
        """PIDs of the controller and every engine (for checking that nothing is left)."""
        found = {info["pid"] for info in self.ranks}
        controller = getattr(self._ipp.controller, "process", None)
        if controller is not None:
            found.add(controller.pid)
        return found

    def _launch_engines(self) -> None:
        start_more(self._ipp, self._watchdog, self.n)

    def _join_engines(self, before: set[int]) -> None:
        """Wait for the engines launched (those not in `before`), longer on a busy machine,
        stragglers replaced (`arrivals`); describe them, give each a rank and a device, and
        join them into one group. A TimeoutError says how many came, after how long, the load."""
        replaced = wait_for_engines(
            lambda: len(set(self.client.ids) - before), self.n, max(self.timeout, 60),
            lambda count: start_more(self._ipp, self._watchdog, count),
            lambda: f"engine output:\n{self._engine_output()}")
        ids = sorted(set(self.client.ids) - before)[: self.n]
        infos = self.client[ids].apply_async(engine.describe).get(stretched(self.timeout))
        self.ranks = [dict(info, engine=eid) for eid, info in zip(ids, infos)]
        for info in self.ranks:
            if info["host"] == self.ranks[0]["host"]:
                self._watchdog.watch_pid(info["pid"])
        assign_devices(self.ranks, self.device)
        if replaced:
            end_stragglers(self._ipp, self.ranks)
        self._join_group()
        self.view.use_cloudpickle()
        self._activate_px()

    def _join_group(self) -> None:
        rank0 = self.ranks[0]
        port = self.client[rank0["engine"]].apply_sync(engine.open_store, self.n, self.timeout)
        host = ("127.0.0.1" if all(i["host"] == rank0["host"] for i in self.ranks)
                else rank0["host"])
        self._store_address = (host, port)
        joins = [self.client[info["engine"]].apply_async(
            engine.join, rank, self.n, host, port, info["device"], self.timeout)
            for rank, info in enumerate(self.ranks)]  # all at once: rendezvous blocks
        backends = [j.get(stretched(self.timeout + 5)) for j in joins]
        self.backend = backends[0]

    def _activate_px(self) -> None:
        from IPython import get_ipython

        if get_ipython() is not None:
            self.view.activate()

    def _kill_local_engines(self) -> None:
        """SIGKILL this host's engines, and the process that forked them: a rank stuck in a
        collective ignores SIGTERM, and ipyparallel would wait for it."""
        here = socket.gethostname()
        kill_now([info["pid"] for info in self.ranks if info["host"] == here]
                 + engine_hosts(self._ipp.engines.values()))

    def _engine_output(self) -> str:
        return "\n".join(es.get_output() for es in self._ipp.engines.values())[-4000:]

    def _require_started(self) -> ipp.Client:
        if self._client is None:
            raise RuntimeError("the cluster is not running: call start() or use `with Cluster(n)`")
        return self._client

    def __repr__(self) -> str:
        state = f"{len(self.ranks)} ranks, {self.backend}" if self._client else "stopped"
        return f"Cluster(n={self.n}, {state})"


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live):
        cluster.stop()
