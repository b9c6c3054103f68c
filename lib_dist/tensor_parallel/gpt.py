"""The module-02 GPT built tensor-parallel from a full one: every rank holds 1/tp of each
matrix, and the logits stay split by vocabulary all the way into the loss.

    comm-rank's model = TensorParallelGPT(GPT(config), comm)   # same seed on every rank
    loss = model.loss(idx, targets)     # equals next_token_loss(GPT(config)(idx), targets)

Position embeddings and LayerNorms are small and kept whole on every rank. The token
embedding and the output layer share one matrix in `GPT`; here they share this rank's rows of
it, so the shard's gradient gathers both uses, as the full matrix's does.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from ..comm import Communicator
from ..models.gpt import GPT, Block
from .blocks import ParallelBlock, _check_no_dropout
from .functions import copy_to_ranks
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


class TensorParallelGPT(nn.Module):
    """This rank's part of `gpt`; `forward` gives this rank's logits (B, T, V/tp)."""

    def __init__(self, gpt: GPT, comm: Communicator):
        super().__init__()
        _check_no_dropout(gpt, "TensorParallelGPT")
        self.comm, self.config = comm, gpt.config
        self.tok_emb = VocabParallelEmbedding(gpt.tok_emb, comm)
        self.pos_emb = copy.deepcopy(gpt.pos_emb)
        self.blocks = nn.ModuleList(ParallelBlock(cast(Block, b), comm) for b in gpt.blocks)
        self.ln_f = copy.deepcopy(gpt.ln_f)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        # The head is column-parallel over the vocabulary, with the embedding's rows as its
        # weight: f first, so the residual stream's gradient is summed over the ranks.
        return F.linear(copy_to_ranks(self.ln_f(x), self.comm), self.tok_emb.weight)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy, the same on every rank."""
        return vocab_parallel_cross_entropy(self(idx), targets, self.comm)
