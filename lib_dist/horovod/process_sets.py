"""Horovod's process sets: operations among some of the ranks.

    evens = hvd.add_process_set([0, 2])      # on every rank (collective)
    if hvd.rank() in (0, 2):
        hvd.allreduce(t, process_set=evens)  # ranks 0 and 2 only

Each set runs on a subgroup of the torch.distributed group (`TorchCommunicator.subgroup`),
with its own negotiation thread and names (`queue`), so the ranks of two sets, or of a set and
the whole group, go on side by side. `root_rank` stays a global rank. A rank outside a set
that calls one of its operations gets a ValueError. Every rank must add and remove the same
sets in the same order. An empty set is legal, as in Horovod (the odd ranks of a 1-rank job):
no rank is in it. On a simulated world (ranks as threads) there are no process sets.
"""

from __future__ import annotations

from typing import Any

from . import basics
from .basics import State
from .queue import Queue


class NotInProcessSet(ValueError):
    """An operation on a process set, called on a rank outside it."""


class ProcessSet:
    """Some of the ranks (`ranks`, global ranks in increasing order); usable in operations
    once `add_process_set` has registered it."""

    def __init__(self, ranks: Any):
        self.ranks = sorted({int(r) for r in ranks})
        self.process_set_id: int | None = None
        self.state: State | None = None

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This rank's index in the set (a ValueError outside it)."""
        return self.ranks.index(basics.rank())

    def included(self) -> bool:
        return basics.rank() in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class GlobalProcessSet(ProcessSet):
    """Every rank: what every operation runs on by default."""

    def __init__(self) -> None:
        super().__init__([])
        self.process_set_id = 0

    def size(self) -> int:
        return basics.size()

    def rank(self) -> int:
        return basics.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, all ranks)"


global_process_set = GlobalProcessSet()


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a process set (a `ProcessSet` or a list of ranks) on every rank; returns it."""
    s = basics.state()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks and (ps.ranks[-1] >= s.comm.world_size or ps.ranks[0] < 0):
        raise ValueError(f"add_process_set: ranks must be among 0..{s.comm.world_size - 1}, "
                         f"got {ps.ranks}")
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    subgroup = getattr(s.comm, "subgroup", None)
    if subgroup is None:
        raise NotImplementedError(f"lib_dist.horovod's process sets need ranks of a "
                                  f"torch.distributed group (a Cluster), not a "
                                  f"{type(s.comm).__name__}")
    s.queue.drain()
    comm = subgroup(ps.ranks) if ps.ranks else None  # every rank skips an empty one alike
    s.sets_added += 1
    ps.process_set_id = s.sets_added
    if comm is not None:
        ps.state = State(comm, 0, 1, 0, 1, True, Queue(comm, s.queue.check, s.queue.stall_after),
                         s.fusion_threshold, members=ps.ranks)
    s.process_sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Forget a process set, on every rank; True if it was registered."""
    s = basics.state()
    if process_set.process_set_id not in s.process_sets:
        return False
    s.process_sets.pop(process_set.process_set_id)
    if process_set.state is not None:
        process_set.state.queue.drain()
    process_set.process_set_id, process_set.state = None, None
    return True


def state_for(process_set: Any, what: str) -> State:
    """The state an operation on `process_set` runs with (the whole group's by default)."""
    s = basics.state()
    if process_set is None or isinstance(process_set, GlobalProcessSet):
        return s
    registered = [ps for ps in s.process_sets.values() if ps is process_set]
    if not registered:
        raise ValueError(f"{what}: process_set must be hvd.global_process_set or one added "
                         f"with hvd.add_process_set, got {process_set!r}")
    state: State | None = registered[0].state
    if state is None:
        raise NotInProcessSet(f"{what}: rank {s.comm.rank} is not in {process_set}")
    return state
