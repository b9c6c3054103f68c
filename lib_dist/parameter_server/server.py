"""A parameter server: one shard of the parameters, updated from the workers' pushed gradients.

Synchronous: every step, the server sends its shard to every worker, waits for a gradient from
each, and applies their mean once. That is data parallelism with the averaging done on a server
instead of an all-reduce: the parameters are the all-reduce's, step for step.

Asynchronous (Dean et al. 2012): the server sends its shard to every worker once, then applies
each gradient on its own as it arrives and sends the updated shard back to the worker that
pushed it. A gradient is then computed on parameters some updates old: its *staleness* tau is
the number of updates the server applied between the worker's pull and this push. The server
records (worker, tau) for every gradient it applies.

With a `schedule` (the worker ranks in the order their gradients are to be applied) the server
takes them in that order, and a run is the same every time; without one, it takes whichever
arrives first, as a real server does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import torch

from ..comm import CommTimeout, Communicator, Handle, wait_all

Mode = Literal["sync", "async"]
FIRST_COME_TIMEOUT = 120.0  # seconds a first-come server waits for any gradient


@torch.no_grad()
def serve(comm: Communicator, shard: torch.Tensor, workers: Sequence[int], steps: int,
          lr: float, mode: Mode = "sync", schedule: Sequence[int] | None = None,
          lr_for_staleness: Callable[[int], float] | None = None) -> list[tuple[int, int]]:
    """Serve `shard` (updated in place) to `workers` for `steps` gradients from each; return
    (worker, staleness) of every gradient applied, in order. See the module docstring."""
    if mode == "sync":
        if schedule is not None:
            raise ValueError("a schedule orders asynchronous updates: pass mode='async'")
        return _serve_synchronously(comm, shard, list(workers), steps, lr)
    if mode != "async":
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    if schedule is not None:
        _check_schedule(schedule, workers, steps)
    return _serve_asynchronously(comm, shard, list(workers), steps, lr, schedule,
                                 lr_for_staleness or (lambda tau: lr))


def _serve_synchronously(comm: Communicator, shard: torch.Tensor, workers: list[int],
                         steps: int, lr: float) -> list[tuple[int, int]]:
    applied: list[tuple[int, int]] = []
    for _ in range(steps):
        _send_to(comm, shard, workers)
        grads = [torch.empty_like(shard) for _ in workers]
        wait_all([comm.irecv(g, w) for g, w in zip(grads, workers)])
        shard -= lr * (torch.stack(grads).sum(0) / len(workers))
        applied += [(w, 0) for w in workers]
    _send_to(comm, shard, workers)  # the final parameters
    return applied


def _serve_asynchronously(comm: Communicator, shard: torch.Tensor, workers: list[int],
                          steps: int, lr: float, schedule: Sequence[int] | None,
                          lr_for_staleness: Callable[[int], float]) -> list[tuple[int, int]]:
    version, pulled = 0, dict.fromkeys(workers, 0)
    sends: list[tuple[Handle, torch.Tensor]] = []
    for w in workers:
        sends.append(_send_copy(comm, shard, w))
    applied: list[tuple[int, int]] = []
    arrivals = (_in_order(comm, shard, schedule) if schedule is not None
                else _first_come(comm, shard, workers, steps))
    for w, grad in arrivals:
        tau = version - pulled[w]
        shard -= lr_for_staleness(tau) * grad
        version += 1
        sends.append(_send_copy(comm, shard, w))
        pulled[w] = version
        applied.append((w, tau))
    wait_all([h for h, _ in sends])
    return applied


def _in_order(comm: Communicator, shard: torch.Tensor, schedule: Sequence[int]
              ) -> Iterator[tuple[int, torch.Tensor]]:
    for w in schedule:
        grad = torch.empty_like(shard)
        comm.recv(grad, w)
        yield w, grad


def _first_come(comm: Communicator, shard: torch.Tensor, workers: list[int], steps: int
                ) -> Iterator[tuple[int, torch.Tensor]]:
    """(worker, gradient) in the order the gradients arrive: one receive posted per worker,
    polled until one completes."""
    left = dict.fromkeys(workers, steps)
    pending = {w: _post(comm, shard, w) for w in workers if steps > 0}
    while pending:
        w, (handle, grad) = _wait_for_any(comm, pending)
        handle.wait()
        left[w] -= 1
        del pending[w]
        if left[w]:
            pending[w] = _post(comm, shard, w)
        yield w, grad


def _post(comm: Communicator, shard: torch.Tensor, w: int) -> tuple[Handle, torch.Tensor]:
    grad = torch.empty_like(shard)
    return comm.irecv(grad, w), grad


def _wait_for_any(comm: Communicator, pending: dict[int, tuple[Handle, torch.Tensor]]
                  ) -> tuple[int, tuple[Handle, torch.Tensor]]:
    deadline = time.monotonic() + FIRST_COME_TIMEOUT
    while True:
        for w, entry in pending.items():
            if entry[0].is_completed():
                return w, entry
        if time.monotonic() > deadline:
            raise CommTimeout(f"rank {comm.rank}: no gradient from any of workers "
                              f"{sorted(pending)} within {FIRST_COME_TIMEOUT:g} s")
        time.sleep(1e-4)


def _send_to(comm: Communicator, shard: torch.Tensor, workers: list[int]) -> None:
    wait_all([comm.isend(shard, w) for w in workers])


def _send_copy(comm: Communicator, shard: torch.Tensor, w: int) -> tuple[Handle, torch.Tensor]:
    """Send the shard as it is now; the copy stays alive (and unchanged) until it has left."""
    copy = shard.clone()
    return comm.isend(copy, w), copy


def _check_schedule(schedule: Sequence[int], workers: Sequence[int], steps: int) -> None:
    counts = {w: list(schedule).count(w) for w in workers}
    strangers = sorted(set(schedule) - set(workers))
    if strangers or any(c != steps for c in counts.values()):
        raise ValueError(f"a schedule must name each worker of {list(workers)} exactly "
                         f"{steps} times (its steps); it names {counts}"
                         + (f" and non-workers {strangers}" if strangers else ""))
