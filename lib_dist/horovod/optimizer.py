"""`hvd.DistributedOptimizer`: any torch optimizer, with its gradients averaged over the ranks
before each step, the communication overlapped with backward.

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loss.backward()        # each gradient's all-reduce starts as its bucket fills up
    optimizer.step()       # waits for them (synchronize), then the wrapped optimizer's step

The returned object is an instance of a subclass of the optimizer's own class, sharing its
parameter groups and state, so schedulers, `state_dict()` and `isinstance` work as before.

How: a hook on each parameter (`register_post_accumulate_grad_hook`) fires when backward has
finished its gradient; the gradients are fused into buckets of at most
`HOROVOD_FUSION_THRESHOLD` bytes (Horovod's Tensor Fusion; 0 sends each tensor alone), and a
bucket's all-reduce starts in the background as soon as its last gradient is in
(`lib_dist.data_parallel.Buckets`, on `lib_dist.horovod`'s queue of asynchronous operations).
With `backward_passes_per_step=k` the hooks let k backward passes accumulate locally before
the gradient is sent. `synchronize()` starts what is left, waits and writes the averaged
gradients; `step()` calls it unless inside `skip_synchronize()`, which is for code that must
see the averaged gradients before stepping (unscaling a mixed-precision loss, clipping):

    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with optimizer.skip_synchronize():
        optimizer.step()

A gradient that comes back sparse (`nn.Embedding(..., sparse=True)`) is summed as a sparse
tensor by `sparse_allreduce_async` (`sparse.SparseGradients`), or all-reduced dense with
`sparse_as_dense=True`. Which parameters have sparse gradients is learned from the first step
(a parameter does not say): in that step their places in the buckets carry nothing, and the
buckets are then remade without them. Every rank must compute such a gradient in that first
step (as in Horovod, where a rank that did not would stall the others).

With one rank nothing is sent and no hook is set.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch.utils.hooks import RemovableHandle

from ..comm import Handle, ReduceOp as CommOp
from ..data_parallel import Buckets
from . import basics, negotiate
from .basics import ReduceOp, State
from .compression import Compressor, NoneCompressor
from .ops import Average, Sum, reduce_op, timed
from .process_sets import NotInProcessSet, state_for
from .sparse import SparseGradients

# the DistributedOptimizer hook on each parameter, by id (tensors compare elementwise, so they
# cannot be keys of a WeakKeyDictionary); an entry goes when its parameter does
_hooks_on: dict[int, tuple[weakref.ref[torch.Tensor], RemovableHandle]] = {}


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = NoneCompressor,
                         backward_passes_per_step: int = 1, op: Any = Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None) -> torch.optim.Optimizer:
    """`optimizer`, its gradients all-reduced over the ranks (see the module docstring).

    named_parameters: (name, parameter) pairs naming every parameter of the optimizer
        (`model.named_parameters()`), for the timeline; without them they are numbered.
    compression: how gradients travel (`hvd.Compression.none` or `.fp16`).
    backward_passes_per_step: backward passes accumulated locally before each all-reduce.
    op: `hvd.Average` (the default) or `hvd.Sum`.
    gradient_predivide_factor: with Average, divide by this before the sum and by
        size / factor after it (keeps fp16 sums of many ranks in range).
    sparse_as_dense: all-reduce sparse gradients (sparse embeddings) as dense ones (each
        parameter then gets a sparse gradient back); without it they are summed as sparse
        tensors (`sparse.sparse_allreduce_async`), gradient_predivide_factor aside.
    """
    try:
        s, local = state_for(process_set, "DistributedOptimizer"), False
    except NotInProcessSet:  # as Horovod: a rank outside the set steps on its own gradients
        s, local = basics.state(), True
    op = reduce_op(op)
    if op not in (Average, Sum):
        raise NotImplementedError(f"lib_dist.horovod's DistributedOptimizer supports op=hvd."
                                  f"Average and hvd.Sum, not hvd.{op.name}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor only applies with op=hvd.Average")
    if num_groups or groups is not None:
        raise NotImplementedError("lib_dist.horovod does not support num_groups / groups "
                                  "(explicit allreduce groups); Tensor Fusion groups gradients "
                                  "by HOROVOD_FUSION_THRESHOLD bytes")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    named = _named(optimizer, named_parameters)
    cls = type(type(optimizer).__name__, (_DistributedOptimizer, type(optimizer)), {})
    wrapped = cast(_DistributedOptimizer, object.__new__(cls))
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups, state, defaults
    wrapped._parameter_names = {p: n for n, p in named}  # as Horovod's (programs read it)
    wrapped._hvd = _GradientSync(s, named, compression, backward_passes_per_step,
                                 op, gradient_predivide_factor, sparse_as_dense, local,
                                 process_set)
    return wrapped


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer adds to the wrapped optimizer's class."""

    _hvd: _GradientSync
    _parameter_names: dict[torch.Tensor, str]

    def synchronize(self) -> None:
        """Finish every gradient's all-reduce and write the results into `p.grad`."""
        self._hvd.synchronize()

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """`step()` inside this block does not synchronize (call `synchronize()` first)."""
        self._hvd.should_synchronize = False
        try:
            yield
        finally:
            self._hvd.should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        sync = self._hvd
        if sync.should_synchronize:
            if sync.synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are already "
                              "synchronized and are used as they are (step inside `with "
                              "optimizer.skip_synchronize():`)", stacklevel=2)
            else:
                sync.synchronize()
        sync.synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd.pending:
            raise AssertionError("optimizer.zero_grad() between loss.backward() and "
                                 "optimizer.step() (or synchronize()) would race with the "
                                 "gradients' all-reduce; zero the gradients after step()")
        super().zero_grad(set_to_none)


class _GradientSync:
    """The hooks, the buckets and the bookkeeping of one DistributedOptimizer."""

    def __init__(self, s: State, named: list[tuple[str, torch.Tensor]],
                 compression: type[Compressor], passes: int, op: ReduceOp,
                 predivide: float, sparse_as_dense: bool, local: bool = False,
                 process_set: Any = None):
        self.state, self.passes = s, passes
        self.name = s.auto_name("DistributedOptimizer", None)
        self.sparse = SparseGradients(process_set, self.name, op, sparse_as_dense,
                                      {id(p): n for n, p in named})
        self.should_synchronize = True
        self.synchronized = False
        self.pending = False  # a hook fired since the last synchronize
        params = [p for _, p in named if p.requires_grad]
        self.delay = {id(p): passes for p in params}
        self.buckets: Buckets | None = None
        if s.comm.world_size == 1 or local:
            return

        def buckets(leave_out: dict[int, Any]) -> Buckets:
            kept = [(n, p) for n, p in named if id(p) not in leave_out]
            return Buckets(
                [p for _, p in kept], s.comm, max(s.fusion_threshold, 1),
                "avg" if op == Average else "sum", names=[n for n, _ in kept],
                prescale=1.0 / predivide, postscale=predivide,
                compression=None if compression is NoneCompressor else compression(),
                start=self._start)

        self.make_buckets = buckets
        self.buckets = buckets({})
        for p in params:
            if p in self.buckets:
                _hook(p, self._on_grad)

    def _on_grad(self, p: torch.Tensor) -> None:
        key = id(p)
        if self.delay[key] == 0:
            raise AssertionError(f"a gradient was computed more than backward_passes_per_step"
                                 f"={self.passes} times before optimizer.step(); raise "
                                 f"backward_passes_per_step to accumulate more passes locally")
        self.sparse.arrived(p)
        self.pending, self.synchronized = True, False
        self.delay[key] -= 1
        if self.delay[key] == 0 and self.buckets is not None:
            if not self.sparse.start(p):
                self.buckets.mark_ready(p)
            elif p in self.buckets:  # first seen sparse: in this step its place in the bucket
                p.grad = None        # carries nothing, and the buckets are remade without it
                self.buckets.mark_ready(p)

    def synchronize(self) -> None:
        try:
            if self.buckets is not None:
                try:
                    self.buckets.finish()
                finally:
                    self.sparse.finish()
        finally:
            self.delay = dict.fromkeys(self.delay, self.passes)
            self.pending = False
        if self.sparse.learned and self.buckets is not None and not self.sparse.as_dense:
            # every rank learned the same: a rank that had not started the same sparse
            # all-reduces would have failed above
            self.buckets = self.make_buckets(self.sparse.known)
        self.sparse.learned = False
        self.synchronized = True

    def _start(self, sent: torch.Tensor, op: CommOp) -> Handle:
        """Start one bucket's all-reduce on the queue, named by its tensors."""
        s = self.state
        assert self.buckets is not None
        names = next((b.names for b in self.buckets.buckets if b.sent is sent), [])
        label = names[0] if len(names) == 1 else f"fused {len(names)} tensors: {', '.join(names)}"
        k = next(i for i, b in enumerate(self.buckets.buckets) if b.sent is sent)
        run = timed(s, "ALLREDUCE", label[:200], sent.nbytes,
                    lambda _: s.comm.all_reduce(sent, op))
        # on the wire a sum (an average divides after it): a rank that has joined adds zeros
        sig = negotiate.signature(sent, op=int(Sum), prescale=1.0, postscale=1.0,
                                  average=op == "avg")
        return s.queue.start("ALLREDUCE", f"{self.name}.bucket.{k}", sig, run)


def _hook(p: torch.Tensor, on_grad: Callable[[torch.Tensor], None]) -> None:
    """Hook `on_grad` to `p`, removing the hook an earlier DistributedOptimizer put there."""
    key = id(p)
    old = _hooks_on.pop(key, None)
    if old is not None and old[0]() is p:
        old[1].remove()
    _hooks_on[key] = (weakref.ref(p, lambda _: _hooks_on.pop(key, None)),
                      p.register_post_accumulate_grad_hook(on_grad))


def _named(optimizer: torch.optim.Optimizer,
           named_parameters: Iterable[tuple[str, torch.Tensor]] | None
           ) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's parameters with names, in the order `named_parameters` gives them
    (model order, which the buckets follow), else in the optimizer's order."""
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"allreduce.noname.{i}", p) for i, p in enumerate(in_optimizer)]
    named = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.Tensor)
               for x in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, as "
                         "model.named_parameters() gives")
    names = [n for n, _ in named]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"named_parameters must name each parameter once; repeated: "
                         f"{', '.join(map(str, repeated))}")
    given = {id(p) for _, p in named}
    missing = [p for p in in_optimizer if id(p) not in given]
    if missing:
        shapes = ", ".join(str(tuple(p.shape)) for p in missing[:5])
        raise ValueError(f"named_parameters leaves out {len(missing)} of the optimizer's "
                         f"parameters (shapes {shapes}); pass model.named_parameters() of the "
                         f"model the optimizer trains")
    wanted = {id(p) for p in in_optimizer}
    return [(n, p) for n, p in named if id(p) in wanted]
