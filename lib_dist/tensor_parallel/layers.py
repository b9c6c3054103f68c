"""Column- and row-parallel linear layers, built from an ordinary `nn.Linear`'s full weights.

`nn.Linear` computes y = x W^T + b with W of shape (out, in).
- Column-parallel: rank r keeps a block of W's rows (output features). Every rank needs the
  whole input x and produces its own slice of y: nothing to send forward (f = identity), but
  x's gradient is a sum over ranks (f's backward all-reduces it).
- Row-parallel: rank r keeps a block of W's columns (input features) and takes the matching
  slice of x, which is what a column-parallel layer left it. Each rank's product is a partial
  sum of y: one all-reduce forward (g), none backward. The bias is added once, after the sum;
  added before it, it would be counted world_size times.

A column-parallel layer followed by a row-parallel one (the Megatron MLP) thus costs one
all-reduce forward and one backward, whatever lies between them, as long as it works element
by element (GELU) or within a rank's slice (attention heads).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..comm import Communicator
from .functions import copy_to_ranks, gather_from_ranks, reduce_from_ranks


def shard(tensor: torch.Tensor, comm: Communicator, dim: int, parts: int = 1,
          what: str = "tensor") -> torch.Tensor:
    """This rank's share of `tensor` along `dim`, a copy. `parts` > 1: the dimension is made
    of `parts` equal blocks (a fused query/key/value weight: 3), and the rank takes its chunk
    of each."""
    size, ranks = tensor.shape[dim], comm.world_size
    if size % (parts * ranks):
        sizes = f"{parts} blocks of {size // parts}" if parts > 1 else str(size)
        raise ValueError(f"{what}: {sizes} does not split evenly over {ranks} ranks; "
                         f"choose sizes divisible by the tensor-parallel size {ranks}")
    return piece_of(tensor, comm.rank, ranks, dim, parts)


def piece_of(tensor: torch.Tensor, rank: int, ranks: int, dim: int, parts: int = 1
             ) -> torch.Tensor:
    """Rank `rank`'s share of `tensor` among `ranks`, as `shard` cuts it (a copy)."""
    blocks = tensor.detach().chunk(parts, dim)
    return torch.cat([b.chunk(ranks, dim)[rank] for b in blocks], dim).clone()


def unshard(shards: list[torch.Tensor], dim: int, parts: int = 1) -> torch.Tensor:
    """The full tensor from every rank's `shard` of it, in rank order (tests, checkpoints)."""
    pieces = [s.chunk(parts, dim) for s in shards]
    return torch.cat([torch.cat([p[k] for p in pieces], dim) for k in range(parts)], dim)


class ColumnParallelLinear(nn.Module):
    """`linear` with this rank's block of output features; the output is this rank's slice of
    the full output, or (gather_output) the full output, all-gathered."""

    def __init__(self, linear: nn.Linear, comm: Communicator, *, gather_output: bool = False,
                 parts: int = 1):
        super().__init__()
        what = f"ColumnParallelLinear's {linear.out_features} output features"
        self.comm, self.gather_output, self.parts = comm, gather_output, parts
        self.weight = nn.Parameter(shard(linear.weight, comm, 0, parts, what))
        self.bias = (nn.Parameter(shard(linear.bias, comm, 0, parts, what))
                     if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_ranks(x, self.comm), self.weight, self.bias)
        if not self.gather_output:
            return y
        y = gather_from_ranks(y, self.comm)  # rank by rank: each rank's chunk of every part
        ranks, width = self.comm.world_size, y.shape[-1] // (self.comm.world_size * self.parts)
        return y.unflatten(-1, (ranks, self.parts, width)).transpose(-3, -2).flatten(-3)


class RowParallelLinear(nn.Module):
    """`linear` with this rank's block of input features; takes this rank's slice of the
    input and returns the full output on every rank (one all-reduce, then the bias)."""

    def __init__(self, linear: nn.Linear, comm: Communicator):
        super().__init__()
        what = f"RowParallelLinear's {linear.in_features} input features"
        self.comm = comm
        self.weight = nn.Parameter(shard(linear.weight, comm, 1, what=what))
        self.bias = (nn.Parameter(linear.bias.detach().clone())
                     if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_ranks(F.linear(x, self.weight), self.comm)
        return y + self.bias if self.bias is not None else y
