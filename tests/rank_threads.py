"""Ranks as threads of the test process, for the shared-memory transports: their algorithms
do not care whether the ranks sharing the files are processes or threads."""

from __future__ import annotations

import threading


class Threads:
    """`world_size` ranks as threads, with the `gather` that mapping the shared-memory files
    needs (every rank's value, in rank order)."""

    def __init__(self, world_size: int):
        self.n = world_size
        self._slots: list = [None] * world_size
        self._barrier = threading.Barrier(world_size, timeout=30)

    def gather_for(self, rank: int):
        def gather(value):
            self._slots[rank] = value
            self._barrier.wait()
            out = list(self._slots)
            self._barrier.wait()
            return out
        return gather

    def run(self, fn) -> list:
        results, errors = [None] * self.n, []

        def body(rank):
            try:
                results[rank] = fn(rank, self.gather_for(rank))
            except BaseException as e:  # reported below, by rank
                errors.append((rank, e))

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0][1]
        return results
