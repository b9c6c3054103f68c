"""Sub-communicators: splitting the ranks into groups (`split`, as MPI_Comm_split) and laying
them out as a grid with one group per dimension (`Mesh`, as torch's DeviceMesh).

3D parallelism runs three kinds of collectives at once: tensor-parallel all-reduces among the
t ranks that share a layer, pipeline sends between the p stages, data-parallel gradient
all-reduces among the d replicas. Each runs on its own communicator over just those ranks,
numbered 0.. within it, with its own trace.

`split(comm, color, key)` is collective: every rank passes its color; ranks of one color form
a group, numbered by (key, rank). Both backends (a simulated world, torch.distributed) build
groups with `comm.subgroup(ranks)`, which every rank calls for every group.
"""

from __future__ import annotations

import math

import torch

from .base import Communicator


def split(comm: Communicator, color: int, key: int | None = None) -> Communicator:
    """This rank's group among the ranks that passed the same `color` (every rank calls it),
    ranked by `key` (default: the rank in `comm`). The keys must keep the ranks' order:
    torch.distributed numbers a group's ranks in increasing order whatever it is given."""
    key = comm.rank if key is None else key
    mine = torch.tensor([color, key], dtype=torch.int64, device=comm.device)
    every = [t.tolist() for t in comm._gather_quietly(mine, "split")]
    groups: dict[int, list[tuple[int, int]]] = {}
    for rank, (c, k) in enumerate(every):
        groups.setdefault(c, []).append((k, rank))
    own: Communicator | None = None
    for c in sorted(groups):
        ranks = [rank for _, rank in sorted(groups[c])]
        if ranks != sorted(ranks):
            raise ValueError(f"rank {comm.rank}: split's keys would order the ranks of color "
                             f"{c} as {ranks}; keys must keep the ranks in increasing order")
        group = comm.subgroup(ranks)
        if c == color:
            own = group
    assert own is not None  # this rank's own color is among the groups
    return own


class Mesh:
    """`comm`'s ranks as a grid of `shape`, the last dimension varying fastest (neighbouring
    ranks differ in the last coordinate: tensor-parallel ranks adjacent, as Megatron places
    them); `mesh[name]` is this rank's communicator along dimension `name`."""

    def __init__(self, comm: Communicator, shape: tuple[int, ...], names: tuple[str, ...]):
        if len(shape) != len(names) or math.prod(shape) != comm.world_size:
            raise ValueError(f"a mesh of shape {tuple(shape)} ({' x '.join(names)}) has "
                             f"{math.prod(shape)} ranks; the communicator has "
                             f"{comm.world_size}: choose sizes whose product is "
                             f"{comm.world_size}")
        self.comm, self.shape, self.names = comm, tuple(shape), tuple(names)
        self.coords = coordinates(comm.rank, self.shape)
        self.groups = {}
        for d, name in enumerate(names):
            # the ranks that differ from this one only along d share its other coordinates
            others = tuple(c for i, c in enumerate(self.coords) if i != d)
            color = rank_of(others, tuple(s for i, s in enumerate(shape) if i != d))
            self.groups[name] = split(comm, color)

    def __getitem__(self, name: str) -> Communicator:
        if name not in self.groups:
            raise KeyError(f"the mesh's dimensions are {list(self.names)}, not {name!r}")
        return self.groups[name]

    def __repr__(self) -> str:
        where = ", ".join(f"{n}={c}" for n, c in zip(self.names, self.coords))
        return f"Mesh({' x '.join(map(str, self.shape))}, rank {self.comm.rank}: {where})"


def coordinates(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """`rank`'s place in a grid of `shape`, the last coordinate varying fastest."""
    coords = []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(reversed(coords))


def rank_of(coords: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """`coordinates`' inverse."""
    rank = 0
    for c, size in zip(coords, shape):
        rank = rank * size + c
    return rank


__all__ = ["Mesh", "coordinates", "rank_of", "split"]
