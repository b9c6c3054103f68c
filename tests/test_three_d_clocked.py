"""The capstone's measuring tools (lib_dist.three_d.clocked, lib_dist.three_d.plots) on
simulated worlds of 8 ranks: a stage's declared FLOPs add up, over the stages and tp ranks of
a replica, to the model's FLOPs per token (plus the head, which every tp rank computes whole);
a step on the virtual clock with free links at (8, 1, 1) lasts the planner's compute exactly;
every event `group_events` reports stayed inside its group, in world ranks, and a collective
on the world instead is seen leaving it."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

from lib_dist.comm import AlphaBeta, SimulatedWorld, VirtualClock
from lib_dist.models.gpt import GPTConfig
from lib_dist.three_d import Layout, ThreeD, three_d_step
from lib_dist.three_d.clocked import measured_step, stage_flops
from lib_dist.three_d.planner import Machines, price
from lib_dist.three_d.plots import group_events, members, plot_groups
from lib_dist.train.utilisation import flops_per_token

matplotlib.use("Agg")
CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=4, n_head=4, n_embd=16)
FREE = AlphaBeta(0.0, math.inf)
CLUSTER = Machines(devices=8, per_node=8, memory=2**30, flops=1e9, mfu=0.5, intra=FREE,
                   inter=FREE)


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 4, 2), (8, 1, 1), (2, 1, 4)])
def test_the_stages_flops_add_up_to_the_models(shape):
    layout = Layout(*shape)
    tokens = 3 * CONFIG.block_size

    def flops(comm):
        three_d = ThreeD(comm, layout, CONFIG)
        return three_d.mesh.coords, stage_flops(three_d, tokens)

    found = SimulatedWorld(8).run(flops)
    replica = sum(f for coords, f in found if coords[0] == 0)
    head_copies = (layout.tp - 1) * 6 * CONFIG.vocab_size * CONFIG.n_embd  # whole on each tp rank
    assert replica == tokens * (flops_per_token(CONFIG) + head_copies)


def test_with_free_links_pure_data_parallelism_lasts_the_planners_compute():
    layout = Layout(8, 1, 1)
    measured = measured_step(layout, CONFIG, CLUSTER, global_batch=16)
    assert measured == pytest.approx(price(CONFIG, layout, CLUSTER, 16).compute_s, rel=1e-12)
    with pytest.raises(ValueError, match="one link"):
        measured_step(layout, CONFIG, Machines(**{**vars(CLUSTER), "per_node": 4}), 16)


def test_every_event_of_a_step_stays_in_its_group_and_a_world_collective_does_not():
    def step(comm, stray):
        three_d = ThreeD(comm, Layout(2, 2, 2), CONFIG)
        tokens = torch.randint(CONFIG.vocab_size, (4, CONFIG.block_size + 1),
                               generator=torch.Generator().manual_seed(0))
        three_d_step(three_d, torch.optim.SGD(three_d.parameters(), lr=0.1), tokens[:, :-1],
                     tokens[:, 1:], m=2)
        if stray:  # the mistake: a "tensor-parallel" all-reduce issued on the world
            comm.all_reduce(torch.ones(1))
        groups = {n: members(three_d.mesh[n]) for n in ("dp", "pp", "tp")}
        return groups, group_events(three_d.mesh), comm.trace.of_rank(comm.rank)

    for rank, (groups, events, _) in enumerate(SimulatedWorld(8).run(step, False)):
        kinds = {(e.group, e.kind) for e in events}
        assert {("tp", "all_reduce"), ("dp", "all_reduce"), ("compute", "compute")} <= kinds
        assert {("pp", "send"), ("pp", "recv")} & kinds
        for e in events:
            assert e.rank == rank
            assert e.group == "compute" or set(e.ranks) <= set(groups[e.group]), e
    groups, events, world_events = SimulatedWorld(8, clock=VirtualClock()).run(step, True)[0]
    # the stray collective is not in any group's trace: it is the world's, over all 8 ranks
    assert "all_reduce" in [e.kind for e in world_events]
    assert all(len(e.ranks) <= 2 for e in events)
    axes = plot_groups(events, title="t")
    assert len(axes.collections) == sum(e.end > e.start for e in events)  # one bar each
