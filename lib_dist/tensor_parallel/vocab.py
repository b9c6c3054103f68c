"""The vocabulary split over ranks: the embedding, the output layer and the cross-entropy.

Rank r keeps rows r*V/tp..(r+1)*V/tp-1 of the (tied) embedding matrix.
- Embedding: a rank looks up the ids in its range and writes zeros for the others; the sum
  over ranks (one all-reduce) is the full lookup.
- Output layer: a column-parallel product, each rank's logits for its own slice of the
  vocabulary, (B, T, V/tp). Gathering them would move tp times more data than the whole
  backbone's activations for a large vocabulary, so they never are:
- Cross-entropy: log-sum-exp needs the maximum logit of each row and the sum of the
  exponentials, and the loss needs the target's logit, which lives on one rank. Each is a
  reduction of a number per row: the maxima are all-gathered (`lib_dist.comm` all-reduces sum
  only), then the sums and the target logits go in one all-reduce. The gradient,
  softmax - onehot, needs no communication: each rank has its columns' softmax already.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..comm import Communicator
from .functions import reduce_from_ranks
from .layers import shard


def vocab_range(vocab_size: int, comm: Communicator) -> tuple[int, int]:
    """The token ids [lo, hi) whose rows this rank keeps."""
    per_rank = vocab_size // comm.world_size
    return comm.rank * per_rank, (comm.rank + 1) * per_rank


class VocabParallelEmbedding(nn.Module):
    """`embedding` with this rank's rows; returns the full lookup on every rank."""

    def __init__(self, embedding: nn.Embedding, comm: Communicator):
        super().__init__()
        what = f"VocabParallelEmbedding's vocabulary of {embedding.num_embeddings}"
        self.comm = comm
        self.weight = nn.Parameter(shard(embedding.weight, comm, 0, what=what))
        self.lo, self.hi = vocab_range(embedding.num_embeddings, comm)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        elsewhere = (idx < self.lo) | (idx >= self.hi)
        local = F.embedding((idx - self.lo).masked_fill(elsewhere, 0), self.weight)
        return reduce_from_ranks(local.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.comm)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy from each rank's slice of the logits (N, V/tp); see the module."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, comm: Communicator,
                ignore_index: int) -> torch.Tensor:
        lo = comm.rank * logits.shape[1]
        maxima = torch.stack(comm.all_gather(logits.detach().amax(dim=1).contiguous()))
        shifted = logits.detach() - maxima.amax(dim=0).unsqueeze(1)
        exp = shifted.exp()
        mine = (target >= lo) & (target < lo + logits.shape[1])
        column = (target - lo).where(mine, 0).unsqueeze(1)
        picked = shifted.gather(1, column).squeeze(1).where(mine, 0.0)
        sums = comm.all_reduce(torch.stack([exp.sum(dim=1), picked]), "sum")
        keep = target != ignore_index
        count = keep.sum()
        ctx.save_for_backward(exp / sums[0].unsqueeze(1), column, mine, keep)
        ctx.count = count
        return ((sums[0].log() - sums[1]) * keep).sum() / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, column, mine, keep = ctx.saved_tensors
        onehot = torch.zeros_like(softmax).scatter_(1, column, mine.unsqueeze(1).to(softmax.dtype))
        scale = grad * keep.unsqueeze(1) / ctx.count
        return (softmax - onehot) * scale, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                                 comm: Communicator, ignore_index: int = -100) -> torch.Tensor:
    """Module 01's mean cross-entropy, from this rank's columns of the logits (..., V/tp) and
    the full targets (...); the same loss on every rank. No rank ever holds all the logits."""
    flat = logits.reshape(-1, logits.shape[-1])
    return VocabParallelCrossEntropy.apply(flat, target.reshape(-1), comm, ignore_index)
