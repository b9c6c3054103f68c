"""An all-reduce chosen by name: one of lib_dist's algorithms, or a student's registered one.

`Communicator.all_reduce(tensor, op, algorithm=...)` runs here when it is given a name (or when
`lib_dist.registry.prefer_all_reduce` chose a default): "ring", "halving_doubling",
"recursive_doubling", "gather_broadcast" (`lib_dist.comm.algorithms.ALGORITHMS`), or a name
registered in `lib_dist.registry` ("mine": lab03's `ring_all_reduce`, once
`lib_dist.registry.use_my_answers` has loaded it). The messages are the communicator's, traced,
then one "all_reduce" event, as for the default. An unknown name is an error listing the known.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from .. import registry
from .algorithms import ALGORITHMS

preferred_all_reduce = registry.preferred_all_reduce  # what a plain all_reduce runs, if set

if TYPE_CHECKING:
    from .base import Communicator


def all_reduce_by_name(comm: Communicator, name: str, tensor: torch.Tensor, op: str,
                       own: Iterable[str] = tuple(ALGORITHMS)) -> torch.Tensor:
    """Reduce `tensor` over `comm`'s ranks, in place, with the algorithm `name`; returns it.
    lib_dist's algorithms sum the flattened tensor (`op` "avg" then divides); a registered one
    is called as `fn(comm, tensor, op)` and does `op` itself. `own`: the names the
    communicator itself knows, for the error."""
    algorithm = ALGORITHMS.get(name)
    fn = registry.all_reduce_algorithm(name)
    if (algorithm is None or algorithm.run is None) and fn is None:
        raise registry.unknown_algorithm(name, own)
    with comm._traced("all_reduce", nbytes=tensor.nbytes):
        if algorithm is not None and algorithm.run is not None:
            algorithm.run(comm, tensor.reshape(-1))  # a view: the tensor is contiguous
        elif fn is not None:
            fn(comm, tensor, op)
    if op == "avg" and fn is None:
        tensor /= comm.world_size
    return tensor
