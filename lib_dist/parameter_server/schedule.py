"""Deterministic asynchrony: in which order gradients reach the server, and how stale each is.

Threads and processes finish in whatever order the machine lets them, so asynchronous SGD is
studied here on a virtual clock. Worker w takes `durations[w]` units per gradient; the server
applies a gradient the moment it arrives and sends the worker fresh parameters at once.
`arrival_schedule` plays that out and returns the order of the updates, which a parameter
server can then follow (`serve(..., schedule=...)`) or `replay_async` can run in one process.

Staleness of an update: how many updates the server applied between the worker's pull and
its push. With W equally fast workers in turn it is W - 1 from the second round on.

Bounded staleness (SSP, Ho et al. 2013) sits between the synchronous and the asynchronous
server: a worker may start its next gradient only while it is at most `bound` gradients ahead
of the slowest worker. bound = 0 keeps the workers in lock step, bound = None never waits.

Backup workers (Chen et al. 2016): a synchronous step waits for its slowest worker; with b
spare workers it takes the first W of W + b gradients and drops the rest.

A worker that dies (`fails_after`, `dead`) pushes nothing more: the asynchronous server goes
on with the others, a bounded one stops once every live worker is `bound` gradients ahead of
it, a synchronous step without a spare worker never completes.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def staleness_of(order: Sequence[int]) -> list[int]:
    """The staleness of each update when the updates come in `order` (worker ids) and every
    worker pulls right after its push, all starting from version 0."""
    version, out = 0, []
    pulled: dict[int, int] = {}
    for w in order:
        out.append(version - pulled.get(w, 0))
        version += 1
        pulled[w] = version
    return out


def round_robin(workers: Sequence[int], steps: int) -> list[int]:
    """Each worker in turn, `steps` times: equally fast workers."""
    return [w for _ in range(steps) for w in workers]


@dataclass(frozen=True)
class Schedule:
    """`order`: the worker of each update; `times`: the virtual time it was applied;
    `staleness`: its staleness; `waited`: the virtual time each worker spent blocked;
    `stalled`: the live workers left waiting forever (on a dead worker) when updates stopped."""

    order: list[int]
    times: list[float]
    staleness: list[int]
    waited: list[float]
    stalled: list[int] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return self.times[-1] if self.times else 0.0


def arrival_schedule(durations: Sequence[float], steps: int, bound: int | None = None,
                     workers: Sequence[int] | None = None,
                     fails_after: dict[int, int] | None = None) -> Schedule:
    """Play out `steps` gradients of each worker (durations[i] virtual units each) against an
    asynchronous server, with staleness bounded by `bound` (SSP) or not (None). `workers`:
    the ids to report (default 0 .. W-1). `fails_after`: worker id -> the number of gradients
    it pushes before it dies. Ties go to the lower index."""
    ids = list(workers) if workers is not None else list(range(len(durations)))
    if len(ids) != len(durations) or any(d <= 0 for d in durations):
        raise ValueError("give one positive duration per worker")
    limit = [min(steps, (fails_after or {}).get(w, steps)) for w in ids]
    done = [0] * len(ids)
    blocked_since: dict[int, float] = {}
    waited = [0.0] * len(ids)
    running = [(durations[i], i) for i in range(len(ids)) if limit[i] > 0]
    heapq.heapify(running)
    order, times = [], []
    while running:
        now, i = heapq.heappop(running)
        done[i] += 1
        order.append(ids[i])
        times.append(now)
        if done[i] < limit[i]:
            blocked_since[i] = now
        for j in sorted(blocked_since):
            if bound is None or done[j] - min(done) <= bound:
                waited[j] += now - blocked_since.pop(j)
                heapq.heappush(running, (now + durations[j], j))
    return Schedule(order, times, staleness_of(order), waited,
                    stalled=[ids[j] for j in sorted(blocked_since)])


def step_times_with_backups(workers: int, backups: int, steps: int, *, mean: float = 1.0,
                            straggler_chance: float = 0.05, slowdown: float = 4.0,
                            seed: int = 0, dead: int = 0) -> torch.Tensor:
    """Virtual time of each synchronous step that waits for the first `workers` of
    `workers + backups` gradients. A gradient takes `mean` times an exponential-tailed factor
    (1 + Exp(0.1)), and with probability `straggler_chance` `slowdown` times more. `dead` of
    the workers never answer (their time is inf): a step needing one of them is inf."""
    columns = []
    for worker in range(workers + backups):  # one stream per worker: a backup adds a column
        g = torch.Generator().manual_seed(seed * 100_003 + worker)
        base = mean * (1 + torch.empty(steps, dtype=torch.float64).exponential_(10.0,
                                                                               generator=g))
        slow = torch.rand(steps, generator=g, dtype=torch.float64) < straggler_chance
        took = torch.where(slow, base * slowdown, base)
        columns.append(torch.full_like(took, torch.inf) if worker < dead else took)
    return torch.stack(columns, 1).sort(dim=1).values[:, workers - 1]
