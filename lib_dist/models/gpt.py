"""A tiny GPT: a decoder-only transformer over characters, in the spirit of nanoGPT.

Token and position embeddings go through `n_layer` blocks, each a causal self-attention and an
MLP, both wrapped as pre-LayerNorm residual branches: x + attn(ln(x)), then x + mlp(ln(x)).
A final LayerNorm and a linear head (sharing its weight with the token embedding) give the
logits of the next token at every position. Attention is written out (scores, causal mask,
softmax, weighted sum) rather than fused, so every step can be inspected and measured;
`fused_attention=True` uses torch's `scaled_dot_product_attention` instead, which never
materialises the (T, T) scores on devices with a fused kernel (the same function, to rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    """The shape of a GPT. `block_size` is the longest context it can attend over."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    fused_attention: bool = False  # torch's scaled_dot_product_attention, not written out

    def __repr__(self) -> str:  # the option shown only when taken, as configs printed before it
        fields = {k: v for k, v in self.__dict__.items()
                  if k != "fused_attention" or self.fused_attention}
        return f"GPTConfig({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head "
                             f"({self.n_head})")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t attends to positions 0..t only."""

    causal: torch.Tensor  # a buffer: True where position t may attend to position s <= t

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)   # queries, keys, values at once
        self.proj = nn.Linear(config.n_embd, config.n_embd)      # back into the residual stream
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        mask = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
        self.register_buffer("causal", mask, persistent=False)
        self.fused = config.fused_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        C = x.shape[2]
        q, k, v = self.qkv(x).split(C, dim=2)
        if self.fused:
            p = self.attn_dropout.p if self.training else 0.0
            y = fused_causal_attention(q, k, v, C // self.n_head, p)
        else:
            y = causal_attention(q, k, v, C // self.n_head, self.causal, self.attn_dropout)
        return self.resid_dropout(self.proj(y))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_size: int,
                     causal: torch.Tensor, dropout: nn.Module | None = None) -> torch.Tensor:
    """Heads of `head_size` side by side in q, k, v (B, T, heads x head_size): each head's
    position t attends to its own keys and values at positions 0..t (`causal`: the mask);
    the heads' outputs side by side again. Tensor-parallel attention calls it with its
    rank's heads only."""
    B, T, width = q.shape
    # (B, T, width) -> (B, heads, T, head_size): each head attends independently
    q, k, v = (t.view(B, T, width // head_size, head_size).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_size)
    scores = scores.masked_fill(~causal[:T, :T], float("-inf"))
    weights = F.softmax(scores, dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return (weights @ v).transpose(1, 2).reshape(B, T, width)


def fused_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_size: int,
                           dropout_p: float = 0.0) -> torch.Tensor:
    """`causal_attention` by torch's fused kernel (its dropout draws other masks)."""
    B, T, width = q.shape
    q, k, v = (t.view(B, T, width // head_size, head_size).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return y.transpose(1, 2).reshape(B, T, width)


class FeedForward(nn.Module):
    """Position-wise MLP: widen to 4 * n_embd, GELU, project back."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """One transformer layer: attention then MLP, each a pre-LayerNorm residual branch."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`GPT(config)(idx)` maps token ids `(B, T)` to next-token logits `(B, T, vocab_size)`."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying: one matrix embeds and un-embeds
        self.apply(_init_weights)
        # GPT-2's scaled init: each residual branch's output projection gets std / sqrt(2 L),
        # so the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens, but block_size is "
                             f"{self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.dropout(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def num_params(self) -> int:
        """Number of parameters, each counted once (the tied head is the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
        """Extend `idx` (B, T) by sampling one token at a time from the model's distribution
        (sharpened by temperature < 1, restricted to the top_k most likely tokens if given)."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[:, -1, :] / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
