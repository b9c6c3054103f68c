"""The alternative to the ring: every rank all-gathers the whole sequence's keys and values,
then attends its own queries to all of them.

Simple, and the same bytes on the wire as the ring (each K/V block reaches each other rank
once), but each rank holds the whole sequence's K/V at once (memory that does not fall with N)
and the gather is not overlapped with compute. Backward returns each block's gradient to its
owner with a reduce-scatter (every rank's queries contributed to it).

Ranks may hold different numbers of tokens (a sequence the world does not divide): blocks are
zero-padded to the largest for the collectives and trimmed after.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ..comm import Communicator
from ..comm.autograd import Transposed
from .layout import Layout


def all_gather_sequence(x: torch.Tensor, comm: Communicator, sizes: list[int]) -> torch.Tensor:
    """Every rank's (..., its `sizes[rank]` tokens, width) block, concatenated by rank along
    the sequence (dim -2)."""
    pieces = comm.all_gather(_padded(x, max(sizes)))
    return torch.cat([p[..., :size, :] for p, size in zip(pieces, sizes)], dim=-2)


def reduce_scatter_sequence(x: torch.Tensor, comm: Communicator, sizes: list[int]
                            ) -> torch.Tensor:
    """The sum over the ranks of (..., all tokens, width) `x`, this rank's `sizes[rank]` tokens
    of it: `all_gather_sequence`'s transpose."""
    longest = max(sizes)
    stacked = torch.stack([_padded(p, longest) for p in x.split(sizes, dim=-2)])
    mine = comm.reduce_scatter(stacked.contiguous(), op="sum")  # rank r's block, summed
    shape = (*x.shape[:-2], longest, x.shape[-1])
    return mine.view(shape)[..., :sizes[comm.rank], :]


def gather_sequence(x: torch.Tensor, comm: Communicator, sizes: list[int]) -> torch.Tensor:
    """`all_gather_sequence`, differentiable: its backward is the reduce-scatter."""
    return Transposed.apply(x, partial(all_gather_sequence, comm=comm, sizes=sizes),
                            partial(reduce_scatter_sequence, comm=comm, sizes=sizes))


def scatter_sequence(x: torch.Tensor, comm: Communicator, sizes: list[int]) -> torch.Tensor:
    """`reduce_scatter_sequence`, differentiable: its backward is the all-gather."""
    return Transposed.apply(x, partial(reduce_scatter_sequence, comm=comm, sizes=sizes),
                            partial(all_gather_sequence, comm=comm, sizes=sizes))


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator,
                       layout: Layout) -> torch.Tensor:
    """`ring_attention`'s result, by all-gathering K and V (one collective) first."""
    sizes = layout.sizes()
    kv = gather_sequence(torch.cat([k, v], dim=-1).contiguous(), comm, sizes)
    keys, values = kv.split(q.shape[-1], dim=-1)
    everyone = torch.cat([layout.positions(r) for r in range(comm.world_size)]).to(q.device)
    allowed = layout.positions(comm.rank).to(q.device)[:, None] >= everyone[None, :]
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~allowed, -math.inf)
    return torch.softmax(scores, dim=-1) @ values


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """`x` with zero rows appended along the sequence (dim -2) up to `length`."""
    pad = x.new_zeros(*x.shape[:-2], length - x.shape[-2], x.shape[-1])
    return torch.cat([x, pad], dim=-2).contiguous()


__all__ = ["all_gather_sequence", "gather_sequence", "gathered_attention",
           "reduce_scatter_sequence", "scatter_sequence"]
