"""Horovod's operations that give each rank a different part: `alltoall` (rank r's rows
`splits[d]` go to rank d) and `reducescatter` (the sum or average over the ranks, each rank
keeping its block of rows), in their asynchronous forms too; their differentiable
out-of-place forms are in `autograd`.

Both negotiate like every operation (`queue`): the ranks must agree on the dtype and on the
dimensions after the first (and, for reducescatter, on the whole shape and the reduce op),
and alltoall's splits travel with the request, so each rank knows what it receives before
any data moves. Reducescatter splits the first dimension as evenly as it can, the first
ranks taking one row more, as Horovod does.
"""

from __future__ import annotations

from typing import Any

import torch

from ..comm import Communicator
from . import basics, negotiate
from .basics import ReduceOp
from .ops import Average, Sum, _check_tensor, on_the_wire, reduce_op, scale_, start
from .process_sets import state_for


# -- alltoall ----------------------------------------------------------------------------

def _splits(tensor: torch.Tensor, splits: Any, size: int) -> list[int]:
    """The rows this rank sends each rank; ValueErrors as Horovod's for splits it refuses."""
    rows = tensor.shape[0] if tensor.dim() else 0
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension, got a scalar")
    if splits is None:
        if rows % size:
            raise ValueError(f"alltoall without splits divides the first dimension equally: "
                             f"{rows} rows cannot be split among {size} ranks")
        return [rows // size] * size
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError(f"alltoall: splits must be a tensor of int32, got {splits.dtype}")
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != size or any(s < 0 for s in splits):
        raise ValueError(f"alltoall: splits must give {size} non-negative row counts, one "
                         f"per rank; got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"alltoall: the splits {splits} add up to {sum(splits)} rows; the "
                         f"tensor has {rows}")
    return splits


def _alltoall(tensor: torch.Tensor, splits: Any, name: str | None, process_set: Any,
              blocking: bool) -> Any:
    s = state_for(process_set, "alltoall")
    _check_tensor(tensor, "alltoall")
    sends = _splits(tensor, splits, s.comm.world_size)
    name = s.auto_name("alltoall", name)
    rows = tensor.detach().contiguous()
    sig = negotiate.signature(rows)
    sig["shape"] = ("*", *sig["shape"][1:])

    def run(infos: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        received = [info[s.comm.rank] for info in infos]
        return exchange(s.comm, rows, sends, received), torch.tensor(received,
                                                                     dtype=torch.int32)

    return start(s, "ALLTOALL", name, sig, rows.nbytes, run, lambda out: out, blocking,
                 info=sends)


def exchange(comm: Communicator, rows: torch.Tensor, sends: list[int],
             received: list[int]) -> torch.Tensor:
    """Rows `sends[d]` of `rows` to rank d, `received[s]` rows from rank s, concatenated."""
    if comm.world_size == 1:
        return rows.clone()
    rest = rows.shape[1:]
    with on_the_wire(rows) as sent:
        inputs = list(sent.split(sends))
        outputs = [torch.empty((n, *rest), dtype=sent.dtype, device=sent.device)
                   for n in received]
        comm.all_to_all(inputs, outputs)
    return torch.cat(outputs).to(rows.dtype)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = None) -> int:
    """Start `alltoall`; `synchronize(handle)` returns (output, received splits)."""
    handle: int = _alltoall(tensor, splits, name, process_set, False)
    return handle


# -- reducescatter -------------------------------------------------------------------------

def block(rows: int, size: int, rank: int) -> tuple[int, int]:
    """The rows [lo, hi) rank `rank` keeps of `rows` split among `size` ranks."""
    base, extra = divmod(rows, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def _reducescatter(tensor: torch.Tensor, name: str | None, op: Any, process_set: Any,
                   prescale: float, postscale: float, blocking: bool) -> Any:
    s = state_for(process_set, "reducescatter")
    _check_tensor(tensor, "reducescatter")
    op = reduce_op(op)
    if op not in (Average, Sum):
        raise negotiate.HorovodInternalError(f"reducescatter supports hvd.Average and "
                                             f"hvd.Sum, not hvd.{op.name}")
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor of at least one dimension, got a scalar")
    name = s.auto_name("reducescatter", name)
    work = tensor.detach().clone(memory_format=torch.contiguous_format)
    sig = negotiate.signature(work, op=int(op), prescale=float(prescale),
                              postscale=float(postscale))

    def run(_: list[Any]) -> torch.Tensor:
        return reduce_block(s.comm, work, op, prescale, postscale)

    return start(s, "REDUCESCATTER", name, sig, work.nbytes, run, lambda out: out, blocking)


def reduce_block(comm: Communicator, t: torch.Tensor, op: ReduceOp, prescale: float,
                 postscale: float) -> torch.Tensor:
    """This rank's block of rows of the reduction of `t` over the ranks (`t` is scratch)."""
    if prescale != 1.0:
        scale_(t, prescale)
    lo, hi = block(t.shape[0], comm.world_size, comm.rank)
    if comm.world_size > 1:
        bounds = [block(t.shape[0], comm.world_size, r) for r in range(comm.world_size)]
        with on_the_wire(t) as sent:
            got = comm.all_to_all([sent[a:b] for a, b in bounds],
                                  [torch.empty_like(sent[lo:hi]) for _ in bounds])
            mine = torch.stack(got).sum(0).to(t.dtype)
    else:
        mine = t[lo:hi].clone()
    if op == Average:
        if mine.is_floating_point() or mine.is_complex():
            postscale = postscale / comm.world_size
        else:
            mine = torch.div(mine, comm.world_size, rounding_mode="trunc")
    if postscale != 1.0:
        scale_(mine, postscale)
    return mine


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: Any = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start `reducescatter`; `synchronize(handle)` returns this rank's block."""
    handle: int = _reducescatter(tensor, name, op, process_set, prescale_factor,
                                 postscale_factor, False)
    return handle
