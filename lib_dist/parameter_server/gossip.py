"""Decentralised averaging: gossip on a ring, and decentralised SGD (D-PSGD, Lian et al. 2017).

No server and no all-reduce: each rank averages its tensor with its two ring neighbours,
x_r <- (x_{r-1} + x_r + x_{r+1}) / 3. In matrix form x <- W x, with W symmetric and doubly
stochastic, so the mean never changes and every x_r tends to it. The distance to the mean
shrinks by |lambda_2(W)| per step, the second-largest eigenvalue modulus: its spectral gap
1 - |lambda_2| sets the speed, and on a ring of N ranks it closes like 1/N^2.

D-PSGD mixes the same way, with a gradient step: x_r <- sum_s W_rs x_s - lr * g_r(x_r).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..comm import Communicator, wait_all


def ring_neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """(left, right) on the ring 0 - 1 - ... - N-1 - 0."""
    return (rank - 1) % world_size, (rank + 1) % world_size


@torch.no_grad()
def gossip_step(comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
    """Average `tensor` with the two ring neighbours' (weights 1/3 each), in place; returns it.
    One message to each neighbour and one from each; on 2 ranks both neighbours are the other."""
    if comm.world_size == 1:
        return tensor
    left, right = ring_neighbours(comm.rank, comm.world_size)
    mine = tensor.clone()
    from_left, from_right = torch.empty_like(tensor), torch.empty_like(tensor)
    wait_all([comm.isend(mine, right), comm.isend(mine, left),
              comm.irecv(from_left, left), comm.irecv(from_right, right)])
    return tensor.copy_((from_left + mine + from_right) / 3)


def ring_mixing_matrix(world_size: int) -> torch.Tensor:
    """W of `gossip_step`: 1/3 on the diagonal and for each ring neighbour (float64)."""
    w = torch.zeros(world_size, world_size, dtype=torch.float64)
    for r in range(world_size):
        for s in (r - 1, r, r + 1):
            w[r, s % world_size] += 1 / 3
    return w if world_size > 1 else torch.ones(1, 1, dtype=torch.float64)


def second_eigenvalue(mixing: torch.Tensor) -> float:
    """|lambda_2|: the largest modulus among the eigenvalues other than the 1 of the mean."""
    moduli = torch.linalg.eigvalsh(mixing).abs().sort(descending=True).values
    return float(moduli[1]) if len(moduli) > 1 else 0.0


def ring_second_eigenvalue(world_size: int) -> float:
    """The same, in closed form: max over k != 0 of |1 + 2 cos(2 pi k / N)| / 3."""
    return max((abs(1 + 2 * math.cos(2 * math.pi * k / world_size)) / 3
                for k in range(1, world_size)), default=0.0)


def dpsgd_step(comm: Communicator, model: nn.Module, lr: float) -> None:
    """After `loss.backward()`: gossip the parameters with the ring neighbours, then take the
    gradient step computed on the parameters before mixing."""
    with torch.no_grad():
        for p in model.parameters():
            gossip_step(comm, p.data)
            if p.grad is not None:
                p.sub_(lr * p.grad)
