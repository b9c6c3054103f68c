"""The student edition's stand-ins (`lib_dist.stand_ins`): its collectives give lib_dist's own
(lab03's answers) results on simulated ranks, by another route (Bruck's rounds), sending as many
bytes as a direct all-gather and a ring's reduce-scatter; its losses are torch's."""

from __future__ import annotations

import math

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.comm import stand_ins
from lib_dist.comm.point_to_point import chunk_bounds
from lib_dist.stand_ins import KEPT, STAND_INS


def collectives(comm, use):
    g = torch.Generator().manual_seed(comm.rank)  # ranks are threads: one generator each
    x = torch.randn(5, 3, dtype=torch.float64, generator=g)
    reduced = use.all_reduce(comm, x.clone(), "avg") if use else comm.all_reduce(x.clone(), "avg")
    root = comm.world_size - 1
    b = torch.randint(0, 9, (4,), generator=g)
    sent = use.broadcast(comm, b, root) if use else comm.broadcast(b, root)
    gathered = use.all_gather(comm, x) if use else comm.all_gather(x)
    v = torch.arange(7.0, dtype=torch.float64) * (comm.rank + 1)
    scattered = use.reduce_scatter(comm, v, "sum") if use else comm.reduce_scatter(v, "sum")
    return reduced, sent, gathered, scattered


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_each_stand_in_gives_what_lib_dists_own_collective_gives(n):
    world = SimulatedWorld(n)
    theirs = world.run(collectives, stand_ins)
    kinds = {e.kind for e in world.trace.events}
    ours = SimulatedWorld(n).run(collectives, None)
    for mine, own in zip(theirs, ours):
        reduced, sent, gathered, scattered = mine
        # n numbers near 3 in size summed in another order, then divided: a few ulps of n * 3
        assert torch.allclose(reduced, own[0], rtol=0, atol=n * 3 * n * torch.finfo(torch.float64).eps)
        assert torch.equal(sent, own[1]) and torch.equal(scattered, own[3])
        assert all(torch.equal(a, b) for a, b in zip(gathered, own[2]))
    assert {"all_reduce", "broadcast", "all_gather", "reduce_scatter"} <= kinds or n == 1


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_the_stand_ins_send_what_a_direct_all_gather_and_a_ring_reduce_scatter_send(n):
    numel = 4 * n + 1  # chunks of 5 and 4 elements: uneven, as chunk_bounds cuts them
    sizes = [hi - lo for lo, hi in chunk_bounds(numel, n)]
    rounds = [d for d in (1, 2, 4) if d < n]

    def gathered(r):  # the blocks r, r+1, ... it holds, min(d, n - d) of them each round
        return sum(sizes[(r + i) % n] for d in rounds for i in range(min(d, n - d)))

    for name, fn, expected in (
            ("all_gather", lambda c: stand_ins.all_gather(c, torch.ones(3)),
             lambda r: (n - 1) * 3 * 4),  # every other rank's 3 float32
            ("reduce_scatter", lambda c: stand_ins.reduce_scatter(c, torch.ones(numel)),
             lambda r: (numel - sizes[r]) * 4),  # every block but its own, once
            ("all_reduce", lambda c: stand_ins.all_reduce(c, torch.ones(numel)),
             lambda r: (numel - sizes[r]) * 4 + gathered(r) * 4)):
        world = SimulatedWorld(n)
        world.run(fn)
        sent = {r: t.sent_bytes for r, t in world.trace.summary().items()}
        assert sent == {r: expected(r) for r in range(n)}, name
        messages = max(t.sent_messages for t in world.trace.summary().values())
        assert messages <= (2 if name == "all_reduce" else 1) * math.ceil(math.log2(n)), name


def test_every_stand_in_is_a_function_and_stands_in_for_a_reference_of_lab01_or_lab03():
    import importlib

    from lib_dist.extend import LABS

    asked = set(LABS["lab01_cross_entropy"].references) | set(LABS["lab03_collectives"].references)
    assert set(STAND_INS) | set(KEPT) <= asked
    for target in STAND_INS.values():
        module, name = target.split(":")
        assert callable(getattr(importlib.import_module(module), name)), target


def test_the_loss_stand_ins_are_torchs_and_give_the_references_values():
    import lib_dist.losses as reference
    import lib_dist.stand_ins as losses

    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(9, 5, dtype=torch.float64, generator=g), torch.randint(5, (9,), generator=g)
    y[::3] = -100
    eps = torch.finfo(torch.float64).eps
    for reduction in ("mean", "sum"):  # 5 exps summed, a log: a few ulps of the loss, per row
        assert torch.allclose(losses.cross_entropy(z, y, reduction),
                              reference.cross_entropy(z, y, reduction), rtol=0, atol=9 * 16 * eps)
    assert torch.allclose(losses.log_softmax(z), reference.log_softmax(z), rtol=0, atol=16 * eps)
    t = torch.rand(9, dtype=torch.float64, generator=g)
    assert torch.allclose(losses.binary_cross_entropy_with_logits(z[:, 0], t),
                          reference.binary_cross_entropy_with_logits(z[:, 0], t), rtol=0,
                          atol=16 * eps)
