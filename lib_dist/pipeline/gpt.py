"""The tiny GPT of module 02 as a list of layers, ready to be split into stages.

A pipeline needs the model as a sequence whose composition is the model: embeddings, the
blocks, then the final LayerNorm and head. `lib_dist.models.GPT` ties its head to the token
embedding; stages on different ranks cannot share a tensor, so here the head is a copy of it
(a pipelined GPT either unties them, as here, or all-reduces the two gradients between the
first and last stage every step, as Megatron-LM does).

    layers = gpt_layers(GPTConfig(vocab_size=65, n_layer=8), seed=0)
    logits = nn.Sequential(*layers)(idx)     # the single-process model
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch.nn import functional as F

from ..models.gpt import GPT, Block, GPTConfig


class Embed(nn.Module):
    """Token ids (B, T) to the residual stream (B, T, C): token plus position embeddings."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)


class Head(nn.Module):
    """The residual stream (B, T, C) to next-token logits (B, T, vocab)."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.ln_f = gpt.ln_f
        self.head = nn.Linear(gpt.config.n_embd, gpt.config.vocab_size, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(gpt.head.weight)  # untied: a copy of the embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


_BUILDING = threading.Lock()  # simulated ranks are threads: one seeded build at a time


def gpt_layers(config: GPTConfig, seed: int = 0) -> list[nn.Module]:
    """[Embed, Block x n_layer, Head], initialised as `GPT(config)` is under `seed`. The build
    seeds torch's global generator (restoring it after); concurrent calls, such as the ranks
    of a `SimulatedWorld` each building its layers, take turns, so each gets the same model."""
    if config.dropout:
        raise ValueError("pipelined layers are compared with one process: use dropout=0")
    with _BUILDING, torch.random.fork_rng():  # Head's own Linear draws from it too
        torch.manual_seed(seed)
        gpt = GPT(config)
        blocks: list[nn.Module] = list(gpt.blocks)
        assert all(isinstance(b, Block) for b in blocks)
        return [Embed(gpt), *blocks, Head(gpt)]


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (B, T, vocab) logits against (B, T) next tokens."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
