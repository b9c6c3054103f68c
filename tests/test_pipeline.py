"""lib_dist's pipeline: schedules on paper give the formulas, a pipelined step on simulated ranks
gives one process's loss and gradients and the same virtual timeline as its schedule on paper,
stages talk to their neighbours only, and a schedule that deadlocks says who waits for what."""

from __future__ import annotations

import copy
import itertools
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from lib_dist.comm import SimulatedWorld, VirtualClock
from lib_dist.comm.errors import DeadlockError
from lib_dist.errors import RankFailure
from lib_dist.models.gpt import GPTConfig
from lib_dist.pipeline import (SCHEDULES, ScheduleDeadlock, Stage, Step, balanced_bounds,
                               bubble_fraction, formula_bubble, formula_makespan, gpipe,
                               gpt_layers, live_activations, makespan, naive, next_token_loss,
                               one_f_one_b, peak_live, recv_forward, run_schedule, simulate,
                               split_model)


from tolerances import gpt_terms, rounding

CONFIG = GPTConfig(vocab_size=17, block_size=8, n_layer=4, n_head=2, n_embd=16)
TERMS = gpt_terms(CONFIG, 8 * CONFIG.block_size)  # gpt_batch's 8 sequences


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_on_paper_both_schedules_take_the_formulas_time(name):
    for p, m in itertools.product(range(1, 6), range(1, 9)):
        trace = simulate(SCHEDULES[name](p, m))
        assert makespan(trace) == formula_makespan(p, m)
        assert bubble_fraction(trace) == pytest.approx(formula_bubble(p, m), abs=1e-12)
        peaks = [peak_live(trace, r) for r in range(p)]
        assert peaks == ([m] * p if name == "gpipe" else [min(p - r, m) for r in range(p)])


def test_other_costs_and_message_costs_move_the_makespan():
    trace = simulate(gpipe(3, 4), costs={"F": 2.0, "B": 5.0}, message=0.5)
    # the first micro-batch crosses 2 boundaries each way: (m + p - 1)(f + b) + 4 messages
    assert makespan(trace) == (4 + 3 - 1) * 7.0 + 4 * 0.5


def test_the_naive_split_keeps_one_stage_busy_at_a_time():
    for p in range(1, 6):
        trace = simulate(naive(p))
        assert bubble_fraction(trace) == pytest.approx(1 - 1 / p)
        starts = sorted(e.vstart for e in trace.events)
        assert len(set(starts)) == len(starts)  # never two stages at once


def test_live_activations_rise_with_forwards_and_fall_with_backwards():
    trace = simulate(one_f_one_b(3, 4))
    assert live_activations(trace, 0) == [1, 2, 3, 2, 3, 2, 1, 0]


def test_a_schedule_that_deadlocks_on_paper_names_each_ranks_wait():
    schedule = one_f_one_b(2, 2)
    schedule[1] = [Step("B", 0, 1), Step("F", 0, 1), Step("F", 1, 1), Step("B", 1, 1)]
    schedule[0] = [Step("F", 0, 0), Step("B", 0, 0), Step("F", 1, 0), Step("B", 1, 0)]
    with pytest.raises(ScheduleDeadlock) as info:
        simulate(schedule)
    assert "rank 0: B0 of stage 0 waits for B0 of stage 1 (rank 1)" in str(info.value)
    assert "rank 1: B0 of stage 1 waits for F0 of stage 1 (rank 1)" in str(info.value)
    with pytest.raises(ValueError, match="twice"):
        simulate([[Step("F", 0, 0), Step("F", 0, 0)]])
    with pytest.raises(ValueError, match="has no backward"):
        simulate([[Step("F", 0, 0)]])


def test_split_model_minimises_the_largest_stage():
    rng = random.Random(0)
    for _ in range(60):
        costs = [rng.randint(1, 20) for _ in range(rng.randint(1, 9))]
        p = rng.randint(1, len(costs))
        bounds = balanced_bounds(costs, p)
        assert [a for a, _ in bounds][0] == 0 and bounds[-1][1] == len(costs)
        assert all(b > a for a, b in bounds) and all(
            b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
                   for cuts in itertools.combinations(range(1, len(costs)), p - 1))
        assert max(sum(costs[a:b]) for a, b in bounds) == best
    layers = [nn.Linear(2, 2) for _ in range(3)]
    stages = split_model(layers, 2)
    assert [list(s) for s in stages] in ([layers[:1], layers[1:]], [layers[:2], layers[2:]])
    with pytest.raises(ValueError, match="3 layers into 4"):
        split_model(layers, 4)


def pipelined(comm, parts, schedule, x, y, m):
    stage = Stage(parts[comm.rank], comm, boundary_shape=(CONFIG.block_size, CONFIG.n_embd),
                  loss_fn=next_token_loss if comm.rank == len(parts) - 1 else None)
    loss = run_schedule(comm, stage, schedule[comm.rank], x, y, m)
    return loss, stage.peak_live


def gpt_batch(size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, CONFIG.vocab_size, (size, CONFIG.block_size), generator=g)
    return x, torch.randint(0, CONFIG.vocab_size, (size, CONFIG.block_size), generator=g)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_pipelined_gpt_step_equals_one_process(name):
    layers = gpt_layers(CONFIG, seed=1)
    x, y = gpt_batch()
    oracle = copy.deepcopy(nn.Sequential(*layers))
    want = next_token_loss(oracle(x), y)
    want.backward()
    for p, m in [(1, 2), (2, 4), (3, 1), (4, 8), (4, 2)]:
        parts = split_model(copy.deepcopy(layers), p)
        schedule = SCHEDULES[name](p, m)
        world = SimulatedWorld(p, clock=VirtualClock())
        results = world.run(pipelined, parts, schedule, x, y, m)
        assert results[-1][0] == pytest.approx(want.item(), abs=rounding(want, TERMS))
        assert all(loss is None for loss, _ in results[:-1])
        for got, ref in zip([q for part in parts for q in part.parameters()],
                            oracle.parameters()):
            torch.testing.assert_close(got.grad, ref.grad, rtol=0,
                                       atol=rounding(ref.grad, TERMS))
        on_paper = simulate(schedule)
        assert sorted((e.rank, e.label, e.vstart, e.vend) for e in world.trace.events
                      if e.kind == "compute") == sorted(
            (e.rank, e.label, e.vstart, e.vend) for e in on_paper.events)
        assert [peak for _, peak in results] == [peak_live(on_paper, r) for r in range(p)]
        pairs = sorted((msg.src, msg.dst) for msg in world.trace.messages())
        assert pairs == sorted([(s, s + 1) for s in range(p - 1)] * m
                               + [(s + 1, s) for s in range(p - 1)] * m)


def receive_first(comm):
    """Every stage but the first waits for an activation before the first stage has sent
    one, and the first waits for a gradient: nobody sends."""
    stage = Stage(nn.Identity(), comm, boundary_shape=(2,),
                  loss_fn=(lambda out, y: out.sum()) if comm.rank == comm.world_size - 1 else None)
    if stage.is_first:
        comm.recv(stage.receive_buffer(1), 1)
    else:
        recv_forward(comm, stage, 1)


def test_a_schedule_that_deadlocks_is_found_out_naming_every_rank():
    # a DeadlockError, raised once every rank waits, never the 30 s timeout's CommTimeout
    with pytest.raises(RankFailure) as info:
        SimulatedWorld(4, timeout=30).run(receive_first)
    assert sorted(info.value.exceptions) == [0, 1, 2, 3]
    message = str(info.value.exceptions[2])
    assert isinstance(info.value.exceptions[2], DeadlockError)
    for rank, peer in [(0, 1), (1, 0), (2, 1), (3, 2)]:
        assert f"rank {rank}: waiting in recv from rank {peer}" in message


def test_a_stage_refuses_steps_out_of_order():
    def misuse(comm):
        stage = Stage(nn.Linear(2, 2), comm, boundary_shape=(2,), loss_fn=lambda o, y: o.sum())
        with pytest.raises(RuntimeError, match="whose forward has not run"):
            stage.backward(0, 1.0)
        stage.forward(0, torch.ones(1, 2), torch.zeros(1))
        with pytest.raises(RuntimeError, match="again before its backward"):
            stage.forward(0, torch.ones(1, 2), torch.zeros(1))
        with pytest.raises(ValueError, match="needs the target"):
            stage.forward(1, torch.ones(1, 2))
        return stage.live

    assert SimulatedWorld(1).run(misuse) == [1]
    with pytest.raises(RankFailure, match="give it loss_fn"):
        SimulatedWorld(1).run(lambda comm: Stage(nn.Identity(), comm, boundary_shape=(1,)))


def test_ranks_building_their_layers_at_once_all_get_the_same_model():
    """gpt_layers seeds torch's global generator, which simulated ranks (threads) share."""
    want = [p for layer in gpt_layers(CONFIG, seed=3) for p in layer.parameters()]
    for _ in range(3):
        for got in SimulatedWorld(4).run(
                lambda comm: [p for layer in gpt_layers(CONFIG, seed=3)
                              for p in layer.parameters()]):
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
