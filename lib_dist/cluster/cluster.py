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
same cluster runs the next call. Processes never outlive the cluster: `stop()` ends them,
as do leaving the `with` block, interpreter exit, and, through a watchdog process, the death
of the kernel itself.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import re
import socket
import subprocess
import sys
import time
import weakref
from typing import Any, Callable

import cloudpickle
import ipyparallel as ipp
import psutil
import torch
import torch.distributed as dist

from ..comm import Trace
from ..errors import RankFailure, RankTimeout
from . import engine
from .forked_engines import ForkedEngineSetLauncher

DEFAULT_TIMEOUT = 60.0
FAILURE_GRACE = 2.0  # seconds the other ranks get to finish once one rank has failed
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """`n` engines, each one rank of a torch.distributed group. See the module docstring.

    n: number of ranks (engines), at least 1.
    device: "auto" (GPU i for local rank i when every rank has a GPU, else CPU), "cpu"
        or "cuda" (an error when there are fewer GPUs than ranks on a host).
    timeout: seconds for group rendezvous, for each collective, and the default per `run`.
    heartbeat_ms: the controller's heartbeat period. A new engine counts as registered on
        its first heartbeat, so ipyparallel's 3000 ms default dominates start-up time; an
        engine is declared dead after 5 s without one, whatever the period.
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
        if device == "cuda" and options["engines"] in ("local", ForkedEngineSetLauncher):
            _check_gpus(n, torch.cuda.device_count() if torch.cuda.is_available() else 0,
                        "this machine")
        self.n, self.device, self.timeout = n, device, timeout
        self.trace = Trace()
        self.ranks: list[dict[str, Any]] = []  # by rank: engine id, host, pid, device
        self.backend: str | None = None
        self._ipp = ipp.Cluster(
            n=n, delay=0, shutdown_atexit=False, log_level=logging.ERROR,
            controller_args=[f"--HeartMonitor.period={heartbeat_ms}",
                             f"--HeartMonitor.max_heartmonitor_misses={5000 // heartbeat_ms}",
                             "--log-level=WARN"],
            **options)
        # Every launcher reads these; a nanny process per engine would only slow start-up.
        self._ipp.config.EngineLauncher.engine_args = [
            "--log-level=WARN", "--IPEngine.enable_nanny=False",
            "--IPEngine.startup_command=import lib_dist.cluster.engine"]
        self._client: ipp.Client | None = None
        self._calls = 0
        self._store_address: tuple[str, int] = ("127.0.0.1", 0)
        self._reaper: subprocess.Popen | None = None

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start the controller and engines and join them into one group. Returns self."""
        if self._client is not None:
            return self
        _live.add(self)
        self._reaper = subprocess.Popen([sys.executable, "-m", "lib_dist.cluster.reaper"],
                                        stdin=subprocess.PIPE, text=True,
                                        start_new_session=True)
        try:
            self._ipp.start_controller_sync()
            self._watch(self._ipp.controller)
            self._client = self._ipp.connect_client_sync()
            self._start_engines()
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
        if self._reaper is not None:
            self._reaper.stdin.close()
            self._reaper.wait(10)
            self._reaper = None
        self.ranks = []
        _live.discard(self)

    def restart(self) -> None:
        """Replace every engine with a fresh one and rebuild the group."""
        self._kill_local_engines()
        self._ipp.stop_engines_sync()
        self._start_engines()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- running code on every rank ----------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            **kwargs: Any) -> list[Any]:
        """Call `fn(comm, *args, **kwargs)` on every rank; return the results by rank.

        Raises `RankFailure` if any rank raised, and `RankTimeout` naming the ranks that
        had not finished after `timeout` seconds (default: the cluster's). When a rank fails
        while others wait on it, those get a few seconds before they count as hung. After a
        hang or a communication error the engines are restarted and the group rebuilt.
        """
        self._require_started()
        _check_sendable(fn, args, kwargs)
        timeout = self.timeout if timeout is None else timeout
        self._calls += 1
        pending = {rank: self._client[info["engine"]].apply_async(
            engine.call, fn, args, kwargs, self._calls, timeout * 0.9)
            for rank, info in enumerate(self.ranks)}
        try:
            done, failures, exceptions = self._collect(pending, timeout)
        except KeyboardInterrupt:  # the kernel was interrupted: engines may still be busy
            self.restart()
            raise
        hung = [rank for rank in pending if rank not in done and rank not in failures]
        whereabouts = self._whereabouts(self._calls, hung) if hung and not failures else {}
        if hung or any(_breaks_the_group(e) for e in exceptions.values()):
            self.restart()
        if failures:
            raise RankFailure(failures, exceptions, still_running=hung, consequences={
                r for r, e in exceptions.items() if _failed_in_communication(e)})
        if hung:
            raise RankTimeout(hung, timeout, whereabouts)
        self.trace = Trace.merge([Trace(list(d["events"])) for d in done.values()])
        return [done[rank]["result"] for rank in range(self.n)]

    def _whereabouts(self, call_id: int, ranks: list[int]) -> dict[int, str]:
        """What each hung rank reported it was blocked in, read from the group's store."""
        host, port = self._store_address
        try:
            store = dist.TCPStore(host, port, is_master=False,
                                  timeout=datetime.timedelta(seconds=2))
            keys = {r: engine.whereabouts_key(call_id, r) for r in ranks}
            return {r: store.get(k).decode() for r, k in keys.items() if store.check([k])}
        except RuntimeError:  # rank 0, which hosts the store, may be gone
            return {}

    def _collect(self, pending: dict[int, Any], timeout: float):
        """Wait for every rank's result, until `timeout`, or `FAILURE_GRACE` after a failure."""
        done: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = {}
        exceptions: dict[int, BaseException] = {}
        deadline = time.monotonic() + timeout
        while True:
            for rank, ar in pending.items():
                if rank in done or rank in failures or not ar.ready():
                    continue
                try:
                    outcome = ar.get()
                except (ipp.RemoteError, ipp.error.EngineError) as e:
                    outcome = {"error": _failure_text(e), "exception": e}
                if "error" in outcome:
                    failures[rank] = outcome["error"]
                    exceptions[rank] = outcome["exception"] or RuntimeError(outcome["error"])
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
                else:
                    done[rank] = outcome
            for rank in self._dead_engines(set(pending) - set(done) - set(failures)):
                failures[rank] = ("the engine process died (os._exit, a crash, or out of "
                                  "memory) before the call returned")
                exceptions[rank] = ipp.error.EngineError(failures[rank])
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
            waiting = [ar for r, ar in pending.items() if r not in done and r not in failures]
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                return done, failures, exceptions
            waiting[0].wait(min(0.05, left))

    def _dead_engines(self, ranks: set[int]) -> list[int]:
        """Ranks whose engine process on this host is gone (faster than the heartbeat)."""
        here = socket.gethostname()
        return [r for r in sorted(ranks) if self.ranks[r]["host"] == here
                and not _running(self.ranks[r]["pid"])]

    # -- helpers -----------------------------------------------------------------------------

    @property
    def client(self) -> ipp.Client:
        self._require_started()
        return self._client

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

    def _start_engines(self) -> None:
        before = set(self._client.ids)
        self._ipp.start_engines_sync(self.n)
        for launcher in _launchers(self._ipp.engines.values()):
            self._watch(launcher)
        ids = self._wait_for_new_engines(before)
        infos = self.view_of(ids).apply_async(engine.describe).get(self.timeout)
        self.ranks = [dict(info, engine=eid) for eid, info in zip(ids, infos)]
        for info in self.ranks:
            if info["host"] == self.ranks[0]["host"]:
                self._watch_pid(info["pid"])
        self._assign_devices()
        self._join_group()
        self.view.use_cloudpickle()
        self._activate_px()

    def view_of(self, ids: list[int]) -> ipp.DirectView:
        view = self._client[ids]
        view.block = False
        return view

    def _wait_for_new_engines(self, before: set[int]) -> list[int]:
        deadline = time.monotonic() + max(self.timeout, 60)
        while True:
            new = sorted(set(self._client.ids) - before)
            if len(new) >= self.n:
                return new[: self.n]
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(new)} of {self.n} engines registered within "
                    f"{max(self.timeout, 60):g} s; engine output:\n{self._engine_output()}")
            time.sleep(0.05)

    def _assign_devices(self) -> None:
        hosts: dict[str, int] = {}
        for info in self.ranks:
            info["local_rank"] = hosts[info["host"]] = hosts.get(info["host"], -1) + 1
        if self.device == "cuda":
            for host, count in hosts.items():
                gpus = next(i["gpus"] for i in self.ranks if i["host"] == host)
                _check_gpus(count + 1, gpus, f"host {host}")
        use_gpu = self.device == "cuda" or (
            self.device == "auto" and all(i["local_rank"] < i["gpus"] for i in self.ranks))
        for info in self.ranks:
            info["device"] = f"cuda:{info['local_rank']}" if use_gpu else "cpu"

    def _join_group(self) -> None:
        rank0 = self.ranks[0]
        port = self._client[rank0["engine"]].apply_sync(engine.open_store, self.n, self.timeout)
        host = ("127.0.0.1" if all(i["host"] == rank0["host"] for i in self.ranks)
                else rank0["host"])
        self._store_address = (host, port)
        joins = [self._client[info["engine"]].apply_async(
            engine.join, rank, self.n, host, port, info["device"], self.timeout)
            for rank, info in enumerate(self.ranks)]  # all at once: rendezvous blocks
        backends = [j.get(self.timeout + 5) for j in joins]
        self.backend = backends[0]

    def _activate_px(self) -> None:
        from IPython import get_ipython

        if get_ipython() is not None:
            self.view.activate()

    def _watch(self, launcher: Any) -> None:
        process = getattr(launcher, "process", None)
        if process is not None:
            self._watch_pid(process.pid)

    def _watch_pid(self, pid: int) -> None:
        if self._reaper is None:
            return
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return
        self._reaper.stdin.write(f"{pid} {created}\n")
        self._reaper.stdin.flush()

    def _kill_local_engines(self) -> None:
        """SIGKILL engines on this host: a rank stuck in a collective ignores SIGTERM."""
        from .reaper import kill_trees

        local = {}
        for info in self.ranks:
            try:
                local[info["pid"]] = psutil.Process(info["pid"]).create_time()
            except psutil.NoSuchProcess:
                pass
        kill_trees(local, grace=0)

    def _engine_output(self) -> str:
        return "\n".join(es.get_output() for es in self._ipp.engines.values())[-4000:]

    def _require_started(self) -> None:
        if self._client is None:
            raise RuntimeError("the cluster is not running: call start() or use `with Cluster(n)`")

    def __repr__(self) -> str:
        state = f"{len(self.ranks)} ranks, {self.backend}" if self._client else "stopped"
        return f"Cluster(n={self.n}, {state})"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _check_gpus(ranks: int, gpus: int, where: str) -> None:
    if ranks > gpus:
        raise ValueError(f"{ranks} GPU ranks requested on {where}, which has {gpus} GPU"
                         f"{'' if gpus == 1 else 's'}; use fewer ranks or device='cpu'")


def _check_sendable(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Fail early, with advice, on what the engines could not receive."""
    if not callable(fn):
        raise TypeError(f"run() needs a function fn(comm, ...), got {type(fn).__name__}")
    _send_by_value(fn)
    try:
        cloudpickle.dumps((fn, args, kwargs))
    except Exception as e:  # noqa: BLE001 - anything pickling raises
        raise TypeError(
            f"cannot send {getattr(fn, '__name__', fn)!r} or its arguments to the engines: {e}. "
            f"Functions and arguments must be picklable: avoid capturing open files, locks, "
            f"sockets or generators; create those inside the function instead.") from e


def _send_by_value(fn: Callable[..., Any]) -> None:
    """Send functions from scripts and test files as code, like those of a notebook.

    cloudpickle sends a function by reference (module and name) when its module was
    imported, but an engine may not find a module that is not installed.
    """
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None) or ""
    installed = ("site-packages" in path or path.startswith(sys.base_prefix)
                 or module is None or module.__name__.split(".")[0] in ("lib_dist", "__main__"))
    if not installed:
        cloudpickle.register_pickle_by_value(module)


def _launchers(engine_sets: Any) -> list[Any]:
    found = []
    for es in engine_sets:
        found += list(getattr(es, "launchers", {}).values()) or [es]
    return found


def _failure_text(e: BaseException) -> str:
    if isinstance(e, ipp.RemoteError):
        text = e.traceback if isinstance(e.traceback, str) else "\n".join(e.traceback or [])
        return _ANSI.sub("", text) or f"{e.ename}: {e.evalue}"
    return f"the engine died (os._exit, a crash, or out of memory): {e}"


def _failed_in_communication(e: BaseException) -> bool:
    """A communication error, which a failure of the peer usually explains."""
    return _breaks_the_group(e) and not isinstance(e, ipp.error.EngineError)


def _breaks_the_group(e: BaseException) -> bool:
    """A dead engine, or a failed message: gloo's connections cannot be trusted after it."""
    name = getattr(e, "ename", type(e).__name__)
    return isinstance(e, ipp.error.EngineError) or name in (
        "CommError", "CommTimeout", "DeadlockError", "MismatchError", "PeerFailed",
        "DistBackendError", "DistNetworkError")


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live):
        cluster.stop()
