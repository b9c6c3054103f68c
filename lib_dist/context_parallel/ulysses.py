"""Ulysses-style context parallelism: trade the sequence split for a head split, attend, and
trade back, with two all-to-alls each way.

Before attention each rank holds all heads of its tokens, (B, H, its tokens, D). One
all-to-all sends rank d the heads d*H/N..(d+1)*H/N-1 of this rank's tokens; afterwards each
rank holds H/N heads of *every* token, (B, H/N, T, D), and computes ordinary causal attention
for them with no further messages. A second all-to-all returns each token's heads to its rank.

Against the ring: 4 all-to-alls per forward (q, k, v, out; each moves (N-1)/N of a rank's
share) instead of N-1 hops of K/V, and the whole sequence's scores for H/N heads on each rank
at once. It needs N to divide the number of heads; the ring does not.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ..comm import Communicator
from ..comm.autograd import Transposed
from .layout import Layout


def _to_heads(x: torch.Tensor, comm: Communicator, sizes: list[int]) -> torch.Tensor:
    """(B, H, this rank's tokens, D) -> (B, H/N, every rank's tokens by rank, D)."""
    inputs = [c.contiguous() for c in x.chunk(comm.world_size, dim=1)]
    outputs = [x.new_empty(x.shape[0], x.shape[1] // comm.world_size, size, x.shape[3])
               for size in sizes]
    return torch.cat(comm.all_to_all(inputs, outputs), dim=2)


def _to_tokens(x: torch.Tensor, comm: Communicator, sizes: list[int]) -> torch.Tensor:
    """`_to_heads`' inverse: (B, H/N, all tokens, D) -> (B, H, this rank's tokens, D)."""
    inputs = [c.contiguous() for c in x.split(sizes, dim=2)]
    outputs = [x.new_empty(x.shape[0], x.shape[1], sizes[comm.rank], x.shape[3])
               for _ in sizes]
    return torch.cat(comm.all_to_all(inputs, outputs), dim=1)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator,
                      layout: Layout) -> torch.Tensor:
    """`ring_attention`'s result by two all-to-alls: heads split instead of the sequence."""
    if q.shape[1] % comm.world_size:
        raise ValueError(f"Ulysses attention splits the {q.shape[1]} heads over "
                         f"{comm.world_size} ranks; choose a head count divisible by "
                         f"{comm.world_size}, or ring attention")
    to_heads = partial(_to_heads, comm=comm, sizes=layout.sizes())
    to_tokens = partial(_to_tokens, comm=comm, sizes=layout.sizes())
    q, k, v = (Transposed.apply(t, to_heads, to_tokens) for t in (q, k, v))
    order = torch.cat([layout.positions(r) for r in range(comm.world_size)]).to(q.device)
    allowed = order[:, None] >= order[None, :]  # causal, by global position
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed,
                                                                          -math.inf)
    return Transposed.apply(torch.softmax(scores, dim=-1) @ v, to_tokens, to_heads)


__all__ = ["ulysses_attention"]
