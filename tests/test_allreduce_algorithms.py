"""lib_dist.comm.algorithms on the simulated world: every algorithm sums exactly at world sizes
1..8, for any length and dtype, with the same bits on every rank; each sends the messages
its docstring promises; and its alpha-beta cost is the modeled time of its traced run."""

from __future__ import annotations

import pytest
import torch

import algorithms as alg
from algorithms import assert_same

from lib_dist.comm import AlphaBeta, SimulatedWorld
from lib_dist.comm.algorithms import ALGORITHMS, ring

pytestmark = pytest.mark.timeout(120)

NAMES = list(ALGORITHMS)
MODEL = AlphaBeta(alpha=2.0**-10, beta=2.0**20)  # powers of two: modeled times are exact


def reduce_with(comm, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    x = alg.data(comm.rank, n, dtype)
    ALGORITHMS[name].run(comm, x)
    return x


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("world_size", range(1, 9))
def test_sums_exactly_for_any_length(name, world_size):
    # empty, shorter than the world, not divisible by it, and a multiple of it
    for n in sorted({0, 1, 3, world_size + 1, 4 * world_size, 37}):
        want = sum(alg.data(q, n) for q in range(world_size)) if n else torch.empty(0)
        results = SimulatedWorld(world_size).run(reduce_with, name, n, torch.float32)
        for r, got in enumerate(results):
            assert_same(got, want, f"{name}, {world_size} ranks, n={n}, rank {r}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_any_dtype(name, dtype):
    want = sum(alg.data(q, 11, dtype) for q in range(5))
    for r, got in enumerate(SimulatedWorld(5).run(reduce_with, name, 11, dtype)):
        assert_same(got, want, f"{name} {dtype} rank {r}")


@pytest.mark.parametrize("name", NAMES)
def test_every_rank_ends_with_the_same_bits(name):
    """Random floats, whose sums depend on the order of addition: ranks still agree."""
    def fn(comm):
        x = torch.randn(101, generator=torch.Generator().manual_seed(comm.rank))
        ALGORITHMS[name].run(comm, x)
        return x

    results = SimulatedWorld(6).run(fn)
    inputs = [torch.randn(101, generator=torch.Generator().manual_seed(q)) for q in range(6)]
    assert all(torch.equal(x, results[0]) for x in results)
    # 5 additions in another order, each within eps of a partial sum <= the sum of |inputs|
    error = (results[0] - sum(inputs)).abs()
    assert (error <= 2 * 5 * torch.finfo(torch.float32).eps * sum(x.abs() for x in inputs)).all()


@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 8])
def test_ring_sends_2_n_minus_1_chunks_to_the_right(world_size):
    n = 12 * world_size
    world = SimulatedWorld(world_size)
    world.run(reduce_with, "ring", n, torch.float32)
    for r, t in world.trace.summary().items():
        assert t.sent_messages == t.recv_messages == 2 * (world_size - 1)
        assert t.sent_bytes == 2 * (world_size - 1) * (n // world_size) * 4
    assert {(m.src, m.dst) for m in world.trace.messages()} == {
        (r, (r + 1) % world_size) for r in range(world_size)}


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_recursive_algorithms_take_log_n_rounds(world_size):
    n, log = 8 * world_size, world_size.bit_length() - 1
    counts = {"recursive_doubling": (log, log * n * 4),
              "halving_doubling": (2 * log, 2 * (world_size - 1) * (n // world_size) * 4)}
    for name, (messages, nbytes) in counts.items():
        world = SimulatedWorld(world_size)
        world.run(reduce_with, name, n, torch.float32)
        for r, t in world.trace.summary().items():
            assert (t.sent_messages, t.sent_bytes) == (messages, nbytes), (name, r)


def test_gather_broadcast_goes_through_rank_0():
    world_size, n = 5, 10
    world = SimulatedWorld(world_size)
    world.run(reduce_with, "gather_broadcast", n, torch.float32)
    summary = world.trace.summary()
    assert summary[0].recv_bytes == summary[0].sent_bytes == (world_size - 1) * n * 4
    assert all(summary[r].sent_messages == summary[r].recv_messages == 1
               for r in range(1, world_size))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_cost_is_the_modeled_time_of_the_traced_run(name, world_size):
    nbytes = 4 * 16 * 105  # splits evenly into 1..8 chunks and every halving
    world = SimulatedWorld(world_size)
    world.run(reduce_with, name, nbytes // 4, torch.float32)
    assert ALGORITHMS[name].cost(world_size, nbytes, MODEL) == pytest.approx(
        world.trace.modeled_time(MODEL), rel=1e-12)


def test_ring_reports_every_step():
    def fn(comm):
        x = torch.tensor([2.0 ** comm.rank] * comm.world_size)
        seen = []
        ring(comm, x, on_step=lambda step: seen.append((step, x.clone())))
        return seen

    seen = SimulatedWorld(3).run(fn)
    assert [s for s, _ in seen[0]] == [0, 1, 2, 3]
    # after the reduce-scatter (step 1), rank r owns chunk r with every contribution: 7
    for r in range(3):
        assert seen[r][1][1][r].item() == 7.0
        assert torch.equal(seen[r][-1][1], torch.full((3,), 7.0))
