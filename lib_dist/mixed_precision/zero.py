"""ZeRO stage 1: each rank keeps the optimizer state of its shard of the parameters only.

Plain data parallel gives every rank the whole optimizer state: for Adam, two fp32 numbers per
parameter (and, with mixed precision, an fp32 master copy too: 12 bytes per parameter, most of
training's memory). The ranks all hold the same state and all do the same update. ZeRO (Zero
Redundancy Optimizer) stage 1 removes the redundancy: flatten the parameters into one vector
and cut it into N equal shards; rank r keeps the optimizer state of shard r and updates that
shard only. One step is:

1. reduce-scatter the flattened gradients: rank r receives the average over the ranks of its
   shard of them (nobody needs the rest);
2. step the inner optimizer on the shard (state 1/N of the whole);
3. all-gather the updated shards, so every rank has every parameter again.

Reduce-scatter plus all-gather move what one all-reduce moves (a ring all-reduce *is* the two),
so stage 1 saves memory at no extra communication. Half-precision parameters get fp32 master
shards: the state then includes the master copy, and the parameters travel in half precision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..comm import Communicator
from ..train.memory import optimizer_state_bytes
from .master import clear_gradients


class ZeroOptimizer:
    """`optimizer_class(**hyperparameters)` over this rank's shard of `params`."""

    def __init__(self, params: Iterable[torch.Tensor], comm: Communicator,
                 optimizer_class: Callable[..., torch.optim.Optimizer], **hyperparameters: Any):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroOptimizer got no parameter that requires a gradient")
        self.comm = comm
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // comm.world_size)
        self.dtype = self.params[0].dtype
        master = torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype
        start = comm.rank * self.shard_size
        with torch.no_grad():
            mine = self._flat([p.detach() for p in self.params])[start:start + self.shard_size]
        self.shard = mine.to(master).clone().requires_grad_()
        self.optimizer = optimizer_class([self.shard], **hyperparameters)
        self._reduced = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's one group, of this rank's shard."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's state, of this rank's shard (what `measure_peak_memory` counts
        as held before a step)."""
        return self.optimizer.state

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The tensors flattened and concatenated, zero-padded to N shards."""
        return padded_flat(tensors, self.comm.world_size)

    def reduce_gradients(self) -> None:
        """Give the shard the average over the ranks of its part of the gradients (one
        reduce-scatter; a parameter without a gradient counts as zeros). A loss scaler must
        see the reduced gradients: call this before `scaler.unscale_` / `scaler.step`."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        mine = self.comm.reduce_scatter(self._flat(grads).to(self.dtype), op="avg")
        self.shard.grad = mine.to(self.shard.dtype)
        self._reduced = True

    @torch.no_grad()
    def step(self) -> None:
        """Reduce the gradients if not done yet, step the shard, all-gather the parameters."""
        if not self._reduced:
            self.reduce_gradients()
        self.optimizer.step()
        shards = self.comm.all_gather(self.shard.detach().to(self.dtype))
        for p, piece in zip(self.params, torch.cat(shards)[:self.numel].split(
                [p.numel() for p in self.params])):
            p.copy_(piece.view_as(p))
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients and the shard's."""
        clear_gradients(self.params, set_to_none)
        self.shard.grad = None
        self._reduced = False

    def state_bytes(self) -> int:
        """Bytes of this rank's optimizer state: its shard's moments and master copy."""
        return optimizer_state_bytes(self.optimizer) + (
            self.shard.nbytes if self.shard.dtype != self.dtype else 0)


def padded_flat(tensors: list[torch.Tensor], world_size: int) -> torch.Tensor:
    """The tensors flattened one after another, zero-padded to `world_size` equal chunks:
    (world_size * ceil(numel / world_size),). Stages 2 and 3 (`lib_dist.sharding`) cut theirs
    the same way."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    return torch.cat([flat, flat.new_zeros(-flat.numel() % world_size)])
