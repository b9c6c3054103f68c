"""The all-reduce tuner: its choices given a model, fitting a model to timings, calibration on
a simulated world (every rank builds the same model), and TorchCommunicator.all_reduce on real
gloo ranks with every algorithm, the tuner's choice and the ways to force one."""

from __future__ import annotations

import pytest
import torch

from lib_dist.cluster import Cluster
from lib_dist.comm import AlphaBeta, SimulatedWorld
from lib_dist.comm.algorithms import ALGORITHMS, RING
from lib_dist.comm.fast.tuner import (
    NATIVE, SHARED_MEMORY, Fit, TunerModel, calibrate, fit_line, native_only,
)
from lib_dist.errors import RankFailure

pytestmark = pytest.mark.timeout(120)

NET = AlphaBeta(alpha=1e-4, beta=1e9)
KIB, MIB = 1 << 10, 1 << 20


def model(world_size: int = 4, margin: float = 0.75, **fits: Fit) -> TunerModel:
    return TunerModel(world_size, NET, fits, margin)


# -- choices given a model ------------------------------------------------------------------


def test_predict_is_the_alpha_beta_cost_plus_the_fit():
    m = model(ring=Fit(0.0, 1.0), gather_broadcast=Fit(2e-3, 0.5))
    for nbytes in (1, KIB, 64 * MIB):
        assert m.predict("ring", nbytes) == pytest.approx(RING.cost(4, nbytes, NET))
        assert m.predict("gather_broadcast", nbytes) == pytest.approx(
            2e-3 + 6 * NET.alpha + 6 * nbytes / (0.5 * NET.beta))


def test_small_messages_go_to_few_steps_large_ones_to_the_ring():
    """Pure alpha-beta (no overheads): gather-broadcast takes 2(N-1) steps of n bytes, the
    ring 2(N-1) steps of n/N; equal latency, so the ring wins from the first byte on N > 1...
    unless the ring pays a fixed overhead, as Python's messages do. Then the crossover is
    where overhead = 2(N-1) n (1 - 1/N) / beta."""
    m = model(ring=Fit(3e-3, 1.0), gather_broadcast=Fit(0.0, 1.0))
    crossover = 3e-3 * NET.beta / (6 * (1 - 1 / 4))
    assert m.choose(int(crossover * 0.9)) == "gather_broadcast"
    assert m.choose(int(crossover * 1.1)) == "ring"


def test_latency_and_bandwidth_regimes_with_many_ranks():
    m = model(64, ring=Fit(0.0, 1.0), recursive_doubling=Fit(0.0, 1.0),
              halving_doubling=Fit(0.0, 1.0))
    assert m.choose(8) == "recursive_doubling"        # 6 steps, against 126 for the ring
    # as few bytes as the ring, in 12 steps: on an ideal network the ring never wins
    assert m.choose(64 * MIB) == "halving_doubling"
    assert m.predict("ring", 64 * MIB) < m.predict("recursive_doubling", 64 * MIB)


def test_native_is_kept_unless_clearly_beaten():
    fits = dict(native=Fit(1e-3, 1.0), gather_broadcast=Fit(0.0, 1.0))
    nbytes = 1000
    ratio = (model(**fits).predict("gather_broadcast", nbytes)
             / model(**fits).predict(NATIVE, nbytes))
    assert model(margin=ratio * 1.01, **fits).choose(nbytes) == "gather_broadcast"
    assert model(margin=ratio * 0.99, **fits).choose(nbytes) == NATIVE


def test_table_lists_every_candidate_and_the_choice():
    m = model(native=Fit(1e-3, 1.0), ring=Fit(0.0, 2.0))
    rows = m.table([KIB, MIB])
    assert [r["bytes"] for r in rows] == [KIB, MIB]
    assert all(set(r) == {"bytes", "choice", "native", "ring"} for r in rows)
    assert all(r["choice"] == m.choose(r["bytes"]) for r in rows)


def test_one_rank_or_nccl_runs_native():
    assert native_only(8).choose(123) == NATIVE
    assert model(1, ring=Fit(1.0, 1.0)).predict("ring", MIB) == 0.0


# -- fitting --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*ALGORITHMS, NATIVE, SHARED_MEMORY])
def test_fit_recovers_overhead_and_efficiency_from_exact_timings(name):
    truth = model(5, **{name: Fit(2.5e-3, 0.4)})
    sizes = (4 * KIB, 512 * KIB, 16 * MIB)
    fit = fit_line(name, 5, NET, {s: truth.predict(name, s) for s in sizes})
    assert fit.overhead == pytest.approx(2.5e-3)
    assert fit.efficiency == pytest.approx(0.4)


def test_fit_keeps_a_noisy_efficiency_plausible():
    # the large size measured faster than the small one: no slope, not infinite bandwidth
    fit = fit_line("ring", 4, NET, {KIB: 5e-3, MIB: 4e-3})
    assert 0.02 <= fit.efficiency <= 8


# -- calibration on a simulated world -------------------------------------------------------


def calibrated(comm, sizes):
    def run(name, flat):
        if name == NATIVE:
            comm.all_reduce(flat)  # the simulated world's own, simple all-reduce
        else:
            ALGORITHMS[name].run(comm, flat)

    def slowest(t):
        return torch.stack(comm.all_gather(t)).max(0).values

    return calibrate(comm, run, slowest, sizes=sizes)


@pytest.mark.parametrize("world_size", [2, 3])
def test_calibration_gives_every_rank_the_same_model(world_size):
    sizes = (1 * KIB, 16 * KIB, 256 * KIB)
    models = SimulatedWorld(world_size, timeout=60).run(calibrated, sizes)
    first = models[0]
    assert all(m == first for m in models)
    assert set(first.fits) == {*ALGORITHMS, NATIVE}
    assert first.network.alpha > 0 and first.network.beta > 0
    assert all(set(first.timings[name]) == set(sizes) for name in first.fits)
    assert all(0.02 <= f.efficiency <= 8 for f in first.fits.values())
    assert {first.choose(s) for s in (KIB, 64 * MIB)} <= set(first.fits)


# -- TorchCommunicator.all_reduce on real gloo ranks ----------------------------------------


def every_algorithm(comm, lengths):
    import os

    out = {}
    for name in ("auto", NATIVE, *ALGORITHMS, SHARED_MEMORY):
        for n in lengths:
            x = torch.arange(n, dtype=torch.float64) + comm.rank
            out[(name, n)] = comm.all_reduce(x, algorithm=name)
    t = (torch.arange(12.0).reshape(3, 4) * (comm.rank + 1)).t()  # not contiguous
    out["transposed avg"] = comm.all_reduce(t, "avg", algorithm="ring")
    comm.all_reduce_algorithm = "gather_broadcast"
    out["forced"] = comm.all_reduce(torch.ones(3, dtype=torch.int64))
    try:
        comm.all_reduce(torch.ones(2), algorithm="fastest")
    except ValueError as e:
        out["bad name"] = str(e)
    comm.all_reduce_algorithm = os.environ.get("LIB_DIST_ALL_REDUCE", "auto")
    kinds = [e.kind for e in comm.trace.events]
    return out, comm.tuner, kinds


@pytest.mark.cluster
def test_torch_all_reduce_with_every_algorithm_on_three_gloo_ranks():
    world, lengths = 3, [0, 1, 2, 7, 1000]
    with Cluster(world, timeout=60) as cluster:
        results = cluster.run(every_algorithm, lengths, timeout=60)
    models = [tuner for _, tuner, _ in results]
    assert models[0] is not None and all(m == models[0] for m in models)
    # the engines share this host: shared memory is one of the tuner's candidates
    assert set(models[0].fits) == {NATIVE, *ALGORITHMS, SHARED_MEMORY}
    for rank, (out, _, kinds) in enumerate(results):
        for name in ("auto", NATIVE, *ALGORITHMS, SHARED_MEMORY):
            for n in lengths:
                want = sum(torch.arange(n, dtype=torch.float64) + q for q in range(world))
                assert torch.equal(out[(name, n)], want), (name, n, rank)
        want = (torch.arange(12.0).reshape(3, 4) * 2).t()
        assert torch.allclose(out["transposed avg"], want)
        assert torch.equal(out["forced"], torch.full((3,), world, dtype=torch.int64))
        assert "fastest" in out["bad name"] and "ring" in out["bad name"]
        # one event per all-reduce: the messages inside are not the user's traffic
        assert set(kinds) == {"all_reduce"}


def test_the_simulated_world_keeps_its_simple_all_reduce():
    def fn(comm):
        return comm.all_reduce(torch.ones(4))

    world = SimulatedWorld(3)
    assert all(torch.equal(x, torch.full((4,), 3.0)) for x in world.run(fn))
    assert world.trace.summary()[0].recv_messages == 2  # gathered at rank 0
    # no tuner there: lib_dist's algorithms are chosen by name only ("auto" is the tuner's)
    with pytest.raises(RankFailure, match="unknown all-reduce algorithm 'auto'"):
        SimulatedWorld(2).run(lambda comm: comm.all_reduce(torch.ones(1), algorithm="auto"))
