"""Collectives that are not lab03's answers: what the student edition runs in their place.

Lab03 asks students to write broadcast, all-gather, reduce-scatter and the all-reduces from
sends and receives, so the student edition of lib_dist (`grader.edition`) has no body for
lib_dist's. Yet lab00, the first lab, and every later one call collectives. So there, until a
student registers their own (`lib_dist.registry.use_my_answers`), simulated ranks run these
(`lib_dist.stand_ins` maps each reference to its stand-in; engines run torch.distributed's):

- all-gather by Bruck's algorithm: in round k rank r sends every block it holds so far to rank
  r - 2^k and gets as many from rank r + 2^k, so that after ceil(log2 N) rounds it holds all N
  blocks; (N - 1) blocks sent in all, as a direct all-gather sends, in log2 N messages not N - 1;
- reduce-scatter by the same rounds backwards: each round rank r hands the partial sums of the
  upper half of the blocks it is responsible for to rank r + 2^k, which adds them to its own;
  (N - 1) / N of the tensor sent, as a ring's reduce-scatter, in log2 N messages;
- all-reduce as the two (Rabenseifner's pairing, for any N); broadcast as an all-reduce of the
  root's tensor and everyone else's zeros (a sum with zeros changes no number).

The block of rank r is its chunk of the flattened tensor (`chunk_bounds`), as lib_dist's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .algorithms import _exchange
from .point_to_point import chunk_bounds

if TYPE_CHECKING:
    from .base import Communicator, ReduceOp
    from .torch_backend import TorchCommunicator


def all_reduce(comm: Communicator, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
    """`tensor` summed (or averaged) over the ranks, in place."""
    with comm._traced("all_reduce", nbytes=tensor.nbytes):
        _all_reduce(comm, tensor)
    if op == "avg":
        tensor /= comm.world_size
    return tensor


def broadcast(comm: Communicator, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """`src`'s tensor on every rank, in place: the sum of it and everyone else's zeros."""
    comm._check_peer(src, "broadcast")
    with comm._traced("broadcast", nbytes=tensor.nbytes):
        if comm.rank != src:
            tensor.zero_()
        _all_reduce(comm, tensor)
    return tensor


def all_gather(comm: Communicator, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor (one shape and dtype on every rank), by rank."""
    n = comm.world_size
    with comm._traced("all_gather", nbytes=tensor.nbytes):
        blocks = _bruck_gather(comm, [tensor.reshape(-1).clone()], [tensor.numel()] * n)
    return [b.view_as(tensor) for b in blocks]


def reduce_scatter(comm: Communicator, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
    """This rank's chunk (`chunk_bounds`) of the flattened tensor's sum over the ranks."""
    flat = tensor.reshape(-1)
    with comm._traced("reduce_scatter", nbytes=flat.nbytes):
        mine = _bruck_scatter(comm, flat)
    if op == "avg":
        mine /= comm.world_size
    return mine


def native_all_reduce(comm: TorchCommunicator, tensor: torch.Tensor,
                      op: ReduceOp = "sum", algorithm: str | None = None) -> torch.Tensor:
    """torch.distributed's all-reduce, whatever `algorithm` asks (lib_dist's are lab03's)."""
    comm._collective("all_reduce", tensor.nbytes, comm._all_reduce, tensor, "native")
    if op == "avg":
        tensor /= comm.world_size
    return tensor


def _all_reduce(comm: Communicator, tensor: torch.Tensor) -> None:
    flat = tensor.reshape(-1)  # a view when it can be, else a copy written back below
    sizes = [hi - lo for lo, hi in chunk_bounds(flat.numel(), comm.world_size)]
    summed = torch.cat(_bruck_gather(comm, [_bruck_scatter(comm, flat)], sizes))
    tensor.copy_(summed.view_as(tensor))


def _distances(n: int) -> list[int]:
    """1, 2, 4, ... below n: Bruck's rounds."""
    d, found = 1, []
    while d < n:
        found.append(d)
        d *= 2
    return found


def _bruck_gather(comm: Communicator, held: list[torch.Tensor], sizes: list[int]
                  ) -> list[torch.Tensor]:
    """All N blocks, by rank, from `held` = [this rank's block]; block b has `sizes[b]`
    elements. Rank r holds blocks r, r+1, ... (mod N): each round it sends the first
    min(d, N - d) of them to rank r - d and appends as many from rank r + d."""
    n, r = comm.world_size, comm.rank
    for d in _distances(n):
        count = min(d, n - d)
        incoming = [(r + d + i) % n for i in range(count)]
        got = torch.empty(sum(sizes[b] for b in incoming), dtype=held[0].dtype,
                          device=held[0].device)
        _exchange(comm, torch.cat(held[:count]), (r - d) % n, got, (r + d) % n)
        held += list(got.split([sizes[b] for b in incoming]))
    return held[n - r:] + held[: n - r]  # rank r's list starts at block r: rotate to block 0


def _bruck_scatter(comm: Communicator, flat: torch.Tensor) -> torch.Tensor:
    """This rank's block of the sum of every rank's `flat`, by `_bruck_gather`'s rounds in
    reverse: rank r is responsible for blocks r, r+1, ... (mod N), fewer each round; it sends
    the partial sums of those it gives up to rank r + d, and adds rank r - d's to its own."""
    n, r = comm.world_size, comm.rank
    bounds = chunk_bounds(flat.numel(), n)
    partial = [flat[lo:hi].clone() for lo, hi in (bounds[(r + i) % n] for i in range(n))]
    for d in reversed(_distances(n)):
        count = min(d, n - d)
        out = torch.cat(partial[d: d + count])  # blocks r+d.., rank r+d's first ones
        got = torch.empty(sum(p.numel() for p in partial[:count]), dtype=flat.dtype,
                          device=flat.device)
        _exchange(comm, out, (r + d) % n, got, (r - d) % n)
        for p, add in zip(partial[:count], got.split([p.numel() for p in partial[:count]])):
            p += add
        partial = partial[:d]
    return partial[0]

