"""The shared memory of a gloo group on one host: each rank's file holds its message channels,
then its all-reduce buffers."""

from __future__ import annotations

from dataclasses import dataclass

from .all_reduce import CAPACITY, SharedMemoryAllReduce
from .channels import Channels
from .files import Gather, map_shared_files
from .messages import SharedMemoryMessages

UNAVAILABLE = ("needs every rank of a gloo group on one x86-64 Linux host, with room in "
               "/dev/shm or a tmpfs temp directory")


@dataclass
class SharedMemory:
    """This rank's ends of the group's shared-memory transports. `messages` is None when
    the group's messages go through the backend instead."""

    messages: SharedMemoryMessages | None
    all_reduce: SharedMemoryAllReduce


def share_memory(rank: int, world_size: int, gather: Gather, timeout: float,
                 messages: bool) -> SharedMemory | None:
    """Map the group's files (collective; `gather` as for `files.map_shared_files`). None on
    every rank unless every rank can share memory with the others. `messages`: whether to
    carry messages through it too."""
    split = Channels.file_bytes(world_size)
    files = map_shared_files(rank, world_size, gather,
                             split + SharedMemoryAllReduce.file_bytes(CAPACITY), "group")
    if files is None:
        return None
    return SharedMemory(
        SharedMemoryMessages(rank, world_size, [f[:split] for f in files], timeout)
        if messages else None,
        SharedMemoryAllReduce(rank, world_size, [f[split:] for f in files], CAPACITY, timeout))
