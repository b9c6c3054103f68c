"""`DataParallel`: wrap a model so that `loss.backward()` leaves every rank holding the gradient
averaged over all ranks, with the communication overlapped with backward.

    model = DataParallel(GPT(config), comm)          # broadcasts rank 0's parameters
    loss = loss_fn(model(x), y)                      # x, y: this rank's shard of the batch
    loss.backward()                                  # gradients averaged over the ranks here
    optimizer.step()                                 # any optimizer, unchanged

How: a hook on each parameter (`register_post_accumulate_grad_hook`) fires as soon as backward
has finished its gradient and tells the `Buckets`, which start a bucket's all-reduce in the
background once all of its gradients are in. The first hook of a backward also queues a
callback that autograd runs when backward is over (as DDP does): it starts the remaining
buckets, waits for all of them and writes the averages into `p.grad`. So the optimizer, the
module-02 training loop, gradient clipping, all see ordinary, already averaged gradients.

- `no_sync()`: a backward run inside it sends nothing; gradients add up locally, and the
  next backward outside it sends their sum (gradient accumulation over micro-batches).
  Unlike DDP, which decides when forward runs, the context around `backward()` decides.
- Frozen parameters (`requires_grad=False` when wrapping) are never sent; a parameter used
  twice (tied weights) has one gradient and is sent once; a parameter unused in forward, on
  some ranks or all, is handled by the buckets' used-flags: the result is what one process
  would compute on the whole batch, including `grad is None` where no rank used it.
- `timeline`: what each step did and when (`lib_dist.data_parallel.timeline`), e.g.
  `model.timeline.last.started_during_backward()`, the buckets overlapped with backward.

Limits, each simpler than DDP's way round it: buckets start in order, so a parameter unused
on this rank holds its bucket, and the ones after it, until backward ends (DDP's
`find_unused_parameters` walks the autograd graph after forward to mark them ready early).
Buffers are broadcast once, when wrapping (DDP's `broadcast_buffers` repeats it every forward).
Every rank's backward must reach at least one parameter, or that rank never joins the
all-reduces the others start. Parameters unfrozen after wrapping are not synchronized: wrap
again.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..comm import Communicator
from .broadcast import broadcast_parameters, check_replicas_match
from .buckets import Buckets, check_bucket_bytes
from .timeline import Timeline

# DDP's default. Large enough that the per-message latency (tens of microseconds on gloo) is
# paid on megabytes, not on kilobytes; small enough that a model of a few hundred megabytes
# of gradients gets a dozen buckets to overlap with backward. The course's tiny GPT fits in
# one bucket (nothing to overlap, and one message is then the fastest): pass a smaller
# `bucket_bytes` to watch the overlap.
DEFAULT_BUCKET_BYTES = 25 * 2**20

_hooks_on: weakref.WeakKeyDictionary[nn.Module, list[RemovableHandle]] = (
    weakref.WeakKeyDictionary())


class DataParallel(nn.Module):
    """`module` replicated on every rank of `comm`, its gradients averaged in backward.

    bucket_bytes: gradient bytes per bucket (see `DEFAULT_BUCKET_BYTES`).
    broadcast_from: the rank whose parameters and buffers every rank starts from; None
        keeps each rank's own (only right if they are already equal).
    keep_steps: how many finished steps `timeline` keeps.
    """

    def __init__(self, module: nn.Module, comm: Communicator, *,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, broadcast_from: int | None = 0,
                 keep_steps: int = 16):
        super().__init__()
        check_bucket_bytes(bucket_bytes)
        check_replicas_match(comm, module)
        if broadcast_from is not None:
            broadcast_parameters(comm, module, broadcast_from)
        self.module = module
        self.comm = comm
        self.timeline = Timeline(keep_steps)
        named = list(module.named_parameters())  # tied weights once, by their first name
        params = [p for _, p in named]
        self.buckets = Buckets(params, comm, bucket_bytes, "avg", names=[n for n, _ in named],
                               timeline=self.timeline)
        self._sync_enabled = True  # False inside no_sync()
        self._syncing_this_backward = True
        self._end_of_backward_queued = False
        self._hook_every_trainable_parameter(params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: no backward will follow, nothing to note
            return self.module(*args, **kwargs)
        if self.buckets.in_progress:
            raise RuntimeError("an earlier backward failed while its gradients were being "
                               "averaged: this rank may be out of step with the others")
        self._end_of_backward_queued = False  # in case an earlier backward failed early
        self.timeline.note("forward_start")
        out = self.module(*args, **kwargs)
        self.timeline.note("forward_end")
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._note_backward_start)
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward runs inside this block only accumulate gradients locally."""
        before, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = before

    # -- what autograd calls -------------------------------------------------------------

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self._end_of_backward_queued:  # the first gradient of this backward
            self._end_of_backward_queued = True
            self._syncing_this_backward = self._sync_enabled
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if self._syncing_this_backward:
            self.buckets.mark_ready(p)
        else:
            self.timeline.note("grad_ready", param=self.buckets.name_of(p))

    def _end_of_backward(self) -> None:
        self._end_of_backward_queued = False
        self.timeline.note("backward_end")
        if self._syncing_this_backward:
            self.buckets.finish()
            self.timeline.note("synced")
            self.timeline.end_step()

    def _note_backward_start(self, grad: torch.Tensor) -> None:
        self.timeline.note("backward_start")

    def _hook_every_trainable_parameter(self, params: list[nn.Parameter]) -> None:
        for old in _hooks_on.pop(self.module, []):  # the module was wrapped before: unhook
            old.remove()
        _hooks_on[self.module] = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                                  for p in params if p in self.buckets]

    def extra_repr(self) -> str:
        sizes = [len(names) for names in self.buckets.layout()]
        return (f"rank={self.comm.rank}, world_size={self.comm.world_size}, "
                f"buckets of {sizes} parameters")
