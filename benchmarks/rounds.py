"""How every benchmark here times its variants, on a cluster's ranks or in one process:
interleaved rounds.

In each round every variant runs `steps` times, in an order shuffled per round (the same on
every rank: the calls are collective), each from a barrier, so that none always follows the
same predecessor and machine noise falls on all alike. Each rank returns its seconds and CPU
seconds per step, round by round; the caller takes the slowest rank's and the median.

The benchmarks send their measuring functions to the engines by value (cloudpickle): this
module goes with them, as it is not importable there.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Times = dict[str, list[float]]


def interleaved(comm: Any, calls: Mapping[str, Callable[[], object]], rounds: int,
                steps: int = 1) -> tuple[Times, Times]:
    """(seconds, CPU seconds) per step of each call, by round; `comm`'s trace is cleared after
    each round (the timed calls' messages are not needed, and many). `comm` None: one process
    alone, no barrier."""
    import torch.distributed as dist

    seconds: Times = {name: [] for name in calls}
    cpu: Times = {name: [] for name in calls}
    for i in range(rounds):
        order = list(calls)
        random.Random(i).shuffle(order)
        for name in order:
            if comm is not None:
                dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(steps):
                calls[name]()
            seconds[name].append((time.perf_counter() - start) / steps)
            cpu[name].append((time.process_time() - cpu_start) / steps)
        if comm is not None:
            comm.trace.clear()
    return seconds, cpu


def median_ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """The median over rounds of `name`'s time over `base`'s in the same round."""
    return statistics.median(t / b for t, b in zip(times[name], times[base]))
