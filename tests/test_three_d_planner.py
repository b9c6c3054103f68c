"""The 3D planner (lib_dist.three_d.planner): its activation term is what module 6's
tensor-parallel block saves, measured, for t = 1, 2, 4; its plans fit the device, come fastest
first, and price each part as its formula says (the bubble, tensor parallelism inside or
across nodes, data parallelism hidden behind the backward pass)."""

from __future__ import annotations

import pytest
import torch

from lib_dist.comm import AlphaBeta, SimulatedWorld
from lib_dist.models.gpt import GPT, GPTConfig
from lib_dist.tensor_parallel import ParallelBlock
from lib_dist.three_d import Layout
from lib_dist.three_d.planner import Machines, activation_bytes_per_layer, plans, price

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
