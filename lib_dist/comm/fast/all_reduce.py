"""All-reduce through shared memory, for a group whose ranks all run on one host.

Between processes on one machine the fastest link is memory, not TCP over loopback: NCCL
moves bytes between GPUs of a node through its SHM and P2P transports, and DeepSpeed's CPU
all-reduce goes through shared memory too, because gloo's loopback sockets copy every byte
twice and wake a thread per message. `SharedMemoryAllReduce` is that path for lib_dist's
gloo groups on one x86-64 Linux host; `TorchCommunicator.all_reduce`'s tuner runs it when it
is the fastest.

Every rank maps one file per rank (`files.map_shared_files`): a header holding the rank's
arrival counter, then two halves of `capacity` bytes each. A tensor is reduced in pieces of at
most `capacity` bytes, using the two halves in turn. For each piece:

1. every rank copies its piece into its own half and arrives (barrier);
2. rank r adds up slice r (its `chunk_bounds` chunk) of every rank's half, into its own, and
   arrives (barrier): the reduce-scatter, each element summed by exactly one rank;
3. every rank copies slice j from rank j's half: the all-gather.

Each rank writes only its own file and reads the others', so no atomic operation is needed:
a barrier is every rank's counter reaching a value, polled with `files.pause` in between.
The third step needs no barrier: the next piece writes the other half, and its step 2
barrier proves everyone finished this piece's step 3 before that half is written again.
Each element is summed once, so every rank ends with the same bits. A rank that stops
arriving makes the others raise `CommTimeout` naming it after `timeout` seconds. (Why this
runs on x86-64 Linux only: `files.shared_memory_supported`.)
"""

from __future__ import annotations

import time

import torch

from ..base import chunk_bounds
from ..errors import CommTimeout
from .files import pause

CAPACITY = 8 << 20  # bytes per half: a piece of a larger tensor
HEADER = 64  # bytes before the halves: the arrival counter, then padding to a cache line


class SharedMemoryAllReduce:
    """One rank's end of a shared-memory all-reduce, over the group's mapped `files` (one per
    rank, of `file_bytes(capacity)` bytes; see `files.map_shared_files`)."""

    def __init__(self, rank: int, world_size: int, files: list[torch.Tensor], capacity: int,
                 timeout: float):
        self.rank, self.world_size = rank, world_size
        self.capacity, self.timeout = capacity, timeout
        self._halves = [[f[HEADER + h * capacity: HEADER + (h + 1) * capacity] for h in (0, 1)]
                        for f in files]
        self._counters = [f[:8].view(torch.int64).numpy() for f in files]
        self._mine = self._counters[rank]
        self._pieces = 0

    @staticmethod
    def file_bytes(capacity: int = CAPACITY) -> int:
        """The bytes of each rank's file: the arrival counter, then the two halves."""
        return HEADER + 2 * capacity

    def all_reduce(self, flat: torch.Tensor) -> None:
        """Sum the contiguous 1-d `flat` over all ranks, in place. Every rank calls it with a
        tensor of the same length and dtype."""
        per_piece = self.capacity // flat.element_size() // self.world_size * self.world_size
        for lo in range(0, flat.numel(), per_piece):
            self._reduce_piece(flat[lo: lo + per_piece])

    def barrier(self) -> None:
        """Return once every rank has called it: within microseconds of each other, where
        gloo's barrier lets ranks go a fraction of a millisecond apart."""
        self._barrier("arriving at a barrier")

    def _reduce_piece(self, piece: torch.Tensor) -> None:
        half = self._pieces % 2
        self._pieces += 1
        n, k = piece.numel(), self.world_size
        views = [h[half].view(piece.dtype)[:n] for h in self._halves]
        views[self.rank].copy_(piece)
        self._barrier("copying its tensor in")
        bounds = chunk_bounds(n, k)
        lo, hi = bounds[self.rank]
        mine = views[self.rank][lo:hi]
        for j in range(k):
            if j != self.rank:
                mine += views[j][lo:hi]
        self._barrier("adding up its slice")
        for j, (lo, hi) in enumerate(bounds):
            piece[lo:hi].copy_(views[j][lo:hi])

    def _barrier(self, step: str) -> None:
        target = int(self._mine[0]) + 1
        self._mine[0] = target
        start = time.monotonic()
        while True:
            behind = [j for j, c in enumerate(self._counters) if c[0] < target]
            if not behind:
                return
            waited = time.monotonic() - start
            if waited > self.timeout:
                raise CommTimeout(
                    f"rank {self.rank}: all_reduce (shared memory) waited {self.timeout:g} s for "
                    f"rank(s) {', '.join(map(str, behind))} to finish {step}")
            pause(waited)
