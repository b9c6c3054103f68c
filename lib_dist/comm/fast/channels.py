"""Where the shared-memory messages live: the layout of every rank's file of channels.

Each rank maps every rank's file (`files.map_shared_files`). Rank s's file holds, for every
destination d and lane (the user's messages, and lib_dist's own inside collectives, which
must never match each other), a channel of `SLOTS` slots of `SLOT` bytes and a counter
`sent[lane][d]` of the pieces it has published there; rank d's file holds `taken[lane][s]`,
the pieces it has consumed. Every counter has a single writer, which writes it after the
bytes it announces (see `files.shared_memory_supported` for why that order holds).

A slot starts with a header (total bytes of the message, bytes in this piece, dtype code,
element count), then, a cache line later, the piece's bytes.
"""

from __future__ import annotations

import numpy as np
import torch

SLOT = 2 << 20  # bytes per piece: small enough that copying in and out overlap
SLOTS = 4  # pieces in flight per channel
LANES = 2  # 0: the user's messages; 1: those inside lib_dist's collectives
LINE = 64  # bytes: counters and slot headers each get a cache line
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
          torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.bool)


class Channels:
    """Every rank's file, seen as counters and slots. `owner` is the rank whose file holds
    the number: the sender's for `sent`, the receiver's for `taken`."""

    def __init__(self, world_size: int, files: list[torch.Tensor]):
        self.world_size = world_size
        self._files = files
        self._counters = [f[: _counter_bytes(world_size)].view(torch.int64).numpy()
                          for f in files]
        self._slots: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    @staticmethod
    def file_bytes(world_size: int) -> int:
        """The bytes of each rank's file: counters, then every lane's channel to each rank."""
        return _counter_bytes(world_size) + LANES * world_size * SLOTS * (LINE + SLOT)

    def sent(self, owner: int, lane: int, dst: int) -> int:
        """Pieces `owner` has published to `dst` on `lane`."""
        return int(self._counters[owner][self._sent(lane, dst)])

    def set_sent(self, owner: int, lane: int, dst: int, pieces: int) -> None:
        self._counters[owner][self._sent(lane, dst)] = pieces

    def taken(self, owner: int, lane: int, src: int) -> int:
        """Pieces `owner` has consumed from `src` on `lane`."""
        return int(self._counters[owner][self._taken(lane, src)])

    def set_taken(self, owner: int, lane: int, src: int, pieces: int) -> None:
        self._counters[owner][self._taken(lane, src)] = pieces

    def slot(self, owner: int, lane: int, dst: int, piece: int) -> tuple[np.ndarray, np.ndarray]:
        """The header (as int64 numbers) and the bytes of the slot that piece number `piece`
        of `owner`'s channel to `dst` uses."""
        key = (owner, lane, dst, piece % SLOTS)
        if key not in self._slots:
            n, file = self.world_size, self._files[owner]
            start = _counter_bytes(n) + ((lane * n + dst) * SLOTS + key[3]) * (LINE + SLOT)
            self._slots[key] = (file[start: start + 32].view(torch.int64).numpy(),
                                file[start + LINE: start + LINE + SLOT].numpy())
        return self._slots[key]

    def _sent(self, lane: int, dst: int) -> int:
        return (lane * self.world_size + dst) * (LINE // 8)

    def _taken(self, lane: int, src: int) -> int:
        return ((LANES + lane) * self.world_size + src) * (LINE // 8)


def dtype_code(tensor: torch.Tensor) -> int:
    return DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else -1


def dtype_name(code: int) -> str:
    return str(DTYPES[code]) if 0 <= code < len(DTYPES) else "another dtype"


def _counter_bytes(n: int) -> int:
    return 2 * LANES * n * LINE
