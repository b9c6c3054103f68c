"""A communicator over some of the ranks of the torch.distributed group: a subgroup made with
`torch.distributed.new_group`, what Horovod's process sets run on.

`TorchCommunicator.subgroup(ranks)` makes one (collective: every rank of the whole group
calls it, with the same ranks, members or not). Its ranks are numbered 0..len(ranks) - 1 in
the order of `ranks`, which must be increasing: torch.distributed numbers a group's ranks in
increasing order of global rank whatever order it is given (its `sort_ranks=False` is newer
than the oldest torch lib_dist supports), so a group of [3, 1] would gather and exchange in
another order than its messages'. Its collectives are torch.distributed's on the subgroup, its
messages the backend's own sends and receives (the subgroup's gloo connections are its own, so
it may run beside the whole group's operations on another thread).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .base import Communicator, Handle, ReduceOp, _check_op
from .transport import translated


class _WorkHandle(Handle):
    def __init__(self, work: Any, rank: int, timeout: float, what: str):
        self._work, self._rank, self._timeout, self._what = work, rank, timeout, what

    def wait(self) -> None:
        with translated(self._rank, self._timeout, self._what):
            self._work.wait()

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


class GroupCommunicator(Communicator):
    """This process's rank of the subgroup of `ranks` (global ranks, this one among them)."""

    def __init__(self, group: Any, ranks: list[int], device: torch.device, timeout: float):
        super().__init__(ranks.index(dist.get_rank()), len(ranks), device)
        self.group, self.ranks, self.timeout = group, ranks, timeout
        self.backend = str(dist.get_backend(group))

    def close(self) -> None:
        """Forget the subgroup (collective over the whole group, as making it was)."""
        dist.destroy_process_group(self.group)

    def _post_send(self, tensor: torch.Tensor, dst: int) -> Handle:
        what = f"send to rank {dst}"
        with translated(self.rank, self.timeout, what):  # gloo may fail as it posts
            work = dist.isend(tensor, self.ranks[dst], group=self.group)
        return _WorkHandle(work, self.rank, self.timeout, what)

    def _post_recv(self, buffer: torch.Tensor, src: int) -> Handle:
        what = f"recv from rank {src}"
        with translated(self.rank, self.timeout, what):
            work = dist.irecv(buffer, self.ranks[src], group=self.group)
        return _WorkHandle(work, self.rank, self.timeout, what)

    def world_barrier(self) -> None:
        with translated(self.rank, self.timeout, "barrier"):
            dist.barrier(group=self.group)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self._check_peer(src, "broadcast")
        self._collective("broadcast", tensor.nbytes, lambda: dist.broadcast(
            tensor, self.ranks[src], group=self.group))
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum",
                   algorithm: str | None = None) -> torch.Tensor:
        """torch.distributed's all-reduce over the group; `algorithm`: one of
        `lib_dist.comm.algorithms.ALGORITHMS` or a registered one (`Communicator.all_reduce`),
        run on the group's messages."""
        if algorithm is not None:
            return Communicator.all_reduce(self, tensor, op, algorithm=algorithm)
        _check_op(op, tensor)
        self._collective("all_reduce", tensor.nbytes,
                         lambda: dist.all_reduce(tensor, group=self.group))
        if op == "avg":
            tensor /= self.world_size
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._collective("all_gather", tensor.nbytes,
                         lambda: dist.all_gather(out, tensor, group=self.group))
        return out

    def all_to_all(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor] | None = None,
                   agreed: bool = False) -> list[torch.Tensor]:
        inputs, outputs = self._check_all_to_all(inputs, outputs, agreed)
        sent = torch.cat([t.reshape(-1) for t in inputs])
        got = torch.empty(sum(t.numel() for t in outputs), dtype=sent.dtype, device=sent.device)
        self._collective("all_to_all", sent.nbytes, lambda: dist.all_to_all_single(
            got, sent, [t.numel() for t in outputs], [t.numel() for t in inputs],
            group=self.group))
        for t, part in zip(outputs, got.split([t.numel() for t in outputs])):
            t.copy_(part.view_as(t))
        return outputs

    def _gather_quietly(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        with translated(self.rank, self.timeout, what):
            dist.all_gather(out, tensor, group=self.group)
        return out

    def _collective(self, name: str, nbytes: int, fn: Callable[[], Any]) -> None:
        with self._traced(name, nbytes=nbytes), translated(self.rank, self.timeout, name):
            fn()
