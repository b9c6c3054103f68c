"""A mixture-of-experts layer in one process: the building block, and the oracle that expert
parallelism is held to.

`MoE(n_embd, n_experts, k, capacity_factor)` replaces a transformer block's MLP: a `Router`
sends each token to k of `n_experts` experts (by default module 2's `FeedForward`, each with
its own weights), and the token's output is the sum over its kept assignments of gate *
expert(token). An expert is a dense MLP run on only the rows routed to it, so the layer holds
n_experts times the MLP's parameters while each token costs about k MLPs of compute.

`forward(x)`, x of shape (B, T, C), returns (output of x's shape, the load-balancing loss); add
the loss, scaled by a small coefficient (0.01 in the Switch Transformer), to the model's.
Routing, capacity and the drop order are `lib_dist.experts.routing`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..models.gpt import FeedForward, GPTConfig
from .routing import Router, assignments, capacity, keep_in_order, load_balancing_loss


def feed_forward(n_embd: int) -> Callable[[], nn.Module]:
    """A factory of module 2's `FeedForward` (n_embd -> 4 n_embd -> n_embd, GELU)."""
    config = GPTConfig(vocab_size=1, n_head=1, n_embd=n_embd)
    return lambda: FeedForward(config)


class MoE(nn.Module):
    """`MoE(n_embd, n_experts, k=1, capacity_factor=None, expert=None)(x)`: (output, aux loss).

    `expert`: a factory of the experts, each mapping (rows, n_embd) to (rows, n_embd); by
    default `feed_forward(n_embd)`. `capacity_factor` None: no expert ever drops a token.
    """

    def __init__(self, n_embd: int, n_experts: int, k: int = 1,
                 capacity_factor: float | None = None,
                 expert: Callable[[], nn.Module] | None = None):
        super().__init__()
        capacity(1, k, n_experts, capacity_factor)  # refuse a bad factor now, not in forward
        self.n_embd, self.n_experts, self.k = n_embd, n_experts, k
        self.capacity_factor = capacity_factor
        self.router = Router(n_embd, n_experts, k)
        make = expert or feed_forward(n_embd)
        self.experts = nn.ModuleList(make() for _ in range(n_experts))

    def capacity(self, tokens: int) -> int | None:
        """The most assignments one expert takes from a batch of `tokens` tokens."""
        return capacity(tokens, self.k, self.n_experts, self.capacity_factor)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])                     # (tokens, C), token order
        routing = self.router(flat)
        kept = keep_in_order(routing.chosen, self.n_experts, self.capacity(flat.shape[0]))
        token, slot, expert = assignments(routing.chosen, kept)
        rows = torch.bincount(expert, minlength=self.n_experts).tolist()
        outputs = [e(part) for e, part in zip(self.experts, flat[token].split(rows))]
        out = combine_rows(torch.cat(outputs), token, routing.gates[token, slot], flat)
        return out.reshape(x.shape), load_balancing_loss(routing)


def combine_rows(rows: torch.Tensor, token: torch.Tensor, gate: torch.Tensor,
                 like: torch.Tensor) -> torch.Tensor:
    """Each token's sum of gate * expert output over its kept assignments: row i of `rows`
    (an expert's output) weighted by `gate[i]` added into row `token[i]`; zero for a token
    whose every assignment was dropped. Shaped like `like`, (tokens, C)."""
    return torch.zeros_like(like).index_add(0, token, rows * gate.unsqueeze(1))
