"""An asynchronous parameter server that goes on when a worker dies.

A synchronous server waits for every worker's gradient every step, so a worker that dies stops
it, exactly as a dead rank stops an all-reduce. The plain asynchronous server (`serve`) does
not wait for the others, but it still expects `steps` gradients from every worker and ends only
when they have all arrived. `serve_tolerant` is asynchronous SGD that also lets a worker go:

- it applies whichever gradient arrives first, as `serve(mode="async")` does;
- when no gradient has arrived for `patience` seconds, it waits on the workers still expected,
  one at a time: a live one answers (its gradient is applied, and first come resumes), a dead
  one makes the wait fail (`CommError`: the simulated world knows the rank has ended; on a real
  group the transport reports the closed connection, or the group's timeout expires), and that
  worker is dropped. The others keep updating the parameters.

It records (worker, staleness) for every gradient applied, so a run is checked as the plain
asynchronous server's is: `replay_async` of the recorded order gives its parameters exactly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..comm import CommError, Communicator, Handle

PATIENCE = 0.05  # seconds without any gradient before the server checks who is still there


@dataclass
class Served:
    """What a tolerant server did: (worker, staleness) of every gradient it applied, in order,
    and the workers it dropped, with how many of their gradients it had applied."""

    applied: list[tuple[int, int]] = field(default_factory=list)
    lost: dict[int, int] = field(default_factory=dict)


@torch.no_grad()
def serve_tolerant(comm: Communicator, shard: torch.Tensor, workers: Sequence[int],
                   steps: int, lr: float, patience: float = PATIENCE) -> Served:
    """Serve `shard` (updated in place) asynchronously to `workers`, up to `steps` gradients
    from each, dropping any worker whose connection fails. See the module docstring."""
    served = Served()
    version, pulled = 0, dict.fromkeys(workers, 0)
    left = dict.fromkeys(workers, steps)
    sends: dict[int, list[tuple[Handle, torch.Tensor]]] = {w: [] for w in workers}
    for w in workers:
        sends[w].append(_send_copy(comm, shard, w))
    pending = {w: _post(comm, shard, w) for w in workers if steps > 0}
    while pending:
        arrived = _first_completed(pending, patience)
        for w in [arrived] if arrived is not None else list(pending):
            handle, grad = pending.pop(w)
            try:
                handle.wait()
            except CommError:
                served.lost[w] = steps - left[w]
                continue
            tau = version - pulled[w]
            shard -= lr * grad
            version += 1
            pulled[w] = version
            served.applied.append((w, tau))
            sends[w].append(_send_copy(comm, shard, w))
            left[w] -= 1
            if left[w]:
                pending[w] = _post(comm, shard, w)
            break  # a gradient was applied: back to first come
    for w, handles in sends.items():
        for handle, _ in handles:
            try:
                handle.wait()
            except CommError:
                served.lost.setdefault(w, steps - left[w])
    return served


def _first_completed(pending: dict[int, tuple[Handle, torch.Tensor]], patience: float
                     ) -> int | None:
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        for w, (handle, _) in pending.items():
            if handle.is_completed():
                return w
        time.sleep(1e-4)
    return None


def _post(comm: Communicator, shard: torch.Tensor, w: int) -> tuple[Handle, torch.Tensor]:
    grad = torch.empty_like(shard)
    return comm.irecv(grad, w), grad


def _send_copy(comm: Communicator, shard: torch.Tensor, w: int) -> tuple[Handle, torch.Tensor]:
    copy = shard.clone()
    return comm.isend(copy, w), copy
