"""Start every replica from the same parameters: broadcast them once, from one rank.

Each rank builds its own copy of the model. Unless every rank seeded its random generator
the same way, the copies start different, and averaging their gradients would then update N
different models. Broadcasting rank 0's parameters (and buffers, such as running statistics)
once at the start fixes that; after it, identical averaged gradients keep the replicas
identical without any further broadcast.

Before broadcasting, `check_replicas_match` compares what each rank built (how many
parameters, their shapes, dtypes and which ones train), since a mismatch would otherwise pair
the wrong tensors in every later collective, or hang.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import torch
from torch import nn

from ..comm import Communicator


def broadcast_parameters(comm: Communicator, module: nn.Module, root: int = 0) -> None:
    """Overwrite `module`'s parameters and buffers on every rank with `root`'s, in place."""
    tensors = list(module.parameters()) + list(module.buffers())
    broadcast_tensors(comm, tensors, root)


@torch.no_grad()
def broadcast_tensors(comm: Communicator, tensors: Iterable[torch.Tensor], root: int = 0) -> None:
    """Overwrite each tensor on every rank with `root`'s, in place, one broadcast per tensor
    in the given order (every rank must give the same tensors in the same order)."""
    for t in tensors:
        sent = t.detach()
        if sent.is_contiguous():
            comm.broadcast(sent, root)
        else:
            sent.copy_(comm.broadcast(sent.contiguous(), root))


def check_replicas_match(comm: Communicator, module: nn.Module) -> None:
    """Raise ValueError, on every rank, unless every rank's `module` has the same parameters
    and buffers: count, shapes, dtypes and `requires_grad`, in registration order."""
    mine = _fingerprint(module).to(comm.device)
    everyone = comm.all_gather(mine)
    if all(torch.equal(theirs, mine) for theirs in everyone):
        return
    lines = [f"  rank {r}: {_describe(f)}" for r, f in enumerate(everyone)]
    raise ValueError("data parallel needs the same model on every rank, but the ranks built "
                     "different ones:\n" + "\n".join(lines))


def _fingerprint(module: nn.Module) -> torch.Tensor:
    """(parameters, their elements, buffers, their elements, a checksum of every shape,
    dtype and requires_grad): compared across ranks by `check_replicas_match`."""
    params, buffers = list(module.parameters()), list(module.buffers())
    layout = [(tuple(t.shape), str(t.dtype), t.requires_grad) for t in params + buffers]
    checksum = zlib.crc32(repr(layout).encode())
    return torch.tensor([len(params), sum(p.numel() for p in params),
                         len(buffers), sum(b.numel() for b in buffers), checksum],
                        dtype=torch.int64)


def _describe(fingerprint: torch.Tensor) -> str:
    params, elements, buffers, buffer_elements, checksum = fingerprint.tolist()
    return (f"{params} parameters ({elements} elements), {buffers} buffers "
            f"({buffer_elements} elements), layout checksum {checksum:08x}")
