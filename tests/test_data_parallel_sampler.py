"""ShardSampler: index for index the same as torch's DistributedSampler (its oracle), shards
that are disjoint and cover the dataset, epoch shuffling, and clear errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lib_dist.data_parallel import ShardSampler

SIZES = [0, 1, 3, 7, 8, 10, 13, 16]  # empty, smaller than the world, (not) divisible
WORLDS = [1, 2, 3, 4, 5]


def shards(n: int, world: int, **options) -> list[list[int]]:
    return [list(ShardSampler(n, world, r, **options)) for r in range(world)]


@pytest.mark.parametrize("shuffle, drop_last", list(itertools.product([True, False], repeat=2)))
def test_same_indices_as_torchs_distributed_sampler(shuffle, drop_last):
    for n, world, seed, epoch in itertools.product(SIZES, WORLDS, [0, 7], [0, 1, 5]):
        for rank in range(world):
            ours = ShardSampler(n, world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            theirs = DistributedSampler(range(n), world, rank, shuffle=shuffle, seed=seed,
                                        drop_last=drop_last)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            case = f"n={n} world={world} rank={rank} seed={seed} epoch={epoch}"
            assert list(ours) == list(theirs), case
            assert len(ours) == len(theirs), case


@pytest.mark.parametrize("n, world", [(8, 4), (12, 3), (16, 1)])
def test_divisible_sizes_split_into_disjoint_equal_shards_that_cover_the_dataset(n, world):
    for drop_last in (False, True):
        parts = shards(n, world, drop_last=drop_last)
        assert [len(p) for p in parts] == [n // world] * world
        assert sorted(itertools.chain(*parts)) == list(range(n))


@pytest.mark.parametrize("n, world", [(10, 4), (7, 3), (3, 5), (1, 4)])
def test_padding_repeats_indices_from_the_start_so_every_shard_is_equally_long(n, world):
    parts = shards(n, world, shuffle=False)
    size = -(-n // world)
    assert [len(p) for p in parts] == [size] * world
    everything = list(itertools.chain(*parts))
    # every index once, plus the first ones of the ordering again, cycling if need be
    assert sorted(everything) == sorted(list(range(n)) + [i % n for i in range(size * world - n)])


@pytest.mark.parametrize("n, world", [(10, 4), (7, 3), (3, 5)])
def test_drop_last_leaves_out_the_tail_and_keeps_shards_disjoint(n, world):
    for shuffle in (False, True):
        parts = shards(n, world, shuffle=shuffle, drop_last=True)
        everything = list(itertools.chain(*parts))
        assert [len(p) for p in parts] == [n // world] * world
        assert len(set(everything)) == len(everything) == (n // world) * world
        assert set(everything) <= set(range(n))
    unshuffled = list(itertools.chain(*shards(n, world, shuffle=False, drop_last=True)))
    assert sorted(unshuffled) == list(range((n // world) * world))  # the tail is what goes


def test_epochs_reshuffle_identically_on_every_rank_and_every_instance():
    first, again = ShardSampler(100, 4, 2, seed=3), ShardSampler(100, 4, 2, seed=3)
    orders = []
    for epoch in range(3):
        first.set_epoch(epoch)
        again.set_epoch(epoch)
        assert list(first) == list(again)
        orders.append(list(first))
    assert orders[0] != orders[1] != orders[2]
    assert list(ShardSampler(100, 4, 2, seed=4)) != orders[0]  # the seed matters too
    for epoch in range(3):
        every_rank = [ShardSampler(100, 4, r, seed=3) for r in range(4)]
        for s in every_rank:
            s.set_epoch(epoch)
        assert sorted(itertools.chain(*every_rank)) == list(range(100))


def test_unshuffled_shards_are_strided():
    assert shards(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


def test_works_as_a_dataloader_sampler():
    data = torch.arange(10) * 10
    loader = DataLoader(data, batch_size=2, sampler=ShardSampler(10, 2, 1, shuffle=False))
    assert [b.tolist() for b in loader] == [[10, 30], [50, 70], [90]]


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((10, 4, 4), {}, ValueError, "rank 4 is out of range"),
    ((10, 4, -1), {}, ValueError, "rank must be >= 0"),
    ((10, 0, 0), {}, ValueError, "num_replicas must be >= 1"),
    ((-1, 2, 0), {}, ValueError, "dataset_size must be >= 0"),
    ((10.0, 2, 0), {}, TypeError, "dataset_size must be an integer"),
    ((10, True, 0), {}, TypeError, "num_replicas must be an integer"),
    ((10, 2, 0), {"seed": 1.5}, TypeError, "seed must be an integer"),
])
def test_bad_arguments_are_named(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        ShardSampler(*args, **kwargs)


def test_bad_epoch_is_named():
    sampler = ShardSampler(10, 2, 0)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        sampler.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be an integer"):
        sampler.set_epoch("1")
