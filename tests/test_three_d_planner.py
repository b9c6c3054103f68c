"""The 3D planner (lib_dist.three_d.planner): its activation term is what module 6's
tensor-parallel block saves, measured, for t = 1, 2, 4; its plans fit the device, come fastest
first, and price each part as its formula says (the bubble, tensor parallelism inside or
across nodes, data parallelism hidden behind the backward pass). Priced as run
(`as_run=True`): its layers, stages and gradient tensors are the ones `ThreeD` builds, its 1F1B
timeline is the simulated schedule's, and its step is the one a virtual clock measures of a
real 3D step of 8 simulated ranks, in every layout the capstone runs."""

from __future__ import annotations

import pytest
import torch

from lib_dist.comm import AlphaBeta, SimulatedWorld, VirtualClock
from lib_dist.models.gpt import GPT, GPTConfig
from lib_dist.pipeline import (StepCosts, balanced_bounds, gpt_layers, one_f_one_b,
                               parameter_count, simulate)
from lib_dist.tensor_parallel import ParallelBlock
from lib_dist.three_d import Layout, ThreeD, three_d_step
from lib_dist.three_d import as_run as run
from lib_dist.three_d.planner import Machines, activation_bytes_per_layer, plans, price
from lib_dist.train.utilisation import flops_per_token

TINY = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=4, n_embd=32)
# a 7B GPT's shape (32 blocks 4096 wide, 32 heads, 4096 tokens) on 64 80-GiB devices
SEVEN_B = GPTConfig(vocab_size=32000, block_size=4096, n_layer=32, n_head=32, n_embd=4096)
H100S = Machines(devices=64, per_node=8, memory=80 * 2**30, flops=989e12, mfu=0.4,
                 intra=AlphaBeta(5e-6, 300e9), inter=AlphaBeta(10e-6, 50e9))


def saved_by_a_block(comm, block, batch):
    """Bytes of the tensors autograd saves in one forward of `block` split over `comm`, the
    block's input included, its parameters not."""
    split = ParallelBlock(block, comm)
    x = torch.randn(batch, TINY.block_size, TINY.n_embd, requires_grad=True)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        split(x)
    weights = {p.untyped_storage().data_ptr() for p in split.parameters()}
    return sum(n for ptr, n in saved.items() if ptr not in weights) + (
        0 if x.untyped_storage().data_ptr() in saved else x.nbytes)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_activation_term_is_what_a_tensor_parallel_block_saves(tp):
    torch.manual_seed(0)
    block = GPT(TINY).blocks[0]
    for batch in (1, 3):
        measured = SimulatedWorld(tp).run(saved_by_a_block, block, batch)
        assert set(measured) == {activation_bytes_per_layer(TINY, batch, tp)}, (tp, batch)


def test_plans_fit_the_device_and_come_fastest_first():
    found = plans(SEVEN_B, H100S, global_batch=512)
    assert found and all(p.memory <= H100S.memory for p in found)
    assert [p.step_s for p in found] == sorted(p.step_s for p in found)
    assert all(p.layout.world_size == 64 and p.layout.tp <= 8 for p in found)
    # without tensor or pipeline parallelism a 7B model's 16 bytes a parameter do not fit
    assert all((p.layout.tp, p.layout.pp) != (1, 1) for p in found)
    smaller = Machines(**{**vars(H100S), "memory": 40 * 2**30})
    assert len(plans(SEVEN_B, smaller, global_batch=512)) < len(found)


def test_each_part_is_priced_by_its_formula():
    plan = price(SEVEN_B, Layout(8, 4, 2), H100S, global_batch=512)
    assert plan.micro_batches == 64
    assert plan.bubble_s == pytest.approx(plan.compute_s * 3 / 64)  # (p - 1) / m
    # tp = 2 inside a node; tp = 16 would span two nodes and pay the network's links
    slow = Machines(**{**vars(H100S), "per_node": 1})
    assert price(SEVEN_B, Layout(8, 4, 2), slow, 512).tp_s > 5 * plan.tp_s
    # dp's all-reduce hides behind the backward pass unless it outlasts it
    assert plan.dp_exposed_s == 0.0
    no_network = Machines(**{**vars(H100S), "inter": AlphaBeta(1e-3, 1e6)})
    assert price(SEVEN_B, Layout(8, 4, 2), no_network, 512).dp_exposed_s > 0
    with pytest.raises(ValueError, match="does not split into dp=8"):
        price(SEVEN_B, Layout(8, 4, 2), H100S, global_batch=12)


# -- the step as `three_d_step` runs it (price(..., as_run=True)) -----------------------------

GPT4 = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=4, n_embd=16)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_as_run_layers_are_the_ones_three_d_builds(tp):
    layers = gpt_layers(GPT4, seed=0)
    kinds = run.layer_kinds(GPT4)
    for kind, layer in zip(kinds, layers):
        if kind != "block":
            assert run.layer_tensors(kind, GPT4, tp) == [p.numel() for p in layer.parameters()]
    split = SimulatedWorld(tp).run(lambda comm: [p.numel() for p in
                                                 ParallelBlock(layers[1], comm).parameters()])
    assert set(map(tuple, split)) == {tuple(run.layer_tensors("block", GPT4, tp))}
    # tp = 1: the layers' FLOPs are the model's, 6 N + 12 L C T a token
    assert sum(run.layer_flops_per_token(k, GPT4) for k in kinds) == flops_per_token(GPT4)
    for pp in range(1, len(layers) + 1):
        assert run.stage_bounds(GPT4, pp) == balanced_bounds(
            [parameter_count(layer) for layer in layers], pp)


def test_the_1f1b_timeline_is_the_simulated_schedules():
    for p, m in ((1, 3), (2, 4), (4, 4), (4, 8)):
        ends = run.one_f_one_b_ends([1.0] * p, [2.0] * p, m, message=0.0)
        trace = simulate(one_f_one_b(p, m))
        assert max(ends) == max(e.vend for e in trace.events) == 3 * (m + p - 1)
    # a message between stages: the first forward and the last backward cross p - 1 links each
    assert max(run.one_f_one_b_ends([1.0] * 4, [2.0] * 4, 1, message=0.5)) == 12 + 6 * 0.5


def clocked(comm, layout, machines, m, micro_batch):
    """One 3D step on a clocked world, each stage's forward and backward priced as the planner
    prices them (FLOPs of its own layers at flops * mfu, a third forward): virtual seconds."""
    three_d = ThreeD(comm, layout, GPT4)
    first, end = three_d.bounds[three_d.mesh["pp"].rank]
    flops = sum(run.layer_flops_per_token(k, GPT4, layout.tp)
                for k in run.layer_kinds(GPT4)[first:end]) * micro_batch * GPT4.block_size
    seconds = flops / (machines.flops * machines.mfu)
    three_d.stage.costs = StepCosts(forward=seconds / 3, backward=2 * seconds / 3)
    tokens = torch.randint(GPT4.vocab_size, (m * layout.dp * micro_batch, GPT4.block_size + 1),
                           generator=torch.Generator().manual_seed(0))
    comm.barrier()
    start = comm.virtual_time()
    three_d_step(three_d, torch.optim.SGD(three_d.parameters(), lr=0.1), tokens[:, :-1],
                 tokens[:, 1:], m)
    comm.barrier()
    return comm.virtual_time() - start


@pytest.mark.parametrize("shape", [(2, 2, 2), (4, 1, 2), (2, 4, 1), (1, 2, 4), (8, 1, 1)])
def test_as_run_the_planner_predicts_the_virtual_clocks_step(shape):
    """The virtual clock runs the program: unequal stages, the simulated all-reduce
    (gather-broadcast, two messages deep on links that are not shared), dp's gradients one
    tensor at a time after the pipeline. Priced as the clock prices them, the planner's step
    is the measured one, to float64's rounding over a few hundred additions."""
    link = AlphaBeta(3e-4, 2e8)
    machines = Machines(devices=8, per_node=8, memory=2**30, flops=1e9, mfu=0.25, intra=link,
                        inter=link, all_reduce={n: AlphaBeta(2 * link.alpha, link.beta / 2)
                                                for n in (2, 4, 8)})
    layout, m, micro_batch = Layout(*shape), 2, 2
    world = SimulatedWorld(8, timeout=60, clock=VirtualClock(link))
    measured = max(world.run(clocked, layout, machines, m, micro_batch))
    plan = price(GPT4, layout, machines, m * layout.dp * micro_batch, micro_batch, 4,
                 as_run=True)
    assert plan.step_s == pytest.approx(measured, rel=1e-9)
    parts = (plan.compute_s, plan.bubble_s, plan.tp_s, plan.pp_s, plan.dp_exposed_s)
    assert sum(parts) == pytest.approx(plan.step_s) and min(parts) >= 0
    assert (plan.tp_s > 0) == (layout.tp > 1) and (plan.pp_s > 0) == (layout.pp > 1)
