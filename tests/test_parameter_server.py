"""lib_dist.parameter_server on simulated ranks: a synchronous server (1-3 shards) is SGD on
the workers' mean gradient, the data-parallel all-reduce's parameters, with the message counts
and link bytes of the cost model; an asynchronous server that follows a schedule (or records
the order it saw) ends with `replay_async`'s parameters and staleness; the virtual-clock
schedules keep SSP's bound; local SGD with H = 1 is gradient averaging; gossip keeps the mean
and contracts by the mixing matrix's second eigenvalue; top-k with error feedback loses
nothing; and the cost formulas are the alpha-beta model's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lib_dist.comm import AlphaBeta, SimulatedWorld
from lib_dist.comm.algorithms import ring
from lib_dist.data_parallel import average_gradients
from lib_dist.errors import RankFailure
from lib_dist.parameter_server import (TopK, arrival_schedule, average_parameters, dpsgd_step,
                                       flat_gradients, flat_parameters, gather_shards,
                                       gossip_step, link_bytes, load_flat, local_sgd,
                                       parameter_server, ps_link_bytes, ps_step_time,
                                       replay_async, ring_link_bytes, ring_mixing_matrix,
                                       ring_neighbours, ring_second_eigenvalue, ring_step_time,
                                       round_robin, second_eigenvalue, server_ranks,
                                       shard_bounds, sparse_all_reduce, staleness_aware,
                                       staleness_of, step_times_with_backups,
                                       sum_of_deviations, worker_ranks)

F64 = torch.float64
LR = 0.1
TOL = 1e-12


# -- helpers -----------------------------------------------------------------------------------


def make_model(in_features: int = 4, hidden: int = 3, out: int = 2, seed: int = 0) -> nn.Module:
    """A small float64 MLP (23 parameters by default) with seeded weights. Built in the main
    thread, before any `run`: the simulated ranks share torch's global RNG."""
    model = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(),
                          nn.Linear(hidden, out)).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=F64))
    return model


def make_batches(workers, steps: int, seed: int = 1, n: int = 6, in_features: int = 4,
                 out: int = 2) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """(worker, step) -> (x, y), all drawn up front from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return {(w, s): (torch.randn(n, in_features, generator=g, dtype=F64),
                     torch.randn(n, out, generator=g, dtype=F64))
            for w in workers for s in range(steps)}


def batch_fn_of(data):
    return lambda worker, step: data[worker, step]


def gradient_at(model: nn.Module, params: torch.Tensor, batch) -> torch.Tensor:
    load_flat(model, params)
    model.zero_grad(set_to_none=True)
    x, y = batch
    F.mse_loss(model(x), y).backward()
    return flat_gradients(model)


def sgd_on_mean_gradient(model: nn.Module, workers, steps: int, lr: float, batch_fn
                         ) -> torch.Tensor:
    """One process: every step, theta -= lr * mean over workers of their gradients."""
    model = copy.deepcopy(model)
    theta = flat_parameters(model)
    for step in range(steps):
        grads = [gradient_at(model, theta, batch_fn(w, step)) for w in workers]
        theta = theta - lr * torch.stack(grads).mean(0)
    return theta


def manual_async(model: nn.Module, order, lr_of_tau, batch_fn) -> tuple[torch.Tensor, list[int]]:
    """An independent asynchronous-SGD oracle: each worker's gradient is taken on the
    parameters it pulled after its previous push (the initial ones at first); staleness is the
    number of updates applied since that pull."""
    model = copy.deepcopy(model)
    theta = initial = flat_parameters(model)
    pulled: dict[int, tuple[int, torch.Tensor]] = {}
    steps: dict[int, int] = {}
    taus = []
    for k, w in enumerate(order):
        version, params = pulled.get(w, (0, initial))
        tau = k - version
        grad = gradient_at(model, params, batch_fn(w, steps.get(w, 0)))
        theta = theta - lr_of_tau(tau) * grad
        pulled[w], steps[w] = (k + 1, theta), steps.get(w, 0) + 1
        taus.append(tau)
    return theta, taus


def ps_rank(comm, model, servers, steps, batch_fn, kwargs):
    return parameter_server(comm, copy.deepcopy(model), servers, steps, LR, batch_fn,
                            F.mse_loss, **kwargs)


def run_ps(world_size: int, model, servers: int, steps: int, batch_fn, **kwargs):
    world = SimulatedWorld(world_size)
    return world.run(ps_rank, model, servers, steps, batch_fn, kwargs), world


def dp_rank(comm, model, workers, steps, batch_fn):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch_fn(workers[comm.rank], step)
        F.mse_loss(model(x), y).backward()
        average_gradients(comm, model)
        opt.step()
    return flat_parameters(model)


def consensus_error(xs: list[torch.Tensor]) -> float:
    stack = torch.stack(xs)
    return float((stack - stack.mean(0)).norm())


# -- layout ------------------------------------------------------------------------------------


def test_worker_ranks_are_the_ranks_after_the_servers():
    """worker_ranks/server_ranks split 0..N-1 at `servers`."""
    assert server_ranks(2) == [0, 1]
    assert worker_ranks(1, 4) == [1, 2, 3]
    assert worker_ranks(3, 5) == [3, 4]


@pytest.mark.parametrize("servers, world", [(0, 4), (4, 4), (5, 4)])
def test_worker_ranks_refuses_a_job_without_a_server_or_a_worker(servers, world):
    """worker_ranks raises ValueError unless 1 <= servers < world_size."""
    with pytest.raises(ValueError, match="servers"):
        worker_ranks(servers, world)


def test_flat_parameters_and_load_flat_round_trip():
    """load_flat(flat_parameters) restores a model, in registration order, in place."""
    model, other = make_model(seed=0), make_model(seed=5)
    flat = flat_parameters(model)
    assert flat.shape == (23,) and flat.dtype == F64
    expected = torch.cat([model[0].weight.reshape(-1), model[0].bias,
                          model[2].weight.reshape(-1), model[2].bias]).detach()
    assert torch.equal(flat, expected)
    weight = other[0].weight
    load_flat(other, flat)
    assert other[0].weight is weight  # in place
    assert torch.equal(flat_parameters(other), flat)
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(p, q)


def test_load_flat_refuses_a_vector_too_long():
    """load_flat raises ValueError for a vector longer than the model's parameters."""
    model = make_model()
    with pytest.raises(ValueError, match="24 numbers"):
        load_flat(model, torch.zeros(24, dtype=F64))


def test_load_flat_refuses_a_vector_too_short_and_writes_nothing():
    """load_flat raises ValueError for a vector too short, before changing any parameter."""
    model = make_model()
    before = flat_parameters(model)
    with pytest.raises(ValueError, match="22 numbers"):
        load_flat(model, torch.zeros(22, dtype=F64))
    assert torch.equal(flat_parameters(model), before)


def test_shard_bounds_cover_the_vector_in_order():
    """shard_bounds cuts 23 numbers into consecutive ceil-sized shards."""
    assert shard_bounds(23, 1) == [(0, 23)]
    assert shard_bounds(23, 2) == [(0, 12), (12, 23)]
    assert shard_bounds(23, 3) == [(0, 8), (8, 16), (16, 23)]


# -- synchronous parameter server --------------------------------------------------------------


@pytest.mark.parametrize("servers, world", [(1, 2), (1, 4), (2, 5), (3, 5)])
def test_sync_server_is_sgd_on_the_mean_gradient_and_data_parallel(servers, world):
    """Sync PS (shards, workers) equals SGD on the mean gradient and data parallel; staleness 0."""
    steps = 3
    model = make_model()
    workers = worker_ranks(servers, world)
    data = make_batches(workers, steps)
    batch_fn = batch_fn_of(data)
    results, _ = run_ps(world, model, servers, steps, batch_fn)

    want = sgd_on_mean_gradient(model, workers, steps, LR, batch_fn)
    assert not torch.allclose(want, flat_parameters(model))  # training moved the parameters
    assert [r.role for r in results] == ["server"] * servers + ["worker"] * len(workers)
    joined = gather_shards(results)
    assert joined.shape == want.shape
    torch.testing.assert_close(joined, want, rtol=0, atol=TOL)
    for r in results[servers:]:
        torch.testing.assert_close(r.parameters, want, rtol=0, atol=TOL)
        assert len(r.losses) == steps
    for j, (lo, hi) in enumerate(shard_bounds(want.numel(), servers)):
        assert results[j].parameters.shape == (hi - lo,)
        assert results[j].applied == [(w, 0) for _ in range(steps) for w in workers]

    dp = SimulatedWorld(len(workers)).run(dp_rank, model, workers, steps, batch_fn)
    for params in dp:
        torch.testing.assert_close(joined, params, rtol=0, atol=TOL)

    # each worker's losses: its batch's loss on the parameters of that step
    theta, probe = flat_parameters(model), copy.deepcopy(model)
    for step in range(steps):
        grads = []
        for w in workers:
            load_flat(probe, theta)
            x, y = batch_fn(w, step)
            with torch.no_grad():
                loss = F.mse_loss(probe(x), y).item()
            assert results[w].losses[step] == pytest.approx(loss, rel=0, abs=TOL)
            grads.append(gradient_at(probe, theta, (x, y)))
        theta = theta - LR * torch.stack(grads).mean(0)


@pytest.mark.parametrize("servers, world", [(1, 2), (1, 4), (2, 5), (3, 5)])
def test_sync_server_traffic_matches_the_cost_model(servers, world):
    """Sync PS trace: message counts and sizes per rank; link bytes = model * steps + final pull."""
    steps = 3
    model = make_model(in_features=5, hidden=2, out=4)  # 12 + 2 + 8 + 4 = 24 parameters
    P = flat_parameters(model).numel()
    assert P == 24
    workers = worker_ranks(servers, world)
    W = len(workers)
    data = make_batches(workers, steps, in_features=5, out=4)
    _, sim = run_ps(world, model, servers, steps, batch_fn_of(data))
    trace = sim.trace
    bounds = shard_bounds(P, servers)
    shard_bytes = [(hi - lo) * 8 for lo, hi in bounds]
    M = P * 8

    for w in workers:
        sends = [e for e in trace.events if e.rank == w and e.kind == "send"]
        assert len(sends) == steps * servers
        for j in range(servers):
            to_j = [e for e in sends if e.peer == j]
            assert len(to_j) == steps and all(e.nbytes == shard_bytes[j] for e in to_j)
        recvs = [e for e in trace.events if e.rank == w and e.kind == "recv"]
        assert len(recvs) == (steps + 1) * servers
        assert {e.peer for e in sends + recvs} == set(range(servers))  # never another worker
    for j in range(servers):
        sends = [e for e in trace.events if e.rank == j and e.kind == "send"]
        assert len(sends) == (steps + 1) * W
        assert all(e.nbytes == shard_bytes[j] for e in sends)
        assert sorted(e.peer for e in sends) == sorted(workers * (steps + 1))

    summary = trace.summary()
    links = link_bytes(trace)
    model_ps = ps_link_bytes(M, W, servers)
    for j in range(servers):
        assert summary[j].sent_messages == (steps + 1) * W
        assert summary[j].recv_messages == steps * W
        assert links[j] == (2 * steps + 1) * W * shard_bytes[j]
        assert links[j] == model_ps["server"] * steps + W * M / servers
    for w in workers:
        assert links[w] == model_ps["worker"] * steps + M
    assert set(links) == set(range(world))


def test_schedule_is_refused_by_a_sync_server():
    """serve with mode='sync' and a schedule raises ValueError on the server rank."""
    model = make_model()
    data = make_batches([1], 1)
    with pytest.raises(RankFailure) as failure:
        run_ps(2, model, 1, 1, batch_fn_of(data), schedule=[1])
    assert failure.value.ranks == [0]
    assert isinstance(failure.value.exceptions[0], ValueError)
    assert "mode='async'" in str(failure.value.exceptions[0])


# -- asynchronous parameter server -------------------------------------------------------------


@pytest.mark.parametrize("servers, world", [(1, 4), (2, 5)])
def test_async_server_following_an_arrival_schedule_is_replay_async(servers, world):
    """Async PS on an arrival_schedule records (order, staleness) and ends at replay_async."""
    steps = 4
    model = make_model()
    workers = worker_ranks(servers, world)
    sched = arrival_schedule([1.0, 1.7, 2.6][:len(workers)], steps)
    order = [workers[i] for i in sched.order]
    assert order == arrival_schedule([1.0, 1.7, 2.6][:len(workers)], steps,
                                     workers=workers).order
    assert max(staleness_of(order)) > 0  # a schedule with real asynchrony
    data = make_batches(workers, steps)
    batch_fn = batch_fn_of(data)
    results, _ = run_ps(world, model, servers, steps, batch_fn, mode="async", schedule=order)

    for j in range(servers):
        assert results[j].applied == list(zip(order, staleness_of(order)))
    replay = replay_async(copy.deepcopy(model), order, LR, batch_fn, F.mse_loss)
    assert replay.staleness == staleness_of(order)
    joined = gather_shards(results)
    torch.testing.assert_close(joined, replay.parameters, rtol=0, atol=TOL)
    oracle, taus = manual_async(model, order, lambda tau: LR, batch_fn)
    assert taus == staleness_of(order)
    torch.testing.assert_close(replay.parameters, oracle, rtol=0, atol=TOL)
    # sync SGD on the same gradients would end elsewhere: the staleness mattered
    assert not torch.allclose(joined, sgd_on_mean_gradient(model, workers, steps, LR, batch_fn))


def test_async_with_one_worker_is_plain_sgd():
    """Async PS with one worker (world 2): staleness all 0 and the parameters of plain SGD."""
    steps = 4
    model = make_model()
    data = make_batches([1], steps)
    batch_fn = batch_fn_of(data)
    for schedule in ([1] * steps, None):
        results, _ = run_ps(2, model, 1, steps, batch_fn, mode="async", schedule=schedule)
        assert results[0].applied == [(1, 0)] * steps
        want = sgd_on_mean_gradient(model, [1], steps, LR, batch_fn)
        torch.testing.assert_close(results[0].parameters, want, rtol=0, atol=TOL)
        torch.testing.assert_close(results[1].parameters, want, rtol=0, atol=TOL)


def test_round_robin_staleness_is_w_minus_1_after_the_first_round():
    """round_robin staleness is 0..W-1, then W-1; an async server following it records that."""
    for W in (1, 2, 3, 5):
        order = round_robin(list(range(10, 10 + W)), 4)
        assert order == [10 + i for _ in range(4) for i in range(W)]
        assert staleness_of(order) == list(range(W)) + [W - 1] * (W * 3)
    model = make_model()
    workers = [1, 2, 3]
    data = make_batches(workers, 3)
    results, _ = run_ps(4, model, 1, 3, batch_fn_of(data), mode="async",
                        schedule=round_robin(workers, 3))
    assert [tau for _, tau in results[0].applied] == [0, 1, 2] + [2] * 6
    assert [w for w, _ in results[0].applied] == round_robin(workers, 3)


def test_async_first_come_order_replays_to_the_servers_parameters():
    """First-come async PS: each worker `steps` times in the recorded order; it replays exactly."""
    steps = 4
    model = make_model()
    workers = [1, 2, 3]
    data = make_batches(workers, steps)
    batch_fn = batch_fn_of(data)
    results, _ = run_ps(4, model, 1, steps, batch_fn, mode="async")
    applied = results[0].applied
    order = [w for w, _ in applied]
    assert sorted(order) == sorted(workers * steps)
    assert [tau for _, tau in applied] == staleness_of(order)
    replay = replay_async(copy.deepcopy(model), order, LR, batch_fn, F.mse_loss)
    torch.testing.assert_close(results[0].parameters, replay.parameters, rtol=0, atol=TOL)
    # a worker ends with the parameters it pulled after its own last push
    for w in workers:
        last = max(k for k, v in enumerate(order) if v == w)
        prefix = replay_async(copy.deepcopy(model), order[:last + 1], LR, batch_fn, F.mse_loss)
        torch.testing.assert_close(results[w].parameters, prefix.parameters, rtol=0, atol=TOL)


@pytest.mark.parametrize("schedule, problem", [
    ([1, 2, 3, 1, 2, 3, 1, 2], "exactly 3 times"),  # worker 3 once short
    ([1, 2, 3] * 3 + [1], "exactly 3 times"),  # worker 1 once too many
    ([1, 2, 3] * 3 + [0], "non-workers [0]"),  # a server in the schedule
    ([1, 2, 3] * 3 + [7], "non-workers [7]"),  # no such rank
])
def test_async_server_refuses_a_bad_schedule(schedule, problem):
    """A bad schedule makes the server raise ValueError naming the problem (as RankFailure)."""
    model = make_model()
    data = make_batches([1, 2, 3], 3)
    with pytest.raises(RankFailure) as failure:
        run_ps(4, model, 1, 3, batch_fn_of(data), mode="async", schedule=schedule)
    assert failure.value.ranks == [0]
    error = failure.value.exceptions[0]
    assert isinstance(error, ValueError)
    assert problem in str(error) and "schedule" in str(error)
    assert problem in str(failure.value)


# -- staleness-aware learning rate -------------------------------------------------------------


def test_staleness_aware_divides_lr_by_the_staleness():
    """staleness_aware(lr)(tau) == lr / max(tau, 1)."""
    f = staleness_aware(0.3)
    assert f(0) == 0.3 and f(1) == 0.3
    assert f(2) == 0.3 / 2 and f(3) == 0.3 / 3 and f(7) == 0.3 / 7


def test_staleness_aware_replay_differs_only_when_updates_are_stale():
    """staleness_aware changes a replay only when stale, and the async server applies it too."""
    steps = 3
    model = make_model()
    workers = [1, 2, 3]
    data = make_batches(workers, steps)
    batch_fn = batch_fn_of(data)

    alone = [1] * steps
    plain = replay_async(copy.deepcopy(model), alone, LR, batch_fn, F.mse_loss)
    aware = replay_async(copy.deepcopy(model), alone, LR, batch_fn, F.mse_loss,
                         lr_for_staleness=staleness_aware(LR))
    assert torch.equal(plain.parameters, aware.parameters)

    order = round_robin(workers, steps)
    plain = replay_async(copy.deepcopy(model), order, LR, batch_fn, F.mse_loss)
    aware = replay_async(copy.deepcopy(model), order, LR, batch_fn, F.mse_loss,
                         lr_for_staleness=staleness_aware(LR))
    assert not torch.allclose(plain.parameters, aware.parameters, rtol=0, atol=1e-6)
    oracle, _ = manual_async(model, order, staleness_aware(LR), batch_fn)
    torch.testing.assert_close(aware.parameters, oracle, rtol=0, atol=TOL)

    results, _ = run_ps(4, model, 1, steps, batch_fn, mode="async", schedule=order,
                        lr_for_staleness=staleness_aware(LR))
    torch.testing.assert_close(results[0].parameters, aware.parameters, rtol=0, atol=TOL)


def test_replay_async_leaves_the_model_holding_the_final_parameters_and_records_a_curve():
    """replay_async loads the final parameters into the model and evaluates every `every`."""
    model = make_model()
    data = make_batches([0, 1], 3)
    probe = copy.deepcopy(model)
    run = replay_async(probe, round_robin([0, 1], 3), LR, batch_fn_of(data), F.mse_loss,
                       evaluate=lambda m: float(m[0].bias.detach().sum()), every=2)
    assert torch.equal(flat_parameters(probe), run.parameters)
    assert [k for k, _ in run.curve] == [0, 2, 4, 6]
    assert run.curve[0][1] == float(model[0].bias.detach().sum())
    assert run.curve[-1][1] == float(probe[0].bias.detach().sum())


# -- schedules on a virtual clock --------------------------------------------------------------


def test_equal_durations_give_round_robin():
    """arrival_schedule with equal durations is round_robin, bounded or not."""
    for bound in (None, 0, 1):
        s = arrival_schedule([2.0, 2.0, 2.0], 4, bound=bound)
        assert s.order == round_robin([0, 1, 2], 4)
        assert s.staleness == staleness_of(s.order)
        assert s.waited == [0.0, 0.0, 0.0]
        assert s.makespan == 8.0
    s = arrival_schedule([1.0, 1.0], 2, workers=[5, 9])
    assert s.order == [5, 9, 5, 9]


def test_unbounded_schedule_never_waits_and_each_worker_runs_at_its_pace():
    """bound=None: zero waiting; worker i's k-th update is applied at time k * d_i."""
    durations = [1.0, 1.5, 2.5]
    s = arrival_schedule(durations, 6)
    assert s.waited == [0.0, 0.0, 0.0]
    for i, d in enumerate(durations):
        assert [t for t, w in zip(s.times, s.order) if w == i] == [k * d for k in range(1, 7)]
    assert s.times == sorted(s.times)
    assert s.makespan == 15.0
    assert s.staleness == staleness_of(s.order)


def ssp_max_spread(order, W):
    """The largest difference of completed counts seen at any applied update."""
    done, spread = [0] * W, 0
    for w in order:
        done[w] += 1
        spread = max(spread, max(done) - min(done))
    return spread


@pytest.mark.parametrize("bound", [0, 1, 2, 3])
def test_bounded_staleness_keeps_every_worker_within_the_bound(bound):
    """SSP: at every applied update, the workers' completed counts differ by <= bound + 1."""
    durations, steps = [1.0, 1.5, 4.0], 8
    s = arrival_schedule(durations, steps, bound=bound)
    assert sorted(s.order) == sorted(list(range(3)) * steps)
    assert s.staleness == staleness_of(s.order)
    assert ssp_max_spread(s.order, 3) <= bound + 1
    # without a bound the fast worker runs further ahead: the bound did something
    free = arrival_schedule(durations, steps)
    assert ssp_max_spread(free.order, 3) > bound + 1


def test_waiting_grows_as_the_bound_shrinks():
    """Total SSP waiting shrinks as the bound grows (None: 0); bound=0's makespan >= None's."""
    durations, steps = [1.0, 1.5, 4.0], 8
    bounds = [0, 1, 2, 3, None]
    waits = [sum(arrival_schedule(durations, steps, bound=b).waited) for b in bounds]
    assert waits[-1] == 0.0
    assert all(a >= b for a, b in zip(waits, waits[1:])), waits
    assert waits[0] > waits[2] > 0
    lock = arrival_schedule(durations, steps, bound=0)
    free = arrival_schedule(durations, steps)
    assert lock.makespan >= free.makespan
    # the slowest worker is always the one behind, so it never waits: fixed durations keep the
    # makespan at steps * max(durations) whatever the bound
    assert lock.makespan == free.makespan == 32.0


def test_arrival_schedule_refuses_bad_durations():
    """arrival_schedule raises ValueError for non-positive durations or a wrong worker count."""
    with pytest.raises(ValueError):
        arrival_schedule([1.0, 0.0], 2)
    with pytest.raises(ValueError):
        arrival_schedule([1.0, 2.0], 2, workers=[1, 2, 3])


def test_step_times_with_backups_shapes_and_floor():
    """step_times_with_backups: one time per step, >= mean, >= slowdown*mean if all straggle."""
    t = step_times_with_backups(4, 2, 30, mean=2.0, seed=3)
    assert t.shape == (30,) and t.dtype == F64
    assert (t >= 2.0).all()
    assert torch.equal(t, step_times_with_backups(4, 2, 30, mean=2.0, seed=3))
    slow = step_times_with_backups(4, 0, 30, mean=2.0, straggler_chance=1.0, slowdown=4.0)
    assert (slow >= 8.0).all()
    never = step_times_with_backups(4, 0, 30, mean=2.0, straggler_chance=0.0)
    assert (never < 8.0).all() and (never >= 2.0).all()
    # more backups: on average, faster steps
    means = [float(step_times_with_backups(8, b, 400, seed=0).mean()) for b in (0, 2, 4)]
    assert means[0] > means[1] > means[2]


@pytest.mark.parametrize("seed", [0, 1])
def test_more_backups_never_make_a_step_slower(seed):
    """Same seed, more backups: every step time is <= (the W-th fastest of a superset)."""
    times = [step_times_with_backups(4, b, 50, seed=seed) for b in range(4)]
    for fewer, more in zip(times, times[1:]):
        assert (more <= fewer).all()


# -- model averaging ---------------------------------------------------------------------------


def local_sgd_rank(comm, model, workers, steps, every, batch_fn, weights=None):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    w = workers[comm.rank]
    losses = local_sgd(comm, model, opt, lambda step: batch_fn(w, step), F.mse_loss, steps,
                       every, weight=1.0 if weights is None else weights[comm.rank])
    return flat_parameters(model), losses


def test_local_sgd_every_step_is_synchronous_sgd():
    """local_sgd every=1 is synchronous SGD (every=3 is not); all ranks end identical."""
    steps, workers = 4, [0, 1, 2]
    model = make_model()
    batch_fn = batch_fn_of(make_batches(workers, steps))
    want = sgd_on_mean_gradient(model, workers, steps, LR, batch_fn)
    dp = SimulatedWorld(3).run(dp_rank, model, workers, steps, batch_fn)

    every1 = SimulatedWorld(3).run(local_sgd_rank, model, workers, steps, 1, batch_fn)
    for params, losses in every1:
        torch.testing.assert_close(params, want, rtol=0, atol=TOL)
        torch.testing.assert_close(params, dp[0], rtol=0, atol=TOL)
        assert torch.equal(params, every1[0][0])
        assert len(losses) == steps

    every3 = SimulatedWorld(3).run(local_sgd_rank, model, workers, steps, 3, batch_fn)
    for params, _ in every3:
        assert torch.equal(params, every3[0][0])
    assert not torch.allclose(every3[0][0], want, rtol=0, atol=1e-6)


def test_local_sgd_refuses_every_below_one():
    """local_sgd raises ValueError for every < 1."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(ValueError, match="every"):
        local_sgd(None, model, opt, lambda s: None, F.mse_loss, 2, 0)


def average_rank(comm, models, weights):
    model = copy.deepcopy(models[comm.rank])
    if weights is None:
        average_parameters(comm, model)
    else:
        average_parameters(comm, model, weights[comm.rank])
    return flat_parameters(model)


@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 5.0]])
def test_average_parameters_is_the_weighted_mean(weights):
    """average_parameters replaces every rank's parameters by the (weighted) mean."""
    models = [make_model(seed=s) for s in range(3)]
    flats = torch.stack([flat_parameters(m) for m in models])
    w = torch.tensor(weights or [1.0, 1.0, 1.0], dtype=F64)
    want = (w[:, None] * flats).sum(0) / w.sum()
    got = SimulatedWorld(3).run(average_rank, models, weights)
    for params in got:
        torch.testing.assert_close(params, want, rtol=0, atol=TOL)
        assert torch.equal(params, got[0])
    if weights is not None:
        assert not torch.allclose(want, flats.mean(0))


def test_sum_of_deviations_is_zero():
    """sum_of_deviations of three 2x2 replicas is zero; their mean is [[5,6],[7,8]]."""
    replicas = [torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[5., 6.], [7., 8.]]),
                torch.tensor([[9., 10.], [11., 12.]])]
    assert torch.equal(sum_of_deviations(replicas), torch.zeros(2, 2))
    assert torch.equal(torch.stack(replicas).mean(0), torch.tensor([[5., 6.], [7., 8.]]))


# -- gossip ------------------------------------------------------------------------------------


def initial_vectors(n: int, size: int = 3, seed: int = 7) -> list[torch.Tensor]:
    """Rank r: cos(2 pi r / n + phase) per entry plus noise: a component along the ring's
    slowest eigenvector, and along the others."""
    g = torch.Generator().manual_seed(seed)
    phases = torch.rand(size, generator=g, dtype=F64) * 2 * math.pi
    return [torch.cos(2 * math.pi * r / n + phases) + 0.1 * torch.randn(size, generator=g,
                                                                           dtype=F64)
            for r in range(n)]


def gossip_rank(comm, start, steps):
    x = start[comm.rank].clone()
    history = [x.clone()]
    for _ in range(steps):
        out = gossip_step(comm, x)
        assert out is x
        history.append(x.clone())
    return history


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_gossip_step_is_the_mixing_matrix_and_keeps_the_mean(n):
    """gossip_step is X <- W X, keeps the mean, and sends 2 messages a step to the neighbours."""
    steps = 5
    start = initial_vectors(n)
    world = SimulatedWorld(n)
    histories = world.run(gossip_rank, start, steps)
    mixing = ring_mixing_matrix(n)
    assert torch.allclose(mixing.sum(0), torch.ones(n, dtype=F64))
    assert torch.allclose(mixing.sum(1), torch.ones(n, dtype=F64))
    mean = torch.stack(start).mean(0)
    X = torch.stack(start)
    for t in range(1, steps + 1):
        X = mixing @ X
        got = torch.stack([h[t] for h in histories])
        torch.testing.assert_close(got, X, rtol=0, atol=TOL)
        torch.testing.assert_close(got.mean(0), mean, rtol=0, atol=TOL)
    for r in range(n):
        sends = [e for e in world.trace.events if e.rank == r and e.kind == "send"]
        assert len(sends) == 2 * steps
        assert all(e.nbytes == 3 * 8 for e in sends)
        left, right = ring_neighbours(r, n)
        if n == 2:
            assert [e.peer for e in sends] == [1 - r] * (2 * steps)
        else:
            assert sorted(e.peer for e in sends) == sorted([left, right] * steps)
        assert world.trace.summary()[r].recv_messages == 2 * steps


def test_gossip_on_one_rank_does_nothing():
    """gossip_step on a world of 1 returns the tensor unchanged and sends nothing."""
    world = SimulatedWorld(1)
    x = torch.tensor([1.0, 2.0], dtype=F64)
    world.run(lambda comm: gossip_step(comm, x))
    assert torch.equal(x, torch.tensor([1.0, 2.0], dtype=F64))
    assert world.trace.summary() == {}


def test_second_eigenvalue_matches_the_closed_form():
    """second_eigenvalue(ring_mixing_matrix(n)) == ring_second_eigenvalue(n) for n = 1..10."""
    for n in range(1, 11):
        assert second_eigenvalue(ring_mixing_matrix(n)) == pytest.approx(
            ring_second_eigenvalue(n), abs=1e-12)
    assert ring_second_eigenvalue(3) == pytest.approx(0.0, abs=1e-15)
    assert ring_second_eigenvalue(2) == pytest.approx(1 / 3)
    assert ring_second_eigenvalue(8) == pytest.approx((1 + 2 * math.cos(math.pi / 4)) / 3)


@pytest.mark.parametrize("n, t0, t1", [(3, 0, 1), (5, 10, 30), (8, 10, 40)])
def test_gossip_contracts_by_the_second_eigenvalue(n, t0, t1):
    """Gossip's consensus error contracts per step by |lambda_2| of the ring (within 1e-3)."""
    histories = SimulatedWorld(n).run(gossip_rank, initial_vectors(n), t1)
    errors = [consensus_error([h[t] for h in histories]) for t in range(t1 + 1)]
    assert errors[0] > 0.5
    rate = (errors[t1] / errors[t0]) ** (1 / (t1 - t0))
    assert rate == pytest.approx(second_eigenvalue(ring_mixing_matrix(n)), abs=1e-3)
    assert rate == pytest.approx(ring_second_eigenvalue(n), abs=1e-3)
    assert all(b < a for a, b in zip(errors[:t1], errors[1:t1]))


def dpsgd_rank(comm, models, steps, batch_fn):
    model = copy.deepcopy(models[comm.rank])
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = batch_fn(comm.rank, step)
        F.mse_loss(model(x), y).backward()
        dpsgd_step(comm, model, LR)
    return flat_parameters(model)


def test_dpsgd_on_one_rank_is_sgd():
    """dpsgd_step on a world of 1 is plain SGD."""
    steps = 4
    model = make_model()
    batch_fn = batch_fn_of(make_batches([0], steps))
    got = SimulatedWorld(1).run(dpsgd_rank, [model], steps, batch_fn)[0]
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch_fn(0, step)
        F.mse_loss(ref(x), y).backward()
        opt.step()
    torch.testing.assert_close(got, flat_parameters(ref), rtol=0, atol=TOL)


def test_dpsgd_mixes_then_steps_with_the_gradient_before_mixing():
    """dpsgd_step on 4 ranks: x_r <- sum_s W_rs x_s - lr * g_r(x_r)."""
    n = 4
    models = [make_model(seed=s) for s in range(n)]
    batch_fn = batch_fn_of(make_batches(range(n), 1))
    got = torch.stack(SimulatedWorld(n).run(dpsgd_rank, models, 1, batch_fn))
    X = torch.stack([flat_parameters(m) for m in models])
    G = torch.stack([gradient_at(copy.deepcopy(m), flat_parameters(m), batch_fn(r, 0))
                     for r, m in enumerate(models)])
    torch.testing.assert_close(got, ring_mixing_matrix(n) @ X - LR * G, rtol=0, atol=TOL)


# -- top-k compression -------------------------------------------------------------------------


def test_topk_k_rounds_and_keeps_at_least_one():
    """TopK.k is max(1, round(ratio * numel)); compress returns k entries of largest |value|."""
    assert TopK(0.01).k(1000) == 10
    assert TopK(0.01).k(10) == 1
    assert TopK(0.04).k(10) == 1
    assert TopK(0.06).k(10) == 1
    assert TopK(0.16).k(10) == 2
    assert TopK(0.1).k(30) == 3
    assert TopK(0.7).k(10) == 7
    assert TopK(1.0).k(7) == 7
    grad = torch.tensor([0.1, -5.0, 0.3, 4.0, -0.2, 0.05, 3.0, 0.0, 0.01, -0.4], dtype=F64)
    values, indices = TopK(0.3).compress(grad)
    assert values.numel() == indices.numel() == 3 and indices.dtype == torch.int64
    assert sorted(indices.tolist()) == [1, 3, 6]
    assert torch.equal(values, grad[indices])


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_topk_refuses_a_ratio_outside_0_1(ratio):
    """TopK raises ValueError for a ratio outside (0, 1]."""
    with pytest.raises(ValueError, match="ratio"):
        TopK(ratio)


def test_error_feedback_loses_nothing():
    """Error feedback: sent + residual == grad + old residual bitwise; nothing is lost overall."""
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(4, 5, generator=g, dtype=F64) for _ in range(12)]
    topk = TopK(0.15)
    previous = torch.zeros(20, dtype=F64)
    total_sent = torch.zeros(20, dtype=F64)
    for grad in grads:
        values, indices = topk.compress(grad)
        assert values.numel() == 3
        sent = TopK.decompress(values, indices, grad)
        assert sent.shape == grad.shape
        assert topk.residual is not None
        assert torch.equal(sent.reshape(-1) + topk.residual, grad.reshape(-1) + previous)
        assert torch.equal(topk.residual[indices], torch.zeros(3, dtype=F64))
        previous = topk.residual.clone()
        total_sent += sent.reshape(-1)
    torch.testing.assert_close(total_sent + topk.residual, torch.stack(grads).sum(0).reshape(-1),
                               rtol=0, atol=TOL)


def test_without_error_feedback_small_entries_are_never_sent():
    """Without error feedback small entries are never sent and no residual is kept."""
    grad = torch.tensor([10.0, -9.0, 0.5, 0.25, -0.125, 0.3], dtype=F64)
    plain, fed = TopK(2 / 6, error_feedback=False), TopK(2 / 6)
    sent_plain, sent_fed = torch.zeros(6, dtype=F64), torch.zeros(6, dtype=F64)
    for _ in range(100):
        sent_plain += TopK.decompress(*plain.compress(grad), grad)
        sent_fed += TopK.decompress(*fed.compress(grad), grad)
        assert plain.residual is None
    assert torch.equal(sent_plain[2:], torch.zeros(4, dtype=F64))
    assert torch.equal(sent_plain[:2], 100 * grad[:2])
    assert (sent_fed[2:] != 0).all()
    torch.testing.assert_close(sent_fed + fed.residual, 100 * grad, rtol=0, atol=TOL)


def test_ratio_one_sends_everything():
    """TopK(1.0) sends every entry and leaves a zero residual."""
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=F64)
    topk = TopK(1.0)
    values, indices = topk.compress(grad)
    assert sorted(indices.tolist()) == list(range(12))
    assert torch.equal(TopK.decompress(values, indices, grad), grad)
    assert torch.equal(topk.residual, torch.zeros(12, dtype=F64))


def sparse_rank(comm, grads, ratio, steps):
    topk = TopK(ratio)
    return [sparse_all_reduce(comm, topk, grads[comm.rank][t]) for t in range(steps)]


def test_sparse_all_reduce_with_ratio_one_is_the_dense_average():
    """sparse_all_reduce on 3 ranks with ratio 1 equals the mean of the gradients."""
    g = torch.Generator().manual_seed(4)
    grads = [[torch.randn(2, 7, generator=g, dtype=F64) for _ in range(2)] for _ in range(3)]
    out = SimulatedWorld(3).run(sparse_rank, grads, 1.0, 2)
    for t in range(2):
        want = torch.stack([grads[r][t] for r in range(3)]).mean(0)
        for r in range(3):
            assert out[r][t].shape == (2, 7)
            torch.testing.assert_close(out[r][t], want, rtol=0, atol=TOL)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sparse_all_reduce_sends_k_values_and_int64_indices(dtype):
    """sparse_all_reduce sends (N-1)*k*(itemsize + 8) bytes per rank and averages the top-k."""
    N, numel, ratio = 3, 50, 0.1
    k = TopK(ratio).k(numel)
    assert k == 5
    g = torch.Generator().manual_seed(5)
    grads = [[torch.randn(numel, generator=g, dtype=F64).to(dtype)] for _ in range(N)]
    world = SimulatedWorld(N)
    out = world.run(sparse_rank, grads, ratio, 1)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    for r, t in world.trace.summary().items():
        assert t.sent_bytes == (N - 1) * k * (itemsize + 8)
        assert t.recv_bytes == (N - 1) * k * (itemsize + 8)
        assert t.sent_messages == 2 * (N - 1)
    want = torch.zeros(numel, dtype=dtype)
    for r in range(N):
        v, i = TopK(ratio).compress(grads[r][0])
        want += TopK.decompress(v, i, grads[r][0])
    want /= N
    for r in range(N):
        assert out[r][0].dtype == dtype
        torch.testing.assert_close(out[r][0], want, rtol=0, atol=1e-6)


# -- cost model --------------------------------------------------------------------------------


NET = AlphaBeta(alpha=1e-3, beta=1e6)


def test_ps_step_time_is_2w_messages_of_a_shard():
    """ps_step_time = 2 W (alpha + M / (s beta)); s servers divide the bytes term by s."""
    assert ps_step_time(4e6, 4, 1, NET) == pytest.approx(2 * 4 * (1e-3 + 4.0))  # 32.008
    assert ps_step_time(4e6, 4, 1, NET) == pytest.approx(32.008)
    assert ps_step_time(4e6, 4, 2, NET) == pytest.approx(16.008)
    assert ps_step_time(4e6, 4, 4, NET) == pytest.approx(8.008)
    for s in (1, 2, 4, 8):
        bytes_term = ps_step_time(8e6, 3, s, NET) - 2 * 3 * NET.alpha
        assert bytes_term == pytest.approx((ps_step_time(8e6, 3, 1, NET) - 6e-3) / s)


def test_ring_step_time_is_2_n_minus_1_messages_of_m_over_n():
    """ring_step_time = 2 (N-1)(alpha + M / (N beta)); 0 on one rank."""
    assert ring_step_time(4e6, 4, NET) == pytest.approx(2 * 3 * (1e-3 + 1.0))  # 6.006
    assert ring_step_time(4e6, 4, NET) == pytest.approx(6.006)
    assert ring_step_time(1e6, 2, NET) == pytest.approx(2 * (1e-3 + 0.5))
    assert ring_step_time(4e6, 1, NET) == 0.0
    assert ring_step_time(4e6, 1) == 0.0
    # the ring tends to 2 M / beta, the server's link grows with W
    assert ring_step_time(1e9, 1000, AlphaBeta(alpha=0.0, beta=1e9)) == pytest.approx(1.998)
    assert ps_step_time(1e9, 1000, 1, AlphaBeta(alpha=0.0, beta=1e9)) == pytest.approx(2000.0)


def test_link_byte_formulas():
    """ps_link_bytes and ring_link_bytes on hand-computed numbers."""
    assert ps_link_bytes(1000, 4, 1) == {"server": 8000, "worker": 2000}
    assert ps_link_bytes(1000, 4, 2) == {"server": 4000, "worker": 2000}
    assert ring_link_bytes(1000, 4) == pytest.approx(3000)
    assert ring_link_bytes(1000, 1) == 0


def ring_rank(comm, numel):
    flat = torch.full((numel,), float(comm.rank), dtype=F64)
    ring(comm, flat)
    return flat


def test_ring_link_bytes_match_a_traced_ring_all_reduce():
    """link_bytes of a traced ring all-reduce on 4 ranks equals ring_link_bytes per rank."""
    world = SimulatedWorld(4)
    out = world.run(ring_rank, 16)
    assert all(torch.equal(o, torch.full((16,), 6.0, dtype=F64)) for o in out)
    assert link_bytes(world.trace) == {r: ring_link_bytes(16 * 8, 4) for r in range(4)}
