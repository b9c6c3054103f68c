"""The module-02 GPT's MLP and attention, split over tensor-parallel ranks, Megatron-style.

Both are a column-parallel layer, work local to a rank, then a row-parallel layer: one
all-reduce forward (the row-parallel layer's) and one backward (the column-parallel layer's
input gradient). Attention splits by heads: rank r keeps heads r*h/tp..(r+1)*h/tp-1, their
rows of the fused query/key/value weight and their columns of the output projection; a head
attends with its own queries, keys and values only, so no rank needs another's.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from .. import registry
from ..comm import Communicator
from ..models.gpt import Block, CausalSelfAttention, FeedForward, causal_attention
from .layers import ColumnParallelLinear, RowParallelLinear


def _check_no_dropout(module: nn.Module, what: str) -> None:
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in module.modules()):
        raise ValueError(f"{what}: dropout > 0 needs a random stream per rank that stays in "
                         f"step with one process's; build the model with dropout=0")


class ParallelMLP(nn.Module):
    """`FeedForward` (fc, GELU, proj) with fc column-parallel and proj row-parallel."""

    def __init__(self, mlp: FeedForward, comm: Communicator):
        super().__init__()
        _check_no_dropout(mlp, "ParallelMLP")
        self.fc = ColumnParallelLinear(mlp.fc, comm)
        self.proj = RowParallelLinear(mlp.proj, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class ParallelAttention(nn.Module):
    """`CausalSelfAttention` with this rank's share of the heads."""

    causal: torch.Tensor

    def __init__(self, attn: CausalSelfAttention, comm: Communicator):
        super().__init__()
        _check_no_dropout(attn, "ParallelAttention")
        if attn.n_head % comm.world_size:
            raise ValueError(f"ParallelAttention: {attn.n_head} heads do not split evenly over "
                             f"{comm.world_size} ranks; choose n_head divisible by the "
                             f"tensor-parallel size {comm.world_size}")
        self.n_head = attn.n_head // comm.world_size  # this rank's heads
        self.head_size = attn.proj.in_features // attn.n_head
        self.qkv = ColumnParallelLinear(attn.qkv, comm, parts=3)
        self.proj = RowParallelLinear(attn.proj, comm)
        self.register_buffer("causal", attn.causal.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=2)  # this rank's heads of each
        return self.proj(causal_attention(q, k, v, self.head_size, self.causal))


class ParallelBlock(nn.Module):
    """A transformer `Block` whose attention and MLP are tensor-parallel; its LayerNorms are
    copies on every rank (their inputs are the same everywhere, and so are their gradients).
    `attention` and `mlp`: the classes to split them with; by default module 6's, or the
    student's own where registered in this process (`lib_dist.registry`). Name them to take a
    student's to engines, which have registered nothing."""

    def __init__(self, block: Block, comm: Communicator, attention: type | None = None,
                 mlp: type | None = None):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn = (attention or registry.implementation("ParallelAttention"))(block.attn, comm)
        self.mlp = (mlp or registry.implementation("ParallelMLP"))(block.mlp, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
