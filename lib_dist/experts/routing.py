"""Which experts each token goes to, which of those assignments fit, and the balancing loss.

A `Router` is a linear gate (no bias) followed by a softmax over the experts: each token keeps
its k most probable experts, and its gate weights are those experts' probabilities as they
are, **not renormalised** over the k. So with k = 1 (Switch Transformer) a token's output is
p * expert(x), and the router learns from the output as well as from the balancing loss;
renormalising would make every top-1 gate exactly 1, a constant with no gradient.

Each expert processes at most `capacity(tokens, k, experts, factor)` =
ceil(factor * tokens * k / experts) assignments per batch (None: no limit). Past that, the
assignments are dropped in **token order**: an expert keeps those of its earliest tokens (the
batch flattened to (B * T) rows, row-major), and a dropped assignment contributes nothing to
its token's output (the transformer block's residual carries the token on). `keep_in_order`
decides, given how many places earlier tokens (on earlier ranks, with expert parallelism)
already took.

The Switch Transformer's load-balancing loss is experts * sum_e f_e * P_e: f_e the fraction of
assignments routed to expert e (before any is dropped: what the router asked for; with k
experts per token the fractions are of tokens * k, so they sum to 1), P_e the mean router
probability of e. It is 1 when routing is uniform and grows as the router favours a few
experts; only P_e carries a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Routing:
    """What the router decided for a batch of `tokens` rows."""

    probs: torch.Tensor   # (tokens, experts): the softmax of the gate's logits
    chosen: torch.Tensor  # (tokens, k) int64: each token's experts, most probable first
    gates: torch.Tensor   # (tokens, k): the chosen experts' probabilities, not renormalised

    @property
    def n_experts(self) -> int:
        return self.probs.shape[1]

    def counts(self) -> torch.Tensor:
        """(experts,) int64: how many assignments each expert was asked to take."""
        return torch.bincount(self.chosen.reshape(-1), minlength=self.n_experts)


class Router(nn.Module):
    """`Router(n_embd, n_experts, k)(x)`, x of shape (tokens, n_embd): a `Routing`."""

    def __init__(self, n_embd: int, n_experts: int, k: int = 1):
        super().__init__()
        if not 1 <= k <= n_experts:
            raise ValueError(f"each token picks k of the {n_experts} experts, 1 <= k <= "
                             f"{n_experts}; got k={k}")
        self.n_experts, self.k = n_experts, k
        self.gate = nn.Linear(n_embd, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> Routing:
        probs = F.softmax(self.gate(x), dim=-1)
        gates, chosen = torch.topk(probs, self.k, dim=-1)
        return Routing(probs, chosen, gates)


def capacity(tokens: int, k: int, n_experts: int, factor: float | None) -> int | None:
    """The most assignments one expert takes: ceil(factor * tokens * k / experts); None (no
    limit) when `factor` is None."""
    if factor is None:
        return None
    if factor <= 0:
        raise ValueError(f"capacity_factor must be positive (or None: no limit), got {factor}")
    return math.ceil(factor * tokens * k / n_experts)


def keep_in_order(chosen: torch.Tensor, n_experts: int, limit: int | None,
                  taken: torch.Tensor | None = None) -> torch.Tensor:
    """(tokens, k) bool: which assignments fit, in token order, when each expert takes at most
    `limit` and `taken[e]` of expert e's places are already gone (to tokens before these)."""
    if limit is None:
        return torch.ones_like(chosen, dtype=torch.bool)
    per_token = F.one_hot(chosen, n_experts).sum(1)       # (tokens, experts): 0 or 1
    before = per_token.cumsum(0) - per_token              # earlier tokens' assignments to e
    if taken is not None:
        before = before + taken.to(before.device)
    return before.gather(1, chosen) < limit


def kept_counts(counts: torch.Tensor, limit: int | None) -> torch.Tensor:
    """(ranks, experts): how many of `counts[r, e]` assignments (rank r's to expert e) fit,
    when every rank's come after the earlier ranks' (global token order)."""
    if limit is None:
        return counts.clone()
    before = counts.cumsum(0) - counts
    return torch.minimum(counts, (limit - before).clamp(min=0))


def balance_loss(fraction: torch.Tensor, mean_prob: torch.Tensor) -> torch.Tensor:
    """experts * sum_e fraction_e * mean_prob_e: the Switch Transformer's auxiliary loss."""
    return fraction.numel() * (fraction.to(mean_prob.dtype) * mean_prob).sum()


def load_balancing_loss(routing: Routing) -> torch.Tensor:
    """`balance_loss` of one batch: f_e from the routing's counts, P_e its mean probability."""
    fraction = routing.counts().to(routing.probs.dtype) / routing.chosen.numel()
    return balance_loss(fraction, routing.probs.mean(0))


def assignments(chosen: torch.Tensor, kept: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept assignments as (token, slot, expert), each (assignments,) int64, sorted by
    expert and then by token: the order in which experts take their rows (`chosen[token,
    slot] == expert`)."""
    token, slot = kept.nonzero(as_tuple=True)             # row-major: token order
    expert = chosen[token, slot]
    order = torch.sort(expert, stable=True).indices       # by expert, token order kept
    return token[order], slot[order], expert[order]
