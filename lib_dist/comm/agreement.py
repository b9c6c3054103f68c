"""What the ranks of an `all_to_all` agree on before any data moves.

An all-to-all's pieces may differ in size (a mixture of experts sends each expert as many
tokens as were routed to it), so every rank preallocates what it expects from each peer. When
a rank expects other than what its peer sends, torch.distributed does not say so: gloo aborts
the receiving process when more arrives than its buffer holds, and leaves the rest of a larger
buffer as it was, a silent wrong result. So first every rank describes what it sends to and
expects from each peer (dtype and shapes), the ranks gather every description, and each rank
checks every pair the same way: a disagreement, or a rank whose own arguments were invalid, is
an error on every rank, naming the ranks and shapes, before any data has moved; the group stays
usable.

A description is a fixed-length int64 tensor, so that ranks can gather it even when they
disagree: [valid, dtype code, then (ndim, dims) for each input and each output], dims padded
to `MAX_DIMS`; a tensor of more dimensions has its last ones folded into their product (they
are then compared by that product only). The gather costs one small collective per
`all_to_all`; the trace records it as one "all_to_all_check" event, not as messages.
"""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING, Any

import torch

from .errors import CommError, MismatchError

if TYPE_CHECKING:
    from .base import Communicator

MAX_DIMS = 8
_RECORD = 1 + MAX_DIMS  # ndim, then the dims
_SHOWN = 4  # disagreements spelled out in a message; the rest are counted


def _code(dtype: torch.dtype) -> int:
    """The same number on every rank (unlike `hash` of a string, which varies by process)."""
    return zlib.crc32(str(dtype).encode())


_DTYPES = {_code(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def dtype_code(dtype: torch.dtype) -> int:
    """`dtype` as a number every rank computes alike (to gather with other numbers)."""
    return _code(dtype)


def dtype_of(code: int) -> torch.dtype:
    return _DTYPES[code]


def as_agreed(inputs: Any, outputs: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`agree`'s result without the check, for sizes every rank read from one table (a mixture
    of experts' counts, all-gathered): the inputs contiguous, the outputs as given."""
    inputs = [t.contiguous() for t in inputs]
    return inputs, [torch.empty_like(t) for t in inputs] if outputs is None else outputs


def agree(comm: Communicator, inputs: Any, outputs: Any
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Check `all_to_all(inputs, outputs)` on this rank and against every other rank's call;
    return the inputs (contiguous) and outputs (allocated like the inputs when None) to
    exchange. Collective: every rank of `comm` calls it. Raises `CommError` on every rank."""
    n = comm.world_size
    problem = _problem(comm, inputs, outputs)
    if problem is None:
        inputs = [t.contiguous() for t in inputs]
        if outputs is None:
            outputs = [torch.empty_like(t) for t in inputs]
    mine = torch.zeros(2 + 2 * n * _RECORD, dtype=torch.int64)
    if problem is None:
        mine[0], mine[1] = 1, _code(inputs[0].dtype)
        for i, t in enumerate([*inputs, *outputs]):
            mine[2 + i * _RECORD: 2 + (i + 1) * _RECORD] = torch.tensor(_record(t.shape))
    with comm._traced("all_to_all_check", nbytes=mine.nbytes):
        every = [t.tolist() for t in comm._gather_quietly(mine.to(comm.device),
                                                          "all_to_all_check")]
    if problem is not None:
        raise CommError(f"rank {comm.rank}: {problem}")
    found = _disagreement(every, n)
    if found:
        error, text = found
        raise error(f"rank {comm.rank}: all_to_all: {text}")
    return inputs, outputs


def _problem(comm: Communicator, inputs: Any, outputs: Any) -> str | None:
    """What is wrong with this rank's own arguments, or None."""
    n = comm.world_size
    lists = [inputs] if outputs is None else [inputs, outputs]
    if not all(isinstance(x, (list, tuple)) and len(x) == n for x in lists):
        got = " and ".join(str(len(x)) if isinstance(x, (list, tuple)) else type(x).__name__
                           for x in lists)
        return f"all_to_all needs one input (and one output) per rank, {n}; got {got}"
    tensors = [t for x in lists for t in x]
    strays = {type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)}
    if strays:
        return f"all_to_all needs torch.Tensors, got {', '.join(sorted(strays))}"
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        return f"all_to_all moves one dtype, got {', '.join(sorted(map(str, dtypes)))}"
    if outputs is not None and not all(t.is_contiguous() for t in outputs):
        return "all_to_all needs contiguous outputs; call .contiguous() first"
    return None


def _record(shape: torch.Size) -> list[int]:
    dims = list(shape)
    if len(dims) > MAX_DIMS:
        dims = dims[:MAX_DIMS - 1] + [math.prod(dims[MAX_DIMS - 1:])]
    return [len(shape), *dims, *[0] * (MAX_DIMS - len(dims))]


def _shape(record: list[int]) -> str:
    ndim, dims = record[0], record[1:]
    if ndim > MAX_DIMS:
        return (f"({', '.join(map(str, dims[:MAX_DIMS - 1]))}, then {ndim - MAX_DIMS + 1} "
                f"dims of product {dims[MAX_DIMS - 1]})")
    return str(tuple(dims[:ndim]))


def _disagreement(every: list[list[int]], n: int) -> tuple[type[CommError], str] | None:
    """What the ranks' descriptions disagree on, and the error to raise, the same on every
    rank; None if they agree."""
    invalid = [r for r, d in enumerate(every) if not d[0]]
    if invalid:
        many = len(invalid) > 1
        return CommError, (f"rank{'s' * many} {', '.join(map(str, invalid))} passed invalid "
                           f"arguments (see {'their' if many else 'its'} error); no data moved")
    dtypes = [_DTYPES.get(d[1], f"dtype #{d[1]}") for d in every]
    if len(set(dtypes)) > 1:
        return MismatchError, "ranks disagree on the dtype (no data moved): " + ", ".join(
            f"rank {r} {str(t).removeprefix('torch.')}" for r, t in enumerate(dtypes))

    def piece(rank: int, i: int) -> list[int]:
        return every[rank][2 + i * _RECORD: 2 + (i + 1) * _RECORD]

    bad = [f"rank {s} sends rank {r} shape {_shape(piece(s, r))}, but rank {r} expects "
           f"shape {_shape(piece(r, n + s))} from rank {s}"
           for s in range(n) for r in range(n) if piece(s, r) != piece(r, n + s)]
    if not bad:
        return None
    more = f"; and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    return MismatchError, ("ranks disagree on the shapes they exchange (no data moved): "
            + "; ".join(bad[:_SHOWN]) + more)
