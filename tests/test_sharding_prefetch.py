"""FSDP's prefetch (`FSDP(..., prefetch=True)`) on simulated ranks: the same training as one
process; the same all-gathers, one per unit per pass; but each block's all-gather is posted before
the block that precedes it in the pass (backward meets them in reverse) has computed, in the
order the rank's main thread sees (not from times, which a busy machine shifts); and one more
unit held while a block computes."""

from __future__ import annotations

import copy

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.sharding import FSDP

from test_sharding_fsdp import CONFIG, batch, fsdp_training, gpt, loss, one_process


@pytest.mark.parametrize("n", [2, 3])
def test_prefetching_fsdp_trains_the_gpt_as_one_process_does(n):
    base = gpt()
    want = dict(one_process(base, n, 3).named_parameters(remove_duplicate=False))
    for got in SimulatedWorld(n).run(fsdp_training, base, 3, True):
        for name, p in want.items():
            # float64, as the test without prefetch: the same sums, the same order
            torch.testing.assert_close(got[name], p.detach(), rtol=0, atol=1e-12, msg=name)


def posts_and_block_ends(comm, base, prefetch: bool) -> list[str]:
    """One step, as this rank's main thread saw it: each asynchronous all-gather posted
    ("post"), each block's forward and backward finished ("forward", "backward")."""
    model = copy.deepcopy(base)
    seen: list[str] = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, a, o: seen.append("forward"))
        block.register_full_backward_hook(lambda m, gi, go: seen.append("backward"))
    post = comm.all_gather_async

    def posted(tensor):
        seen.append("post")
        return post(tensor)

    comm.all_gather_async = posted
    sharded = FSDP(model, comm, units=list(model.blocks), prefetch=prefetch)
    loss(sharded, batch(0, comm.rank)).backward()
    return seen


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_next_blocks_gather_is_posted_before_this_block_has_computed(prefetch):
    world = SimulatedWorld(2)
    seen = world.run(posts_and_block_ends, gpt(), prefetch)[0]
    blocks = CONFIG.n_layer
    gathers = [e for e in world.trace.of_rank(0) if e.kind == "all_gather"]
    # one per unit per pass, prefetched or not: the root, then each block, forward and back
    assert len(gathers) == 2 * (blocks + 1)
    if not prefetch:
        assert "post" not in seen
        return
    posted_before = [seen[:i].count("post") for i, e in enumerate(seen) if e == "forward"]
    # block 0's gather is posted as the root's forward starts, block k + 1's as block k starts
    assert posted_before == [k + 2 for k in range(blocks - 1)] + [blocks]
    backward = [seen[:i].count("post") - blocks for i, e in enumerate(seen) if e == "backward"]
    # backward: the last block's as the root's backward starts, block k - 1's as block k starts
    assert backward == [k + 2 for k in range(blocks - 1)] + [blocks]


def held_while_blocks_compute(comm, base, prefetch: bool) -> list[int]:
    """How many units are gathered, or on their way, as each block starts its forward."""
    model = copy.deepcopy(base)
    sharded = FSDP(model, comm, units=list(model.blocks), prefetch=prefetch)
    held: list[int] = []

    def count(module, args):  # registered after FSDP's: the block is gathered by now
        fetching = sharded.prefetcher is not None and sharded.prefetcher.unit is not None
        held.append(sum(u.gathered is not None for u in sharded.units) + fetching)

    for block in model.blocks:
        block.register_forward_pre_hook(count)
    loss(sharded, batch(0, comm.rank)).backward()
    return held


def test_prefetch_holds_one_more_unit_while_a_block_computes():
    base = gpt()
    blocks = CONFIG.n_layer
    # the root and this block; with prefetch the next block too, except under the last
    assert SimulatedWorld(2).run(held_while_blocks_compute, base, False)[0] == [2] * blocks
    assert SimulatedWorld(2).run(held_while_blocks_compute, base, True)[0] == [3] * (
        blocks - 1) + [2]
