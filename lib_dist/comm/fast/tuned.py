"""Running `TorchCommunicator.all_reduce`'s algorithms by name, and choosing one per size.

The names: "native" (torch.distributed's own), those of `lib_dist.comm.algorithms` (over the
communicator's untraced lane), and "shared_memory" (`all_reduce`, ranks on one host). "auto"
asks the tuner (`tuner`), which the group calibrates on its first tuned all-reduce, or finds
in the per-machine cache (`calibration`). NCCL has a tuner of its own, and a single rank has
nothing to choose: there the tuner always says "native".
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..algorithms import ALGORITHMS
from ..base import PointToPoint
from ..errors import CommError
from .all_reduce import SharedMemoryAllReduce
from .calibration import cached_or_calibrated, machine_key
from .files import Gather, boot_id
from .group import UNAVAILABLE
from .tuner import NATIVE, SHAPES, SHARED_MEMORY, TunerModel, calibrate, native_only

AUTO = "auto"
CHOICES = (AUTO, NATIVE, *ALGORITHMS, SHARED_MEMORY)


class AllReduces:
    """One rank's all-reduce algorithms. `lane`: untraced messages; `shared`: the group's
    shared-memory all-reduce, if it has one; `messages`: how the lane's messages travel
    (part of the calibration's key); `gather`: every rank's value (all_gather_object)."""

    def __init__(self, lane: PointToPoint, backend: str, shared: SharedMemoryAllReduce | None,
                 messages: str, gather: Gather):
        self.lane, self.backend, self.shared = lane, backend, shared
        self.messages, self.gather = messages, gather
        self.tuner: TunerModel | None = None  # made on the first `choose`

    def choose(self, nbytes: int) -> str:
        """The algorithm "auto" runs for `nbytes` (collective: may calibrate the tuner)."""
        if self.tuner is None:
            self.tuner = self._tune()
        return self.tuner.choose(nbytes)

    def run(self, name: str, flat: torch.Tensor) -> None:
        """All-reduce the contiguous 1-d `flat` in place with algorithm `name`."""
        if name == NATIVE:
            dist.all_reduce(flat)
        elif name == SHARED_MEMORY:
            if self.shared is None:
                raise CommError(f"rank {self.lane.rank}: all_reduce(algorithm='shared_memory') "
                                f"{UNAVAILABLE}; use 'auto' to let the tuner choose")
            with _one_thread():
                self.shared.all_reduce(flat)
        else:
            algorithm = ALGORITHMS[name].run
            assert algorithm is not None  # only the tuner's "native" has none
            with _one_thread():
                algorithm(self.lane, flat)

    def _tune(self) -> TunerModel:
        n = self.lane.world_size
        if self.backend != "gloo" or n == 1:
            return native_only(n)
        candidates = tuple(name for name in SHAPES if name != SHARED_MEMORY or self.shared)
        hosts = self.gather((socket.gethostname(), boot_id()))
        key = machine_key(n, self.backend, self.messages, candidates, hosts)
        barrier = self.shared.barrier if self.shared else None
        return cached_or_calibrated(
            self.lane.rank, key, lambda value: self.gather(value)[0],
            lambda: calibrate(self.lane, self.run, _slowest, candidates, barrier=barrier))


def _slowest(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


@contextmanager
def _one_thread() -> Iterator[None]:
    """Add on one thread inside an all-reduce, as gloo does. Ranks that share cores (4 ranks
    on 2 cores here) and each start a pool of threads per addition spend the time switching
    between those threads instead of moving bytes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
