"""What a simulated world's matching works on (`lib_dist.comm.simulated`): an operation a rank
posted (`Op`), the state of one run of the world (`RunState`: the posted sends and receives by
channel, the waiting ranks, the barriers), and the `Handle` a rank waits on (`SimHandle`).
Apart from the world so that groups (`simulated_group`) can post without importing it."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .errors import CommError
from .point_to_point import Handle
from .trace import Trace

if TYPE_CHECKING:
    from .simulated import SimulatedCommunicator


@dataclass(eq=False)
class Op:
    kind: str  # "send", "recv" or "barrier"
    rank: int
    peer: int
    tensor: torch.Tensor | None = None
    done: bool = False
    error: CommError | None = None
    generation: int = 0  # barriers only
    state: RunState | None = None  # the run it belongs to; `post` sets the world's current one
    vposted: float = 0.0  # the poster's virtual time when it posted
    vdone: float = 0.0  # the virtual time it completes at, once matched
    tag: tuple[int, ...] = ()  # the group it runs in (`subgroup`); () is the whole world
    members: tuple[int, ...] | None = None  # a group's barrier: its ranks; None: every rank

    def describe(self) -> str:
        if self.kind == "barrier":
            return "barrier"
        return f"{self.kind} {'to' if self.kind == 'send' else 'from'} rank {self.peer}"


@dataclass
class RunState:
    # by channel: (group tag, sender, receiver)
    sends: dict[tuple[tuple[int, ...], int, int], deque[Op]] = field(
        default_factory=lambda: defaultdict(deque))
    recvs: dict[tuple[tuple[int, ...], int, int], deque[Op]] = field(
        default_factory=lambda: defaultdict(deque))
    waiting: dict[int, Op] = field(default_factory=dict)
    ended: dict[int, str] = field(default_factory=dict)  # rank -> "returned" / "failed (...)"
    barrier: dict[tuple[int, ...], list[Op]] = field(default_factory=lambda: defaultdict(list))
    generation: dict[tuple[int, ...], int] = field(default_factory=lambda: defaultdict(int))
    traces: dict[tuple[int, ...], Trace] = field(default_factory=dict)  # by group


class SimHandle(Handle):
    def __init__(self, comm: SimulatedCommunicator, op: Op):
        self._comm, self._op = comm, op

    def wait(self) -> None:
        self._comm.world.wait(self._op)
        self._comm._advance_to(self._op.vdone)

    def is_completed(self) -> bool:
        return self._op.done


__all__ = ["Op", "RunState", "SimHandle"]
