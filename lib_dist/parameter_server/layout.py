"""Who does what in a parameter-server job, and how the parameters are cut into shards.

Ranks 0 .. s-1 are the servers; every other rank is a worker. The model's parameters, flattened
in registration order into one vector of P numbers, are cut by `chunk_bounds(P, s)`: server j
holds the numbers [lo_j, hi_j) and nothing else, so each server's link carries 1/s of the
traffic. A worker pulls every shard, computes a gradient on its own batch, and pushes shard j
of that gradient to server j.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm import chunk_bounds


def server_ranks(servers: int) -> list[int]:
    """The ranks that serve: 0 .. servers - 1."""
    return list(range(servers))


def worker_ranks(servers: int, world_size: int) -> list[int]:
    """The ranks that compute gradients: every rank from `servers` on."""
    if not 1 <= servers < world_size:
        raise ValueError(f"a parameter server needs 1 <= servers < world_size, got "
                         f"{servers} servers among {world_size} ranks: leave a rank to work")
    return list(range(servers, world_size))


def shard_bounds(numel: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's shard of a flat vector of `numel` numbers."""
    return chunk_bounds(numel, servers)


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """A copy of the model's parameters as one vector, in registration order."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_gradients(model: nn.Module) -> torch.Tensor:
    """The model's gradients as one vector (zeros for a parameter without one)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


@torch.no_grad()
def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Write a flat vector back into the model's parameters, in place (nothing is written
    when its length is not the model's number of parameters)."""
    numel = sum(p.numel() for p in model.parameters())
    if flat.numel() != numel:
        raise ValueError(f"a flat vector of {flat.numel()} numbers does not fit a model of "
                         f"{numel} parameters")
    offset = 0
    for p in model.parameters():
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
