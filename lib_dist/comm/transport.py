"""How a `TorchCommunicator`'s messages travel: its `Transport`.

A transport moves one rank's point-to-point messages, on two lanes that never take each
other's messages: lane 0 carries the user's, lane 1 those inside lib_dist's own collectives
(which the trace does not record). `BackendMessages` is torch.distributed's own
`isend`/`irecv` (gloo's sockets, or NCCL), correct everywhere. Where every rank of a gloo group
runs on one x86-64 Linux host, `lib_dist.comm.fast.SharedMemoryMessages` takes its place, as
NCCL's shared-memory transport takes the place of its sockets within a node.

`Lane` shows one lane of a transport as a `PointToPoint`, for the all-reduce algorithms.

`connect` is the factory: it sets up a rank's transport and all-reduces, shared memory and the
tuner included, and is the one place outside `lib_dist.comm.fast` that imports it (a test
holds this fence: the fast paths stay optional, out of the course's reading).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from .base import Handle
from .errors import CommError, CommTimeout
from .fast.files import Gather
from .fast.group import UNAVAILABLE, share_memory
from .fast.tuned import AUTO, CHOICES, AllReduces
from .fast.tuner import SHARED_MEMORY, TunerModel

TAGS = (0, 0x1D)  # torch.distributed's tag of each lane
BACKEND = "backend"
MESSAGE_CHOICES = (AUTO, SHARED_MEMORY, BACKEND)


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


@dataclass
class Connection:
    """One rank's ends of its group, as `connect` set them up."""

    transport: Transport
    messages: str  # how they travel: "shared_memory" or "backend"
    all_reduces: AllReduces  # every algorithm by name, and the tuner (made on first use)


def connect(rank: int, world_size: int, backend: str, timeout: float, messages: str | None,
            gather: Gather) -> Connection:
    """Set up this rank's transport and all-reduces over the default group (collective: the
    ranks map their shared memory together). `messages` as for `join_group`; `gather`: every
    rank's value (all_gather_object)."""
    choice = checked(messages or os.environ.get("LIB_DIST_MESSAGES", AUTO), MESSAGE_CHOICES,
                     "messages (from the argument or LIB_DIST_MESSAGES)")
    wants_shared = choice != BACKEND and world_size > 1
    shared = (share_memory(rank, world_size, gather, timeout, messages=wants_shared)
              if backend == "gloo" else None)
    if shared is None and wants_shared and choice == SHARED_MEMORY:
        raise CommError(f"rank {rank}: messages='shared_memory' {UNAVAILABLE}; use 'auto'")
    if shared and shared.messages:
        transport: Transport = shared.messages
        how = SHARED_MEMORY
    else:
        transport, how = BackendMessages(rank, timeout), BACKEND
    all_reduces = AllReduces(Lane(transport, 1, rank, world_size), backend,
                             shared.all_reduce if shared else None, how, gather)
    return Connection(transport, how, all_reduces)


def checked(name: str, choices: tuple[str, ...], what: str) -> str:
    """`name`, if it is one of `choices`."""
    if name not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}; got {name!r}")
    return name


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
