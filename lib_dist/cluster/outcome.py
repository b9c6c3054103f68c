"""What one rank's call comes back as, and how the client waits for every rank's.

`engine.call` returns an `Outcome` on each engine; `Cluster.run` gathers them with `collect`,
which also notices an engine process that died and, once a rank has failed, gives the others
only `FAILURE_GRACE` seconds more (those still waiting on it would wait for the full timeout).
A rank still running near the timeout leaves word in the group's store of what it is blocked
in, for `whereabouts` to read.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ipyparallel as ipp
import torch.distributed as dist

from ..comm import Event
from ..integrity import current
from ..integrity.answers import require_plain

FAILURE_GRACE = 2.0  # seconds the other ranks get to finish once one rank has failed
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DIED = "the engine process died (os._exit, a crash, or out of memory) before the call returned"


@dataclass
class Outcome:
    """One rank's call: its `result` and the `events` of its trace, or an `error` (the
    traceback, from the user's function down) and the `exception`, where it could be sent."""

    result: Any = None
    events: list[Event] = field(default_factory=list)
    error: str | None = None
    exception: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass
class Collected:
    """Every rank's outcome that came back in time, by rank; `hung`: ranks with none."""

    done: dict[int, Outcome]
    failed: dict[int, Outcome]
    hung: list[int]

    def failures(self) -> dict[int, str]:
        return {r: o.error or "" for r, o in self.failed.items()}

    def exceptions(self) -> dict[int, BaseException]:
        return {r: o.exception or RuntimeError(o.error) for r, o in self.failed.items()}

    def results(self, n: int, name: str) -> list[Any]:
        """Every rank's result, by rank; where a lab is graded, only plain data
        (`integrity.answers.require_plain`): a test compares them."""
        results = [self.done[rank].result for rank in range(n)]
        if current.guard() is not None:
            require_plain(results, name)
        return results


def collect(pending: dict[int, Any], timeout: float,
            dead: Callable[[set[int]], list[int]]) -> Collected:
    """Wait for every rank's `AsyncResult` in `pending`, until `timeout`, or `FAILURE_GRACE`
    after a failure. `dead(ranks)`: those of `ranks` whose engine process is gone."""
    done: dict[int, Outcome] = {}
    failed: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout
    while True:
        for rank, ar in pending.items():
            if rank in done or rank in failed or not ar.ready():
                continue
            outcome = _outcome(ar)
            if outcome.failed:
                failed[rank] = outcome
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
            else:
                done[rank] = outcome
        for rank in dead(set(pending) - set(done) - set(failed)):
            failed[rank] = Outcome(error=_DIED, exception=ipp.error.EngineError(_DIED))
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        waiting = [ar for r, ar in pending.items() if r not in done and r not in failed]
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            return Collected(done, failed, [r for r in pending
                                            if r not in done and r not in failed])
        waiting[0].wait(min(0.05, left))


def whereabouts_key(call_id: int, rank: int) -> str:
    return f"lib_dist/whereabouts/{call_id}/{rank}"


def whereabouts(store_address: tuple[str, int], call_id: int,
                ranks: list[int]) -> dict[int, str]:
    """What each of `ranks` reported it was blocked in, read from the group's store."""
    host, port = store_address
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=2))
        keys = {r: whereabouts_key(call_id, r) for r in ranks}
        return {r: store.get(k).decode() for r, k in keys.items() if store.check([k])}
    except RuntimeError:  # rank 0, which hosts the store, may be gone
        return {}


def breaks_the_group(e: BaseException) -> bool:
    """A dead engine, or a failed message: gloo's connections cannot be trusted after it."""
    name = getattr(e, "ename", type(e).__name__)
    return isinstance(e, ipp.error.EngineError) or name in (
        "CommError", "CommTimeout", "DeadlockError", "MismatchError", "PeerFailed",
        "DistBackendError", "DistNetworkError")


def failed_in_communication(e: BaseException) -> bool:
    """A communication error, which a failure of the peer usually explains."""
    return breaks_the_group(e) and not isinstance(e, ipp.error.EngineError)


def _outcome(ar: Any) -> Outcome:
    try:
        outcome: Outcome = ar.get()
        return outcome
    except (ipp.RemoteError, ipp.error.EngineError) as e:
        return Outcome(error=_failure_text(e), exception=e)


def _failure_text(e: BaseException) -> str:
    if isinstance(e, ipp.RemoteError):
        text = e.traceback if isinstance(e.traceback, str) else "\n".join(e.traceback or [])
        return _ANSI.sub("", text) or f"{e.ename}: {e.evalue}"
    return f"the engine died (os._exit, a crash, or out of memory): {e}"
