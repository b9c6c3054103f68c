"""Groups within a simulated world: what `SimulatedCommunicator.subgroup` returns.

A group's messages travel on channels of their own (the group's tag), so a send to rank 1 in
the tensor-parallel group never meets a receive from rank 1 in the data-parallel group. Its
ranks are numbered 0..len(ranks) - 1; what the world reports (deadlocks, failures) names the
world's ranks. The group's members share one trace, the group's own, and each member keeps its
rank's virtual clock: a rank is one thread, whichever group it talks in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .base import Communicator, Handle
from .simulated_ops import Op, SimHandle
from .trace import Trace

if TYPE_CHECKING:
    from .simulated import SimulatedCommunicator


def subgroup_of(comm: SimulatedCommunicator | SimulatedGroup, ranks: list[int]
                ) -> Communicator | None:
    """`comm.subgroup(ranks)`: every rank calls it, so every rank counts the same groups and
    gives this one the same tag."""
    if list(ranks) != sorted(set(ranks)) or not ranks or not (
            0 <= ranks[0] and ranks[-1] < comm.world_size):
        raise ValueError(f"rank {comm.rank}: subgroup ranks must be distinct, in increasing "
                         f"order and among 0..{comm.world_size - 1}, got {list(ranks)}")
    tag = (*comm.tag, comm.groups_made)
    comm.groups_made += 1
    if comm.rank not in ranks:
        return None
    to_world = comm.members if isinstance(comm, SimulatedGroup) else list(range(comm.world_size))
    return SimulatedGroup(comm, [to_world[r] for r in ranks], tag)


class SimulatedGroup(Communicator):
    """One rank's endpoint in a group of a simulated world."""

    def __init__(self, parent: SimulatedCommunicator | SimulatedGroup, members: list[int],
                 tag: tuple[int, ...]):
        self.root: SimulatedCommunicator = (parent.root if isinstance(parent, SimulatedGroup)
                                            else parent)
        world, state = self.root.world, self.root._state
        with world._lock:
            trace = state.traces.setdefault(tag, Trace())
        super().__init__(members.index(self.root.rank), len(members), "cpu", trace=trace)
        self.world, self.members, self.tag = world, members, tag
        self.groups_made = 0

    def subgroup(self, ranks: list[int]) -> Communicator | None:
        return subgroup_of(self, ranks)

    def virtual_time(self) -> float | None:
        return self.root.virtual_time()

    def _advance_virtual(self, cost: float) -> None:
        self.root._advance_virtual(cost)

    def _post(self, kind: str, peer: int, tensor: torch.Tensor | None = None) -> Op:
        root = self.root
        return self.world.post(Op(kind, root.rank, self.members[peer] if peer >= 0 else -1,
                                   tensor, state=root._state, vposted=root._vnow, tag=self.tag,
                                   members=tuple(self.members)))

    def _post_send(self, tensor: torch.Tensor, dst: int) -> Handle:
        return SimHandle(self.root, self._post("send", dst, tensor))

    def _post_recv(self, buffer: torch.Tensor, src: int) -> Handle:
        return SimHandle(self.root, self._post("recv", src, buffer))

    def world_barrier(self) -> None:
        SimHandle(self.root, self._post("barrier", -1)).wait()


__all__ = ["SimulatedGroup", "subgroup_of"]
