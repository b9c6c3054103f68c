"""Point-to-point communication between ranks, the same on threads and on real processes.

- `Communicator`: the interface students program against (documented in `base`).
- `SimulatedWorld`: N ranks as threads in one process, for fast tests; never hangs.
- `TorchCommunicator` / `join_group`: a rank of a real torch.distributed group; its messages
  go through shared memory when all ranks share a host (`shared_messages`, `shared_files`).
- `Trace`, `AlphaBeta`: what was sent, and what it would cost on a given network.
- `algorithms`, `tuner`: all-reduce built from messages (ring, halving-doubling, recursive
  doubling, gather-broadcast), and how `TorchCommunicator.all_reduce` picks one per size,
  among them and gloo's own and, on one host, `shared_memory`'s.
"""

from .base import Communicator, Handle, ReduceOp, chunk_bounds, wait_all
from .errors import CommError, CommTimeout, DeadlockError, MismatchError, PeerFailed
from .simulated import SimulatedCommunicator, SimulatedWorld
from .torch_backend import TorchCommunicator, join_group, pick_backend
from .trace import AlphaBeta, Event, Message, RankTraffic, Trace

__all__ = [
    "AlphaBeta", "CommError", "CommTimeout", "Communicator", "DeadlockError", "Event", "Handle",
    "Message", "MismatchError", "PeerFailed", "RankTraffic", "ReduceOp", "SimulatedCommunicator",
    "SimulatedWorld", "TorchCommunicator", "Trace", "chunk_bounds", "join_group", "pick_backend",
    "wait_all",
]
