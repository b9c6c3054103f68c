"""ZeRO stage 2: each rank keeps its shard of the optimizer state *and* of the gradients.

Stage 1 (module 7's `ZeroOptimizer`) shards the optimizer state but lets backward build every
full gradient before reduce-scattering them all at the end: for a moment each rank holds all
P gradients. Stage 2 reduce-scatters them while backward runs. Parameters are grouped into
buckets in reverse registration order (backward produces the last layer's gradients first);
when every gradient of a bucket is ready, the bucket is flattened, zero-padded to a multiple
of N and reduce-scattered: rank r receives the average of chunk r, keeps it as the gradient of
its shard of the bucket, and the full gradients are freed at once. A rank then holds at most
one bucket of full gradients, plus its shards' gradients (P / N).

Where the parameters and the optimizer share a dtype (float32, say), each bucket's parameters
move into one flat buffer, and the optimizer steps this rank's chunk of it in place: what it
steps is a view of the parameters, not a copy (a copy would cost P / N more). With fp16 or bf16
parameters it steps a float32 copy of the chunk: mixed precision's master weights.

One step is the same traffic as stage 1: a reduce-scatter of every gradient (in buckets) and
an all-gather of the updated shards, bucket by bucket: 2 x (N - 1) / N x P numbers sent per
rank, what one all-reduce sends.

Rules that keep the ranks in step: buckets are reduced in index order on every rank (a ready
bucket waits for the ones before it); a parameter this rank did not use contributes zeros, in
`step`, which reduces whatever backward did not. One backward per step: a second backward
before `step` would find its buckets already reduced, and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..comm import Communicator
from ..data_parallel import plan_buckets
from ..mixed_precision.zero import padded_flat
from ..train.memory import optimizer_state_bytes


class Bucket:
    """Parameters whose gradients are reduce-scattered together, and this rank's chunk."""

    def __init__(self, params: list[torch.Tensor], world_size: int, rank: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.world_size = world_size
        self.chunk = -(-self.numel // world_size)  # every rank's share, padding included
        self.start = rank * self.chunk
        self.ready: set[int] = set()  # ids of the parameters whose gradient is complete
        self.reduced = False
        self.flat_params: torch.Tensor | None = None  # (N * chunk,), once `hold_parameters`

    def flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The tensors flattened, one after another, zero-padded to N chunks: (N * chunk,)."""
        return padded_flat(tensors, self.world_size)

    def my_chunk(self) -> torch.Tensor:
        """This rank's chunk of the parameters, as they are now: (chunk,)."""
        with torch.no_grad():
            return self.flat([p.detach() for p in self.params])[self.start:self.start + self.chunk]

    def hold_parameters(self) -> torch.Tensor:
        """Move the parameters into one flat buffer, each a view of its piece, and return this
        rank's chunk of the buffer: a view too, so stepping it in place steps the parameters."""
        with torch.no_grad():
            self.flat_params = self.flat([p.detach() for p in self.params])
        offset = 0
        for p in self.params:  # p keeps its identity (and the module's reference to it)
            p.data = self.flat_params[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return self.flat_params[self.start:self.start + self.chunk]


class Zero2Optimizer:
    """`optimizer_class(**hyperparameters)` over this rank's shard of `params`, whose
    gradients are reduce-scattered in buckets of about `bucket_bytes` during backward."""

    def __init__(self, params: Iterable[torch.Tensor], comm: Communicator,
                 optimizer_class: Callable[..., torch.optim.Optimizer],
                 bucket_bytes: int = 1 << 20, **hyperparameters: Any):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("Zero2Optimizer got no parameter that requires a gradient")
        self.comm = comm
        self.dtype = self.params[0].dtype
        master = torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype
        # data parallel's buckets: from the last parameter, the first whose gradient is ready
        self.buckets = [Bucket([self.params[i] for i in group], comm.world_size, comm.rank)
                        for group in plan_buckets(self.params, bucket_bytes)]
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.shards: list[torch.Tensor]  # what the optimizer steps: one chunk per bucket
        if master == self.dtype:  # step the parameters' own chunk, in place
            self.shards = [torch.nn.Parameter(b.hold_parameters()) for b in self.buckets]
        else:  # a float32 copy of the chunk: the master weights
            self.shards = [b.my_chunk().to(master).clone().requires_grad_() for b in self.buckets]
        self.optimizer = optimizer_class(self.shards, **hyperparameters)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in self.params]
        self._next = 0  # the first bucket not reduced yet

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's state, of this rank's shards."""
        return self.optimizer.state

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        bucket = self.bucket_of[id(param)]
        if bucket.reduced:
            raise RuntimeError("Zero2Optimizer reduce-scatters gradients during backward: "
                               "a second backward before step() would add to gradients that "
                               "are gone. Call step() (and zero_grad()) after each backward")
        bucket.ready.add(id(param))
        while self._next < len(self.buckets):  # in index order, as on every other rank
            first = self.buckets[self._next]
            if len(first.ready) < len(first.params):
                break
            self._reduce(self._next)

    def _reduce(self, index: int) -> None:
        """Reduce-scatter bucket `index`'s gradients (zeros where a parameter has none); keep
        this rank's chunk as its shard's gradient and free the full gradients."""
        bucket, shard = self.buckets[index], self.shards[index]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        mine = self.comm.reduce_scatter(bucket.flat(grads).to(self.dtype), op="avg")
        shard.grad = mine.to(shard.dtype)
        for p in bucket.params:
            p.grad = None
        bucket.reduced = True
        self._next = index + 1

    @torch.no_grad()
    def step(self) -> None:
        """Reduce what backward did not, step the shards, all-gather the parameters."""
        for index in range(self._next, len(self.buckets)):
            self._reduce(index)
        self.optimizer.step()
        for bucket, shard in zip(self.buckets, self.shards):
            chunks = self.comm.all_gather(shard.detach().to(self.dtype))
            if bucket.flat_params is not None:  # ours was stepped in place: the others' chunks
                rows = bucket.flat_params.view(len(chunks), bucket.chunk)
                for rank, chunk in enumerate(chunks):
                    if rank != self.comm.rank:
                        rows[rank].copy_(chunk)
            else:  # the master copy's chunks, into each parameter
                pieces = torch.cat(chunks)[:bucket.numel].split([p.numel() for p in bucket.params])
                for p, piece in zip(bucket.params, pieces):
                    p.copy_(piece.view_as(p))
        self._start_over()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the shards' gradients (the parameters' were freed by the reduce-scatter)."""
        for p in self.params:
            p.grad = None
        for shard in self.shards:
            shard.grad = None
        self._start_over()

    def _start_over(self) -> None:
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.reduced = False
        self._next = 0

    def state_bytes(self) -> int:
        """Bytes of this rank's optimizer state: its shards' moments and master copies."""
        masters = sum(s.nbytes for s in self.shards) if self.shards[0].dtype != self.dtype else 0
        return optimizer_state_bytes(self.optimizer) + masters

    def gradient_bytes(self) -> int:
        """Bytes of gradients this rank holds now: its shards' and any full ones not freed."""
        return (sum(s.grad.nbytes for s in self.shards if s.grad is not None)
                + sum(p.grad.nbytes for p in self.params if p.grad is not None))

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()


__all__ = ["Bucket", "Zero2Optimizer"]
