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
from typing import Any

import torch

from ..comm import Communicator
from .layout import Layout


class GatherSequence(torch.autograd.Function):
    """forward: every rank's (B, heads, tokens, width) block, concatenated by rank;
    backward: this rank's block of the summed gradient (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator, sizes: list[int]
                ) -> torch.Tensor:
        ctx.comm, ctx.sizes = comm, sizes
        padded = _padded(x, max(sizes))
        pieces = comm.all_gather(padded)
        return torch.cat([p[..., :size, :] for p, size in zip(pieces, sizes)], dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        comm, sizes = ctx.comm, ctx.sizes
        longest = max(sizes)
        stacked = torch.stack([_padded(g, longest) for g in grad.split(sizes, dim=-2)])
        mine = comm.reduce_scatter(stacked.contiguous(), op="sum")  # rank r's block, summed
        shape = (*grad.shape[:-2], longest, grad.shape[-1])
        return mine.view(shape)[..., :sizes[comm.rank], :], None, None


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator,
                       layout: Layout) -> torch.Tensor:
    """`ring_attention`'s result, by all-gathering K and V (one collective) first."""
    sizes = layout.sizes()
    kv = GatherSequence.apply(torch.cat([k, v], dim=-1).contiguous(), comm, sizes)
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


__all__ = ["GatherSequence", "gathered_attention"]
