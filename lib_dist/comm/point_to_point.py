"""What a rank that messages the others offers, below the communicator: a started operation's
`Handle`, the `PointToPoint` protocol, and the helpers built on them alone.

The all-reduce algorithms (`lib_dist.comm.algorithms`), the background thread's handles
(`lib_dist.comm.background`) and the tuner need only this, and `Communicator` (`base`) is
built on them: here, they depend on this module and not on one another's. `lib_dist.comm` and
`lib_dist.comm.base` export the same names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch


class Handle(ABC):
    """A started operation. `wait()` blocks until it completes or raises `CommError`."""

    @abstractmethod
    def wait(self) -> None: ...

    @abstractmethod
    def is_completed(self) -> bool: ...


class PointToPoint(Protocol):
    """A rank that can message the others: all the all-reduce algorithms and the tuner need.
    Every `Communicator` is one; so is the torch backend's untraced lane for the messages
    inside its own collectives."""

    rank: int
    world_size: int

    def isend(self, tensor: torch.Tensor, dst: int) -> Handle: ...

    def irecv(self, buffer: torch.Tensor, src: int) -> Handle: ...

    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    def recv(self, buffer: torch.Tensor, src: int) -> None: ...


def wait_all(handles: list[Handle]) -> None:
    """Wait for every handle, in order."""
    for h in handles:
        h.wait()


def chunk_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """[start, end) of each rank's chunk of n elements: equal chunks of ceil(n / world_size),
    the last ones shorter or empty. This is the split reduce_scatter uses."""
    size = -(-n // world_size)
    return [(min(r * size, n), min((r + 1) * size, n)) for r in range(world_size)]
