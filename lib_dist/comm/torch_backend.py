"""The communicator over a real torch.distributed process group: gloo on CPU, NCCL on GPUs.

`join_group` starts the group; `TorchCommunicator` wraps it. Point-to-point operations map
to `dist.isend`/`dist.irecv`; the collectives are torch.distributed's native ones. A gloo
operation that times out closes its connection, so after a `CommTimeout` the group is
unusable: destroy it and join a new one (`lib_dist.cluster` does this for you).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from .base import Communicator, Handle, ReduceOp, _check_op, _nbytes, chunk_bounds
from .errors import CommError, CommTimeout
from .trace import Trace

DEFAULT_TIMEOUT = 60.0


def pick_backend(device: torch.device) -> str:
    """NCCL when this rank owns a GPU, else gloo. Every rank must pick the same."""
    return "nccl" if device.type == "cuda" else "gloo"


def join_group(rank: int, world_size: int, store: dist.Store, device: torch.device | str = "cpu",
               timeout: float = DEFAULT_TIMEOUT) -> TorchCommunicator:
    """Join the default process group through `store` and return this rank's communicator.

    Every rank must call this at the same time. `timeout` (seconds) bounds the rendezvous and
    every later operation, instead of torch's 30-minute default.
    """
    device = torch.device(device)
    if dist.is_initialized():
        dist.destroy_process_group()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(pick_backend(device), store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return TorchCommunicator(device, timeout)


class _TorchHandle(Handle):
    def __init__(self, comm: TorchCommunicator, work: dist.Work, what: str):
        self._comm, self._work, self._what = comm, work, what

    def wait(self) -> None:
        try:
            self._work.wait()
        except RuntimeError as e:
            raise self._comm._translate(e, self._what) from None

    def is_completed(self) -> bool:
        return self._work.is_completed()


class TorchCommunicator(Communicator):
    """This process's rank of the default torch.distributed group."""

    def __init__(self, device: torch.device | str = "cpu", timeout: float = DEFAULT_TIMEOUT,
                 trace: Trace | None = None):
        if not dist.is_initialized():
            raise CommError("no torch.distributed group: call lib_dist.comm.join_group first")
        super().__init__(dist.get_rank(), dist.get_world_size(), device, trace)
        self.timeout = timeout
        self.backend = dist.get_backend()

    def _post_send(self, tensor: torch.Tensor, dst: int) -> Handle:
        return _TorchHandle(self, dist.isend(tensor, dst), f"send to rank {dst}")

    def _post_recv(self, buffer: torch.Tensor, src: int) -> Handle:
        return _TorchHandle(self, dist.irecv(buffer, src), f"recv from rank {src}")

    def world_barrier(self) -> None:
        # Not `_collective`: `Communicator.barrier` records the barrier already.
        try:
            dist.barrier()
        except RuntimeError as e:
            raise self._translate(e, "barrier") from None

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self._check_peer(src, "broadcast")
        self._collective("broadcast", _nbytes(tensor), dist.broadcast, tensor, src)
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        _check_op(op, tensor)
        self._collective("all_reduce", _nbytes(tensor), dist.all_reduce, tensor)
        if op == "avg":
            tensor /= self.world_size
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._collective("all_gather", _nbytes(tensor), dist.all_gather, out, tensor)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        _check_op(op, tensor)
        flat = tensor.reshape(-1)
        bounds = chunk_bounds(flat.numel(), self.world_size)
        size = bounds[0][1] - bounds[0][0]
        padded = torch.zeros(size * self.world_size, dtype=flat.dtype, device=flat.device)
        padded[: flat.numel()] = flat
        mine = torch.empty(size, dtype=flat.dtype, device=flat.device)
        self._collective("reduce_scatter", _nbytes(padded), _reduce_scatter_single, mine, padded)
        lo, hi = bounds[self.rank]
        mine = mine[: hi - lo]
        if op == "avg":
            mine /= self.world_size
        return mine

    def _collective(self, name: str, nbytes: int, fn, *args) -> None:
        start, after = time.monotonic(), self._completed
        self.waiting_in = name
        try:
            fn(*args)
        except RuntimeError as e:
            raise self._translate(e, name) from None
        finally:
            self.waiting_in = None
        self._record(name, -1, nbytes, start, after)

    def _translate(self, error: RuntimeError, what: str) -> CommError:
        text = str(error)
        if "Timed out" in text or "timeout" in text.lower():
            return CommTimeout(f"rank {self.rank}: {what} did not complete within "
                               f"{self.timeout:g} s; the group is now unusable and must be "
                               f"rebuilt ({text.splitlines()[0][:200]})")
        return CommError(f"rank {self.rank}: {what} failed: {text.splitlines()[0][:300]}")



# torch 2.13 renamed reduce_scatter_tensor (now deprecated, with a warning) to
# reduce_scatter_single; warnings on stderr would cost students marks under nbgrader.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
