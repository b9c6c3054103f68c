"""Waiting on processes on a busy machine: a slow start is not a failed one.

A wait that is ample on an idle laptop (engines register with the controller in a few seconds)
runs out when other programs share its cores: at a load average near 30 on two cores, four
engines launched by MPI took 112 s to come up. So the waits for processes to start scale with
the load measured while waiting, the one-minute load average over the number of cores (at
least 1, at most `CAP`), and `wait_for_count` keeps waiting while what it counts is still
arriving. A wait that runs out says what it waited for, for how long, and the load it saw.
"""

from __future__ import annotations

import os
import time
from typing import Callable

CAP = 5.0  # a wait is stretched at most five times, however busy the machine


def load_factor() -> float:
    """How many times over this machine's cores are asked for: the one-minute load average
    over the core count, between 1 (idle or lightly used) and `CAP`."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: wait as on an idle machine
        return 1.0
    return min(max(load / (os.cpu_count() or 1), 1.0), CAP)


def stretched(seconds: float) -> float:
    """`seconds` scaled by the machine's load (`load_factor`)."""
    return seconds * load_factor()


def load_seen(factor: float | None = None) -> str:
    """The load, in words, for a message: 'load average 4.4 on 2 cores'."""
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "unknown"
    factor = load_factor() if factor is None else factor
    return f"load average {load} on {os.cpu_count()} cores, the wait stretched x{factor:.1f}"


def wait_for_count(count: Callable[[], int], target: int, seconds: float, what: str,
                   details: Callable[[], str] = lambda: "", poll: float = 0.05) -> float:
    """Poll `count()` until it reaches `target`; return the seconds waited.

    The wait is `seconds` stretched by the highest load factor seen meanwhile, counted from the
    last time the count grew (things still arriving are not stuck), and never longer than
    `seconds * CAP` in all. Past it, raises `TimeoutError` saying how many of `what` arrived,
    after how long, the load, and `details()`.
    """
    start = last_growth = time.monotonic()
    seen, factor = 0, load_factor()
    while True:
        got = count()
        now = time.monotonic()
        if got >= target:
            return now - start
        if got > seen:
            seen, last_growth = got, now
        factor = max(factor, load_factor())
        if now > min(last_growth + seconds * factor, start + seconds * CAP):
            more = details()
            raise TimeoutError(
                f"only {got} of {target} {what} within {now - start:.1f} s (the wait: "
                f"{seconds:g} s, counted again from each arrival; {load_seen(factor)}; "
                f"at most {seconds * CAP:g} s in all)" + (f"\n{more}" if more else ""))
        time.sleep(poll)
