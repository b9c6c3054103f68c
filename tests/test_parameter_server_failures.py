"""A worker that dies, on simulated ranks and on the virtual clock: it stops a synchronous
parameter server (every other rank fails with it, at once); `serve_tolerant` drops it and
applies the live workers' gradients, ending at `replay_async` of the order it recorded; a
bounded-staleness schedule stops b + 1 gradients past the dead worker's last, an unbounded one
does not; a synchronous step with fewer backups than dead workers never completes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lib_dist.comm import SimulatedWorld
from lib_dist.errors import RankFailure
from lib_dist.parameter_server import (arrival_schedule, flat_parameters, parameter_server,
                                       replay_async, step_times_with_backups, work)
from lib_dist.parameter_server.tolerant import serve_tolerant

F64 = torch.float64
LR, STEPS = 0.05, 6


class Died(RuntimeError):
    pass


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()


def make_batches(workers, steps: int) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return {(w, s): (torch.randn(6, 4, generator=g, dtype=F64),
                     torch.randn(6, 2, generator=g, dtype=F64))
            for w in workers for s in range(steps)}


def dying(data, deaths: dict[int, int]):
    def batch(w, step):
        if deaths.get(w) == step:
            raise Died(f"worker {w} died at step {step}")
        return data[w, step]
    return batch


def test_a_dead_worker_stops_a_synchronous_server_and_every_other_rank_with_it():
    model, data = make_model(), make_batches([1, 2, 3], STEPS)
    with pytest.raises(RankFailure) as caught:
        SimulatedWorld(4, timeout=60).run(
            lambda comm: parameter_server(comm, copy.deepcopy(model), 1, STEPS, LR,
                                          dying(data, {3: 2}), F.mse_loss))
    assert caught.value.ranks == [3] and caught.value.consequences == [0, 1, 2]
    assert "recv from rank 3" in str(caught.value.exceptions[0])
    assert caught.value.still_running == []


@pytest.mark.parametrize("deaths", [{}, {3: 2}, {1: 0, 3: 4}])
def test_a_tolerant_server_drops_dead_workers_and_is_async_sgd_on_its_order(deaths):
    model, workers = make_model(), [1, 2, 3]
    data = make_batches(workers, STEPS)
    finished = {}

    def job(comm):
        if comm.rank == 0:
            shard = flat_parameters(model)
            return serve_tolerant(comm, shard, workers, STEPS, LR), shard
        return work(comm, copy.deepcopy(model), 1, STEPS,
                    lambda step: dying(data, deaths)(comm.rank, step), F.mse_loss)

    def run(comm):
        finished[comm.rank] = job(comm)

    try:
        SimulatedWorld(4, timeout=60).run(run)
    except RankFailure as failure:  # the dead workers, and no one else
        assert failure.ranks == sorted(deaths) and failure.consequences == []
    assert sorted(finished) == [r for r in range(4) if r not in deaths]
    served, shard = finished[0]
    assert served.lost == deaths
    assert len(served.applied) == STEPS * (len(workers) - len(deaths)) + sum(deaths.values())
    order = [w for w, _ in served.applied]
    assert [order.count(w) for w in workers] == [deaths.get(w, STEPS) for w in workers]
    replayed = replay_async(copy.deepcopy(model), order, LR, lambda w, s: data[w, s],
                            F.mse_loss)
    assert torch.equal(shard, replayed.parameters)
    assert [tau for _, tau in served.applied] == replayed.staleness


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_bounded_staleness_stops_b_plus_one_gradients_past_a_dead_worker(bound):
    s = arrival_schedule([1.0, 1.0, 1.5, 2.0], 50, bound=bound, fails_after={2: 7})
    assert [s.order.count(w) for w in range(4)] == [7 + bound + 1] * 2 + [7, 7 + bound + 1]
    assert s.stalled == [0, 1, 3]


def test_an_unbounded_schedule_goes_on_without_a_dead_worker():
    s = arrival_schedule([1.0, 1.0, 1.5, 2.0], 50, fails_after={2: 7})
    assert [s.order.count(w) for w in range(4)] == [50, 50, 7, 50] and s.stalled == []
    assert math.isclose(s.makespan, 100.0)
    assert arrival_schedule([1.0, 2.0], 5).stalled == []


@pytest.mark.parametrize("dead", [1, 2])
def test_a_synchronous_step_completes_only_with_as_many_backups_as_dead_workers(dead):
    for backups in range(4):
        times = step_times_with_backups(4, backups, 50, dead=dead)
        assert bool(times.isinf().all()) == (backups < dead)
        assert bool(times.isfinite().all()) == (backups >= dead)
