"""Horovod's sparse all-reduce: the sum or average of sparse COO tensors (the gradients of
`nn.Embedding(..., sparse=True)`) over the ranks, without making them dense.

    handle = hvd.sparse_allreduce_async(grad, name="emb", op=hvd.Average)
    averaged = handle()        # as in Horovod, the handle is called to wait for the result

A sum of sparse tensors is the concatenation of their entries with the entries at one index
added up. So each rank coalesces its tensor (each index once) and two allgathers move the
entries: the indices (one row per entry) and the values, named `<name>.indices` and
`<name>.values`. Every rank builds the same result from the concatenation and coalesces it (an
index several ranks hold is summed); an average then divides by the number of ranks, as
`allreduce` does (integers truncated). What travels is each rank's non-zero entries rather
than the whole dense tensor: cheaper when a step touches few rows of a large table, dearer
when it touches most (an allgather's bytes grow with the ranks, a ring all-reduce's do not).

`DistributedOptimizer` sends a parameter's gradient this way when it comes back sparse (and
`sparse_as_dense=False`); `SparseGradients` is its bookkeeping. Ranks must agree on the
tensor's size, its sparse dimensions and its dtype; a mismatch is a `HorovodInternalError`.
"""

from __future__ import annotations

from typing import Any

import torch

from .basics import ReduceOp
from .gather import _allgather
from .ops import Average, Sum, poll, reduce_op, scale_, synchronize
from .process_sets import state_for


class SparseHandle:
    """What `sparse_allreduce_async` returns: call it to wait for the result (Horovod's is a
    function too); calling it again returns the same tensor."""

    def __init__(self, like: torch.Tensor, handles: tuple[int, int], divide_by: int):
        self._like, self._handles, self._divide_by = like, handles, divide_by
        self._result: torch.Tensor | None = None

    def poll(self) -> bool:
        """Whether calling the handle would not wait."""
        return self._result is not None or all(poll(h) for h in self._handles)

    def __call__(self) -> torch.Tensor:
        if self._result is None:
            got, errors = [], []
            for h in self._handles:  # wait for both, even when one fails
                try:
                    got.append(synchronize(h))
                except Exception as e:  # noqa: BLE001 - raised below, the first one
                    errors.append(e)
            if errors:
                raise errors[0]
            indices, values = got
            like = self._like
            out = torch.sparse_coo_tensor(indices.t(), values, like.shape, dtype=like.dtype,
                                          device=like.device, check_invariants=False).coalesce()
            if self._divide_by > 1:
                v = out.values()
                if v.is_floating_point() or v.is_complex():
                    scale_(v, 1.0 / self._divide_by)
                else:
                    v.copy_(torch.div(v, self._divide_by, rounding_mode="trunc"))
            self._result = out
        return self._result


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                           process_set: Any = None) -> SparseHandle:
    """Start summing (`hvd.Sum`) or averaging (`hvd.Average`) the sparse COO `tensor` over the
    ranks; calling the returned handle waits and gives the result, a coalesced sparse tensor.
    Two allgathers run, named `<name>.indices` and `<name>.values` (see the module docstring)."""
    s = state_for(process_set, "sparse_allreduce")
    op = reduce_op(op)
    if op not in (Average, Sum):
        raise NotImplementedError(f"sparse_allreduce_async supports op=hvd.Average and hvd.Sum, "
                                  f"not hvd.{op.name}")
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        what = tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"sparse_allreduce_async needs a sparse COO tensor (x.to_sparse()), got "
                        f"{what}; a dense tensor goes through hvd.allreduce")
    t = tensor.detach().coalesce()
    base = s.auto_name("sparse_allreduce", name)
    agree = dict(size=tuple(t.shape), sparse_dims=t.sparse_dim())
    handles = (_allgather(t.indices().t(), f"{base}.indices", process_set, False,
                          "SPARSE_ALLREDUCE", **agree),
               _allgather(t.values(), f"{base}.values", process_set, False, "SPARSE_ALLREDUCE",
                          **agree))
    return SparseHandle(t, handles, s.comm.world_size if op == Average else 1)


class SparseGradients:
    """DistributedOptimizer's parameters whose gradients come back sparse. Which those are is
    learned from the gradients (a parameter does not say): a parameter seen sparse goes through
    `sparse_allreduce_async` from then on, or, with `as_dense`, is all-reduced dense in the
    buckets and given back a sparse gradient, as Horovod does."""

    def __init__(self, process_set: Any, name: str, op: ReduceOp, as_dense: bool,
                 names: dict[int, str]):
        self.process_set, self.name, self.op = process_set, name, op
        self.as_dense, self.names = as_dense, names
        self.known: dict[int, tuple[torch.Tensor, int]] = {}  # by id: (parameter, sparse dims)
        self.learned = False  # a parameter was first seen sparse in this step
        self._started: dict[int, tuple[torch.Tensor, SparseHandle, bool]] = {}

    def arrived(self, p: torch.Tensor) -> None:
        """In the gradient hook: note a sparse gradient; densify it for `as_dense`."""
        if p.grad is None or not p.grad.is_sparse:
            return
        if id(p) not in self.known:
            self.known[id(p)] = (p, p.grad.sparse_dim())
            self.learned = True
        if self.as_dense:
            p.grad = p.grad.to_dense()

    def start(self, p: torch.Tensor) -> bool:
        """Start p's sparse all-reduce if p's gradient goes that way; whether it does."""
        if self.as_dense or id(p) not in self.known:
            return False
        _, dims = self.known[id(p)]
        grad, dense = p.grad, p.grad is not None and not p.grad.is_sparse
        if grad is None:  # not used on this rank in this step: it sends no entries
            grad = torch.sparse_coo_tensor(
                torch.empty((dims, 0), dtype=torch.int64, device=p.device),
                torch.empty((0, *p.shape[dims:]), dtype=p.dtype, device=p.device), p.shape,
                check_invariants=False)
        elif dense:
            grad = grad.to_sparse(dims)
        handle = sparse_allreduce_async(grad, f"{self.name}.sparse.{self.names[id(p)]}",
                                        self.op, self.process_set)
        self._started[id(p)] = (p, handle, dense)
        return True

    def finish(self) -> None:
        """After the buckets: start what has not started, wait, write the sparse gradients."""
        for key, (p, _) in self.known.items():
            if key not in self._started:
                self.start(p)
        errors = []
        for p, handle, dense in self._started.values():
            try:
                result = handle()
            except Exception as e:  # noqa: BLE001 - raised below, the first one
                errors.append(e)
                continue
            p.grad = result.to_dense() if dense else result
        self._started.clear()
        if self.as_dense:
            for p, dims in self.known.values():
                if p.grad is not None and not p.grad.is_sparse:
                    p.grad = p.grad.to_sparse(dims)
        if errors:
            raise errors[0]

