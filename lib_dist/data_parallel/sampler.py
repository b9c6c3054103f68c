"""Which examples each rank trains on: a sampler that shards a dataset across the ranks.

Data parallelism replicates the model and splits the data. `ShardSampler` gives rank r the
indices r, r + N, r + 2N, ... of a (shuffled) ordering of the dataset, so the N shards are
disjoint and together cover it. Every rank shuffles with the same seed, so they agree on the
ordering without a message; `set_epoch(e)` reshuffles for epoch e, the same way on every rank.

When the dataset size is not a multiple of N, the ranks would get shards of different
lengths, and a rank that runs out of batches first stops calling the all-reduce the others
wait in. Two ways out:

- padding (the default): repeat indices from the start of the ordering until every shard is
  equally long, so a few examples are seen twice per epoch;
- `drop_last=True`: leave out the tail of the ordering, so a few examples are not seen this
  epoch (with shuffling, different ones each epoch).

The indices are the same, one for one, as `torch.utils.data.DistributedSampler`'s with the
same seed, epoch and settings: a program can swap one for the other.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler[int]):
    """This rank's shard of the indices 0 .. dataset_size - 1; see the module docstring.

        sampler = ShardSampler(len(dataset), comm.world_size, comm.rank, seed=42)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for i in sampler: ...          # or DataLoader(dataset, sampler=sampler)
    """

    def __init__(self, dataset_size: int, num_replicas: int, rank: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        _check_count("dataset_size", dataset_size, minimum=0)
        _check_count("num_replicas", num_replicas, minimum=1)
        _check_count("rank", rank, minimum=0)
        if rank >= num_replicas:
            raise ValueError(f"rank {rank} is out of range: with num_replicas={num_replicas}, "
                             f"ranks are 0..{num_replicas - 1}")
        _check_count("seed", seed, minimum=None)
        self.dataset_size, self.num_replicas, self.rank = dataset_size, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    @property
    def shard_size(self) -> int:
        """Indices per rank: the dataset size over the ranks, rounded up when padding,
        down when dropping the tail."""
        if self.drop_last:
            return self.dataset_size // self.num_replicas
        return -(-self.dataset_size // self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for this epoch. Call it on every rank with the same epoch, before iterating."""
        _check_count("epoch", epoch, minimum=0)
        self.epoch = epoch

    def ordering(self) -> list[int]:
        """Every index once, in this epoch's order: the same list on every rank."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.ordering()
        total = self.shard_size * self.num_replicas
        padded_or_cut = [order[i % len(order)] for i in range(total)]  # repeats from the start
        return iter(padded_or_cut[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return self.shard_size

    def __repr__(self) -> str:
        return (f"ShardSampler(dataset_size={self.dataset_size}, num_replicas="
                f"{self.num_replicas}, rank={self.rank}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})")


def _check_count(name: str, value: object, minimum: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
