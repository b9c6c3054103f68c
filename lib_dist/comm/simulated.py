"""A world of N ranks as threads in one process: fast, deterministic tests of any algorithm.

Messages are matched exactly as on a real group: per (src, dst) channel, in order of posting.
A blocking send completes only once the receiver has taken the message, as with gloo. Because
the world sees every rank at once, it tells a bug from slowness:

- when every live rank is waiting on something that can no longer happen (all ranks send
  first; a rank waits on a peer that returned or raised), every waiting rank raises at once,
  naming itself, its operation and its peer;
- a send and receive that disagree on shape or dtype raise `MismatchError` on both ranks;
- anything still waiting after `timeout` seconds raises `CommTimeout`.

With `clock=VirtualClock(...)` every rank also keeps a virtual time (`lib_dist.comm.clock`),
and every event of the trace carries it: timelines that are the same on every run.

    world = SimulatedWorld(4)
    results = world.run(my_algorithm, tensor_size)   # my_algorithm(comm, tensor_size)
    world.trace.summary()
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Callable

import torch

from ..errors import RankFailure
from ..patience import load_seen, stretched
from .base import Communicator, Handle
from .clock import VirtualClock
from .errors import CommTimeout, DeadlockError, MismatchError, PeerFailed
from .simulated_group import subgroup_of
from .simulated_ops import Op, RunState, SimHandle
from .trace import Trace


class SimulatedWorld:
    """N ranks as threads. `run(fn, *args)` calls `fn(comm, *args)` on every rank."""

    def __init__(self, world_size: int, timeout: float = 10.0,
                 clock: VirtualClock | None = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        self.world_size = world_size
        self.timeout = timeout
        self.clock = clock
        self.trace = Trace()
        # One lock for the world; each rank sleeps on a condition of its own, woken only when
        # one of its operations completes or fails (waking every rank on every message made
        # the ranks' threads take turns for nothing).
        self._lock = threading.RLock()
        self._turns = [threading.Condition(self._lock) for _ in range(world_size)]
        self._state = RunState()

    def communicators(self) -> list[SimulatedCommunicator]:
        return [SimulatedCommunicator(self, r) for r in range(self.world_size)]

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run `fn(comm, *args, **kwargs)` on every rank; return the results by rank.

        Raises `RankFailure` naming every rank that raised. Once a rank has failed, the
        others get `timeout` seconds to finish; those still busy are its `still_running`. A rank
        waiting on a peer gets `timeout` seconds stretched by the machine's load (`patience`).
        """
        self.trace = Trace()
        # A fresh state per run: a rank thread left over from an earlier failed run (still
        # looping, or sleeping) posts and ends in its own run's state, never in this one.
        self._state = state = RunState()
        results: list[Any] = [None] * self.world_size
        failures: dict[int, str] = {}
        exceptions: dict[int, BaseException] = {}

        def body(comm: SimulatedCommunicator) -> None:
            try:
                results[comm.rank] = fn(comm, *args, **kwargs)
                self._end(state, comm.rank, "returned")
            except BaseException as e:  # noqa: BLE001 - reported to the caller by rank
                failures[comm.rank] = traceback.format_exc()
                exceptions[comm.rank] = e
                self._end(state, comm.rank,
                          f"failed ({type(e).__name__}: {e})".split("\n")[0])

        threads = [threading.Thread(target=body, args=(c,), daemon=True,
                                    name=f"rank-{c.rank}") for c in self.communicators()]
        for t in threads:
            t.start()
        self._join(threads, failures)
        hung = [r for r, t in enumerate(threads) if t.is_alive()]
        if failures:  # a rank still running here outlived a failure by `timeout` seconds
            raise RankFailure(failures, exceptions, still_running=hung, consequences={
                r for r, e in exceptions.items() if isinstance(e, PeerFailed)})
        return results

    def _join(self, threads: list[threading.Thread], failures: dict[int, str]) -> None:
        deadline = None
        while any(t.is_alive() for t in threads):
            if failures and deadline is None:
                deadline = time.monotonic() + self.timeout
            if deadline is not None and time.monotonic() > deadline:
                return
            for t in threads:
                t.join(0.05)

    # -- matching, under the world's lock --------------------------------------------------

    def post(self, op: Op) -> Op:
        with self._lock:
            if op.state is None:
                op.state = self._state
            s = op.state
            if op.kind == "barrier":
                op.generation = s.generation[op.tag]
                waiting = s.barrier[op.tag]
                waiting.append(op)
                if len(waiting) == len(op.members or range(self.world_size)):
                    last = max(b.vposted for b in waiting)
                    for b in waiting:
                        b.done, b.vdone = True, last
                    s.barrier[op.tag], s.generation[op.tag] = [], op.generation + 1
                    self._wake(*(b.rank for b in waiting))
            else:
                src, dst = (op.rank, op.peer) if op.kind == "send" else (op.peer, op.rank)
                channel = (op.tag, src, dst)
                mine, theirs = ((s.sends, s.recvs) if op.kind == "send" else (s.recvs, s.sends))
                if theirs[channel]:
                    other = theirs[channel].popleft()
                    self._match(*((op, other) if op.kind == "send" else (other, op)))
                    self._wake(other.rank)
                else:
                    mine[channel].append(op)
        return op

    def _wake(self, *ranks: int) -> None:
        """Wake the ranks waiting on an operation that may have completed or failed (every
        thread of that rank: one left over from an earlier run rechecks and sleeps again)."""
        for rank in ranks:
            self._turns[rank].notify_all()

    def _match(self, send: Op, recv: Op) -> None:
        a, b = send.tensor, recv.tensor
        assert a is not None and b is not None  # sends and receives always carry one
        if a.shape != b.shape or a.dtype != b.dtype:
            detail = (f"rank {send.rank} sent {_describe(a)} to rank {recv.rank}, but rank "
                      f"{recv.rank} posted a receive buffer of {_describe(b)}")
            send.error = MismatchError(f"rank {send.rank}: send to rank {recv.rank}: {detail}")
            recv.error = MismatchError(f"rank {recv.rank}: recv from rank {send.rank}: {detail}")
        else:
            with torch.no_grad():
                b.copy_(a)
            cost = self.clock.message_cost(a.nbytes) if self.clock else 0.0
            send.vdone = recv.vdone = max(send.vposted, recv.vposted) + cost
            send.done = recv.done = True

    def wait(self, op: Op) -> None:
        s = op.state
        assert s is not None  # `post` gave it one
        with self._lock:
            if not op.done and op.error is None:
                s.waiting[op.rank] = op
                try:
                    self._sleep_until_done(op, s)
                finally:
                    del s.waiting[op.rank]
        if op.error is not None:
            raise op.error

    def _sleep_until_done(self, op: Op, s: RunState) -> None:
        # A busy machine starves the peer's thread, not the exchange: a wait that runs past
        # `timeout` is stretched by the load seen then (read only then: a wait is short, and
        # reading the load on each one took a fifth of a simulated step's time).
        start, limit = time.monotonic(), self.timeout
        while True:
            self._find_deadlock(s)
            if op.done or op.error is not None:
                return
            remaining = start + limit - time.monotonic()
            if remaining <= 0:
                longer = stretched(self.timeout)
                if limit < longer:
                    limit = longer
                    continue
                raise CommTimeout(
                    f"rank {op.rank}: {op.describe()} did not complete within "
                    f"{self.timeout:g} s" + ("" if limit == self.timeout else
                                             f" (waited {limit:.1f} s: {load_seen()})"))
            self._turns[op.rank].wait(remaining)

    def _end(self, state: RunState, rank: int, how: str) -> None:
        with self._lock:
            state.ended[rank] = how
            self._wake(*range(self.world_size))

    def _find_deadlock(self, s: RunState) -> None:
        """Fail every wait of the run `s` that can no longer complete."""
        stuck = {r: op for r, op in s.waiting.items() if not op.done and op.error is None}
        for r, op in stuck.items():
            peers = (op.members or range(self.world_size)) if op.kind == "barrier" else [op.peer]
            gone = [p for p in peers if p in s.ended]
            if gone:
                p = gone[0]
                op.error = PeerFailed(f"rank {r}: {op.describe()} can never complete: rank {p} "
                                      f"{s.ended[p]} without taking part")
        live = [r for r in range(self.world_size) if r not in s.ended]
        if live and all(r in stuck and stuck[r].error is None for r in live):
            table = "\n".join(f"  rank {r}: waiting in {stuck[r].describe()}" for r in live)
            hint = ("a blocking send completes only when its receiver takes the message; "
                    "pair sends with receives, or use isend/irecv")
            for r in live:
                stuck[r].error = DeadlockError(
                    f"rank {r}: {stuck[r].describe()} can never complete: deadlock, every rank "
                    f"is waiting:\n{table}\n({hint})")
        self._wake(*(r for r, op in stuck.items() if op.error is not None))


class SimulatedCommunicator(Communicator):
    """One rank of a `SimulatedWorld`; its trace is the world's."""

    def __init__(self, world: SimulatedWorld, rank: int):
        super().__init__(rank, world.world_size, "cpu", trace=world.trace)
        self.world = world
        self._state = world._state  # of the run this rank belongs to
        self._vnow = 0.0
        self.tag: tuple[int, ...] = ()  # the whole world's channels (`subgroup`'s have others)
        self.groups_made = 0  # `subgroup` calls so far: every rank makes the same count

    def virtual_time(self) -> float | None:
        return self._vnow if self.world.clock is not None else None

    def _advance_virtual(self, cost: float) -> None:
        if cost < 0:
            raise ValueError(f"rank {self.rank}: a compute cost must be >= 0, got {cost}")
        self._vnow += cost

    def _advance_to(self, when: float) -> None:
        self._vnow = max(self._vnow, when)

    def _post(self, kind: str, peer: int, tensor: torch.Tensor | None = None) -> Op:
        return self.world.post(Op(kind, self.rank, peer, tensor, state=self._state,
                                   vposted=self._vnow))

    def subgroup(self, ranks: list[int]) -> Communicator | None:
        """A communicator over `ranks` (of this communicator), None on a rank not among them;
        its messages never meet the world's or another group's. Collective, as the torch
        backend's: every rank calls it for every group, in the same order, ranks increasing."""
        return subgroup_of(self, ranks)

    def _post_send(self, tensor: torch.Tensor, dst: int) -> Handle:
        return SimHandle(self, self._post("send", dst, tensor))

    def _post_recv(self, buffer: torch.Tensor, src: int) -> Handle:
        return SimHandle(self, self._post("recv", src, buffer))

    def world_barrier(self) -> None:
        SimHandle(self, self._post("barrier", -1)).wait()


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)} dtype {str(t.dtype).removeprefix('torch.')}"
