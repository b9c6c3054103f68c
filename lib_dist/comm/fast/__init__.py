"""Fast paths of the torch backend: optimisations, not course material.

The course's communication is `lib_dist.comm`: the communicator, the algorithms, the traces.
A `TorchCommunicator` is correct without anything in here; this package makes it fast on one
machine, the way NCCL's shared-memory transport and its tuner make NCCL fast within a node:

- `messages` (with `channels`, its layout): point-to-point messages through shared memory
  between ranks on one host, instead of gloo's loopback sockets;
- `all_reduce`: an all-reduce through shared memory;
- `files`, `group`: the memory-backed files both use, one per rank, and how a group maps them;
- `tuner`, `tuned`: which all-reduce to run for each size, from timings made on the group;
- `calibration`: those timings, measured once per machine and kept on disk.

Shared memory is used on x86-64 Linux only (`files.shared_memory_supported` says why); on
other machines, Apple-silicon and ARM laptops among them, messages and all-reduces go
through gloo's sockets.
"""

from .all_reduce import SharedMemoryAllReduce
from .files import shared_memory_supported
from .messages import SharedMemoryMessages
from .tuner import TunerModel

__all__ = ["SharedMemoryAllReduce", "SharedMemoryMessages", "TunerModel",
           "shared_memory_supported"]
