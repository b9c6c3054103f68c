"""How a `TorchCommunicator`'s messages travel: its `Transport`.

A transport moves one rank's point-to-point messages, on two lanes that never take each
other's messages: lane 0 carries the user's, lane 1 those inside lib_dist's own collectives
(which the trace does not record). `BackendMessages` is torch.distributed's own
`isend`/`irecv` (gloo's sockets, or NCCL), correct everywhere. Where every rank of a gloo group
runs on one x86-64 Linux host, `lib_dist.comm.fast.SharedMemoryMessages` takes its place, as
NCCL's shared-memory transport takes the place of its sockets within a node.

`Lane` shows one lane of a transport as a `PointToPoint`, for the all-reduce algorithms.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
import torch.distributed as dist

from .base import Handle
from .errors import CommError, CommTimeout

TAGS = (0, 0x1D)  # torch.distributed's tag of each lane


class Transport(Protocol):
    def isend(self, tensor: torch.Tensor, dst: int, lane: int = 0) -> Handle: ...

    def irecv(self, buffer: torch.Tensor, src: int, lane: int = 0) -> Handle: ...

    def close(self) -> None: ...


class BackendMessages:
    """The default process group's `isend`/`irecv`, each lane on its own tag."""

    def __init__(self, rank: int, timeout: float):
        self.rank, self.timeout = rank, timeout

    def isend(self, tensor: torch.Tensor, dst: int, lane: int = 0) -> Handle:
        with translated(self.rank, self.timeout, f"send to rank {dst}"):
            return _Work(self, dist.isend(tensor, dst, tag=TAGS[lane]), f"send to rank {dst}")

    def irecv(self, buffer: torch.Tensor, src: int, lane: int = 0) -> Handle:
        with translated(self.rank, self.timeout, f"recv from rank {src}"):
            return _Work(self, dist.irecv(buffer, src, tag=TAGS[lane]), f"recv from rank {src}")

    def close(self) -> None:
        """Nothing to stop: the process group is torch.distributed's."""


class _Work(Handle):
    def __init__(self, transport: BackendMessages, work: dist.Work | None, what: str):
        assert work is not None  # None only for ranks outside the group
        self._transport, self._work, self._what = transport, work, what

    def wait(self) -> None:
        with translated(self._transport.rank, self._transport.timeout, self._what):
            self._work.wait()

    def is_completed(self) -> bool:
        return self._work.is_completed()


class Lane:
    """One lane of a transport as a `PointToPoint`: untraced messages for the algorithms
    inside lib_dist's collectives."""

    def __init__(self, transport: Transport, lane: int, rank: int, world_size: int):
        self._transport, self._lane = transport, lane
        self.rank, self.world_size = rank, world_size

    def isend(self, tensor: torch.Tensor, dst: int) -> Handle:
        return self._transport.isend(tensor, dst, self._lane)

    def irecv(self, buffer: torch.Tensor, src: int) -> Handle:
        return self._transport.irecv(buffer, src, self._lane)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, buffer: torch.Tensor, src: int) -> None:
        self.irecv(buffer, src).wait()


@contextmanager
def translated(rank: int, timeout: float, what: str) -> Iterator[None]:
    """Raise torch.distributed's errors as lib_dist's, naming the rank and the operation;
    lib_dist's own pass unchanged."""
    try:
        yield
    except CommError:
        raise
    except RuntimeError as e:
        text = str(e)
        if "Timed out" in text or "timeout" in text.lower():
            raise CommTimeout(f"rank {rank}: {what} did not complete within {timeout:g} s; the "
                              f"group is now unusable and must be rebuilt "
                              f"({text.splitlines()[0][:200]})") from None
        raise CommError(f"rank {rank}: {what} failed: {text.splitlines()[0][:300]}") from None
