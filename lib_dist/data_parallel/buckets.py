"""Gradient buckets: all-reduce a few large buffers instead of many small tensors, and start
each one while backward is still computing the rest.

Every message pays a fixed latency (alpha in the alpha-beta model), so one all-reduce per
parameter is slow for a model of many small tensors. Buckets group parameters into flat
buffers of at most `bucket_bytes` of gradients (DDP's buckets, Horovod's Tensor Fusion). And
since backward produces gradients from the last layer to the first, parameters are grouped in
reverse registration order: the first bucket fills up first, and its all-reduce runs on a
background thread (`Communicator.all_reduce_async`) while backward computes the gradients of
the earlier layers.

    buckets = Buckets(model.parameters(), comm, bucket_bytes=1 << 20)
    # in each parameter's post-accumulate-grad hook:   buckets.mark_ready(p)
    # once backward has finished:                      buckets.finish()

`mark_ready(p)` says p's gradient is complete; when a bucket's last gradient is ready, the
bucket is flattened and its all-reduce started. `finish()` starts the buckets still waiting
for gradients (parameters this rank did not use), waits for every bucket and copies the
reduced values back into each `p.grad`.

Three rules keep the ranks in step:
- buckets start in index order on every rank (a ready bucket waits for the ones before it),
  since every rank must call the same collectives in the same order;
- a parameter without a gradient on this rank (unused in its forward) contributes zeros;
- each bucket carries, after its gradients, one flag per parameter: 1 where this rank has a
  gradient. After the all-reduce a flag of 0 means no rank had one, and that parameter's
  gradient stays None, as in a single process that never used it.

Options for Horovod's API: `op` "sum" or "avg"; `prescale` and `postscale` multiply the
gradients before and after the all-reduce; `compression` (anything with `compress(tensor) ->
(tensor, context)` and `decompress(tensor, context) -> tensor`, such as a cast to fp16)
transforms the whole flat buffer, flags included, around the all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..comm import Communicator, Handle, ReduceOp
from .timeline import Timeline


class Compressor(Protocol):
    """Transforms a flat buffer before the all-reduce and back after it."""

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    def decompress(self, tensor: torch.Tensor, context: Any) -> torch.Tensor: ...


@dataclass(eq=False)
class Bucket:
    """Some parameters and one flat buffer: their gradients one after another, then one
    used-flag per parameter."""

    index: int
    params: list[torch.Tensor]
    names: list[str]
    flat: torch.Tensor
    waiting_for: int = 0  # gradients not ready yet in this step
    handle: Handle | None = None
    sent: torch.Tensor | None = None  # what the all-reduce runs on (compressed, or `flat`)
    context: Any = None

    @property
    def grad_numel(self) -> int:
        return self.flat.numel() - len(self.params)

    @property
    def grads(self) -> torch.Tensor:
        return self.flat[:self.grad_numel]

    @property
    def flags(self) -> torch.Tensor:
        return self.flat[self.grad_numel:]

    def slices(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Each parameter with its piece of `flat`, shaped like it."""
        start = 0
        for p in self.params:
            yield p, self.flat[start:start + p.numel()].view_as(p)
            start += p.numel()

    @torch.no_grad()
    def gather_grads(self) -> None:
        """Copy this rank's gradients into `flat` (zeros where there is none), with flags."""
        for i, (p, piece) in enumerate(self.slices()):
            if p.grad is None:
                piece.zero_()
            else:
                piece.copy_(p.grad)
            self.flags[i] = float(p.grad is not None)

    @torch.no_grad()
    def scatter_grads(self) -> None:
        """Copy the reduced values back into each `p.grad`; leave None where no rank had one."""
        used = self.flags.tolist()
        for (p, piece), flag in zip(self.slices(), used):
            if flag == 0:
                continue
            if p.grad is None:
                p.grad = piece.clone()
            else:
                p.grad.copy_(piece)


def plan_buckets(params: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices into `params`, grouped into buckets from the last parameter to the first.

    A bucket closes when the next parameter would take it past `bucket_bytes` of gradients,
    or has another dtype or device (a flat buffer has one of each); a parameter larger than
    `bucket_bytes` gets a bucket of its own.
    """
    check_bucket_bytes(bucket_bytes)
    plan: list[list[int]] = []
    size = 0
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if plan and (size + nbytes <= bucket_bytes and _same_buffer(params[plan[-1][0]], p)):
            plan[-1].append(i)
            size += nbytes
        else:
            plan.append([i])
            size = nbytes
    return plan


class Buckets:
    """The gradient buckets of some parameters; see the module docstring.

    params: the parameters, in registration order (the order `model.parameters()` gives);
        those that do not require a gradient are left out, as are repeats of one tensor.
    comm: this rank's communicator. op: "avg" (the default) or "sum".
    names: one per parameter of `params`, for the timeline (default "param 0", ...).
    timeline: where to note grad_ready, bucket_start and bucket_done marks, if anywhere.
    start: how a bucket's all-reduce is started, `start(buffer, op) -> Handle`; by default
        `comm.all_reduce_async`. `lib_dist.horovod` passes its own, which runs the buckets in
        order with its other asynchronous operations.
    """

    def __init__(self, params: Iterable[torch.Tensor], comm: Communicator, bucket_bytes: int,
                 op: ReduceOp = "avg", *, names: Sequence[str] | None = None,
                 prescale: float = 1.0, postscale: float = 1.0,
                 compression: Compressor | None = None, timeline: Timeline | None = None,
                 start: Callable[[torch.Tensor, ReduceOp], Handle] | None = None):
        if op not in ("sum", "avg"):
            raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
        given = list(params)
        names = list(names) if names is not None else [f"param {i}" for i in range(len(given))]
        if len(names) != len(given):
            raise ValueError(f"{len(names)} names for {len(given)} parameters")
        trainable, trainable_names = _trainable_once(given, names)
        self.comm, self.op, self.timeline = comm, op, timeline
        self.prescale, self.postscale, self.compression = prescale, postscale, compression
        self._start = start or comm.all_reduce_async
        self.buckets = [_make_bucket(k, [trainable[i] for i in group],
                                     [trainable_names[i] for i in group])
                        for k, group in enumerate(plan_buckets(trainable, bucket_bytes))]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._name_of = dict(zip(map(id, trainable), trainable_names))
        self._ready: set[int] = set()  # ids of the parameters marked ready this step
        self._next = 0  # the next bucket to start
        self._reset()

    def layout(self) -> list[list[str]]:
        """The parameters' names, bucket by bucket, in the order the buckets start."""
        return [list(b.names) for b in self.buckets]

    def __contains__(self, p: object) -> bool:
        return id(p) in self._bucket_of

    def name_of(self, p: torch.Tensor) -> str:
        return self._name_of[id(p)]

    @property
    def in_progress(self) -> bool:
        """True between the first `mark_ready` of a step and its `finish()`."""
        return bool(self._ready) or self._next > 0

    def mark_ready(self, p: torch.Tensor) -> None:
        """p's gradient is complete for this step: start every bucket that is now full."""
        bucket = self._bucket_of.get(id(p))
        if bucket is None:
            raise ValueError("mark_ready got a parameter that is not in these buckets (one "
                             "that did not require a gradient when the buckets were made?)")
        if id(p) in self._ready:
            raise RuntimeError(f"the gradient of {self.name_of(p)} was marked ready twice "
                               f"in one step; call finish() between steps")
        self._ready.add(id(p))
        self._note("grad_ready", param=self.name_of(p))
        bucket.waiting_for -= 1
        while self._next < len(self.buckets) and self.buckets[self._next].waiting_for == 0:
            self._start_next()

    def finish(self) -> None:
        """Start the buckets not started yet, wait for all, and write every `p.grad`."""
        try:
            while self._next < len(self.buckets):
                self._start_next()
            for bucket in self.buckets:
                self._wait(bucket)
        finally:
            self._reset()

    def _start_next(self) -> None:
        bucket = self.buckets[self._next]
        self._next += 1
        bucket.gather_grads()
        if self.prescale != 1.0:
            bucket.grads.mul_(self.prescale)
        bucket.sent, bucket.context = (self.compression.compress(bucket.flat)
                                       if self.compression else (bucket.flat, None))
        self._note("bucket_start", bucket=bucket.index, nbytes=bucket.sent.nbytes)
        bucket.handle = self._start(bucket.sent, self.op)

    def _wait(self, bucket: Bucket) -> None:
        assert bucket.handle is not None and bucket.sent is not None  # started by finish()
        bucket.handle.wait()
        if self.compression is not None:
            bucket.flat.copy_(self.compression.decompress(bucket.sent, bucket.context))
        if self.postscale != 1.0:
            bucket.grads.mul_(self.postscale)
        bucket.scatter_grads()
        self._note("bucket_done", bucket=bucket.index, ran=_when_it_ran(bucket.handle))

    def _reset(self) -> None:
        """Forget this step; first wait for anything still running on the buffers."""
        for bucket in self.buckets:
            if bucket.handle is not None and not bucket.handle.is_completed():
                try:
                    bucket.handle.wait()
                except Exception:  # noqa: BLE001 - finish() is already raising the first
                    pass
            bucket.handle, bucket.sent, bucket.context = None, None, None
            bucket.waiting_for = len(bucket.params)
        self._ready.clear()
        self._next = 0

    def _note(self, what: str, bucket: int = -1, param: str = "", nbytes: int = 0,
              ran: tuple[float, float] | None = None) -> None:
        if self.timeline is not None:
            self.timeline.note(what, bucket, param, nbytes, ran)


def check_bucket_bytes(bucket_bytes: object) -> None:
    if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool):
        raise TypeError(f"bucket_bytes must be an integer number of bytes, got {bucket_bytes!r}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")


def _trainable_once(params: list[torch.Tensor], names: list[str]
                    ) -> tuple[list[torch.Tensor], list[str]]:
    """The parameters that require a gradient, each tensor once (tied weights are one)."""
    seen: set[int] = set()
    kept, kept_names = [], []
    for p, name in zip(params, names):
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            kept.append(p)
            kept_names.append(name)
    return kept, kept_names


def _make_bucket(index: int, params: list[torch.Tensor], names: list[str]) -> Bucket:
    numel = sum(p.numel() for p in params) + len(params)  # gradients, then one flag each
    flat = torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)
    return Bucket(index, params, names, flat, waiting_for=len(params))


def _same_buffer(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device


def _when_it_ran(handle: Handle) -> tuple[float, float] | None:
    """(start, end) of the operation, where the handle knows (lib_dist's background ones do)."""
    started, finished = getattr(handle, "started", None), getattr(handle, "finished", None)
    return (started, finished) if started is not None and finished is not None else None
