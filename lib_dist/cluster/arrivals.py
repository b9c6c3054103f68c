"""Waiting for a cluster's engines to register, and replacing one that never does.

The engines of a cluster are forked together and register within a second or two of each
other. Twice, on a loaded CI machine, one of four never registered while the other three
did; its output stopped before registering, with no error. Waiting longer does not help such
an engine. So once the first engine has come (which may take minutes on a busy machine: the
patience), the others get `STALL` seconds from each arrival, stretched by the load; past
that, as many fresh engines as are missing are started in their place, once, and waited for
with the whole patience. The cluster ends the stragglers once it knows its ranks.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

import psutil

from ..patience import wait_for_count
from .launchers import engine_hosts, every_launcher
from .reaper import kill_now

STALL = 20.0  # s: how long engines forked together may register apart, on an idle machine
WHAT = "engines registered with the controller"


def wait_for_engines(count: Callable[[], int], n: int, patience: float,
                     start_more: Callable[[int], None], details: Callable[[], str]) -> bool:
    """Wait until `count()` reaches `n`; `start_more(k)` starts k more engines when some have
    registered and the rest stalled. True when it had to; a TimeoutError when even they fail."""
    wait_for_count(count, 1, patience, WHAT, details)  # the first: minutes on a busy machine
    try:
        wait_for_count(count, n, STALL, WHAT, details)
        return False
    except TimeoutError:
        start_more(n - count())
    wait_for_count(count, n, patience, WHAT, details)
    return True


def start_more(cluster: Any, watchdog: Any, count: int) -> None:
    """Start `count` more engines in the ipyparallel `cluster`, watched by `watchdog`."""
    launched = cluster.start_engines_sync(count)
    for launcher in every_launcher([cluster.engines[launched]]):
        watchdog.watch(launcher)


def end_stragglers(cluster: Any, ranks: list[dict[str, Any]]) -> None:
    """End this host's engines (children of `cluster`'s engine hosts) that are no rank's."""
    here = socket.gethostname()
    mine = {info["pid"] for info in ranks if info["host"] == here}
    found = []
    for host in engine_hosts(cluster.engines.values()):
        try:
            found += [c.pid for c in psutil.Process(host).children() if c.pid not in mine]
        except psutil.NoSuchProcess:
            pass
    kill_now(found)
