"""Mini-batches of one rank's shard, epoch after epoch: what each rank feeds the training loop.

    sampler = ShardSampler(len(x), comm.world_size, comm.rank, seed=0)
    batches = ShardedBatches(x, y, batch_size=32, sampler=sampler)
    train(DataParallel(model, comm), optimizer, batches, cross_entropy, steps=100)

Epoch e calls `sampler.set_epoch(e)` and takes the shard's indices in order, `batch_size` at a
time. The incomplete last batch of an epoch is dropped, as `lib_dist.data.ExampleBatches` does,
so every batch of every rank has the same size (a rank with one batch fewer would leave the
others waiting in an all-reduce).

Step k of rank r trains on positions r, r + N, r + 2N, ... of the k-th block of N * B indices of
the epoch's ordering, so the N ranks' k-th batches together are exactly the k-th batch of one
process with `ShardSampler(n, 1, 0)` and batch N * B (while the block lies inside the
dataset): what makes "N ranks of batch B" comparable with "one process of batch N * B".
"""

from __future__ import annotations

import torch

from ..data.batching import ExampleBatches
from .sampler import ShardSampler


class ShardedBatches(ExampleBatches):
    """Batches (x[idx], y[idx]) of `batch_size` indices of `sampler`'s shard, forever:
    `ExampleBatches`, each epoch's order being the sampler's shard for that epoch."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                 sampler: ShardSampler):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if sampler.dataset_size != len(x):
            raise ValueError(f"the sampler shards {sampler.dataset_size} examples, but x has "
                             f"{len(x)} rows")
        if not isinstance(batch_size, int) or not 0 < batch_size <= len(sampler):
            raise ValueError(f"batch_size must be an integer in 1..{len(sampler)} (this rank's "
                             f"shard), got {batch_size!r}")
        self.sampler = sampler
        super().__init__(x, y, batch_size, seed=sampler.seed)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        self.sampler.set_epoch(self.epoch)
        return torch.tensor(list(self.sampler), dtype=torch.int64)
