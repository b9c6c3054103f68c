"""Point-to-point communication between ranks, the same on threads and on real processes.

- `Communicator`: the interface students program against (documented in `base`);
  `PointToPoint`, the part of it the all-reduce algorithms need.
- `SimulatedWorld`: N ranks as threads in one process, for fast tests; never hangs.
- `TorchCommunicator` / `join_group`: a rank of a real torch.distributed group; its messages
  travel through a `transport`.
- `Trace`, `AlphaBeta`: what was sent, and what it would cost on a given network.
- `VirtualClock`: a simulated world's deterministic time (`clock`); `plot_trace` draws a
  trace, one row per rank, on either clock, and `plot_overlap` a virtual-clock trace with its
  messages in flight under each rank's work (`plot`).
- `algorithms`: all-reduce built from messages (ring, halving-doubling, recursive doubling,
  gather-broadcast) and what each costs.
- `fast`: optimisations of the torch backend, not course material: messages and an
  all-reduce through shared memory, and the tuner that picks an all-reduce per size.
"""

from .base import Communicator, Handle, PointToPoint, ReduceOp, chunk_bounds, wait_all
from .clock import VirtualClock
from .errors import CommError, CommTimeout, DeadlockError, MismatchError, PeerFailed
from .simulated import SimulatedCommunicator, SimulatedWorld
from .torch_backend import TorchCommunicator, join_group, pick_backend
from .plot import plot_overlap, plot_trace
from .trace import AlphaBeta, Event, Message, RankTraffic, Trace

__all__ = [
    "AlphaBeta", "CommError", "CommTimeout", "Communicator", "DeadlockError", "Event", "Handle",
    "Message", "MismatchError", "PeerFailed", "PointToPoint", "RankTraffic", "ReduceOp",
    "SimulatedCommunicator", "SimulatedWorld", "TorchCommunicator", "Trace", "chunk_bounds",
    "VirtualClock", "join_group", "pick_backend", "plot_overlap", "plot_trace", "wait_all",
]
