"""SimulatedWorld: point-to-point semantics, the default collectives, the errors it promises
(deadlock, mismatch, failed peer, timeout) and the exactness of its traces."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import torch

import algorithms as alg
from algorithms import assert_same

from lib_dist.comm import (
    CommError, CommTimeout, DeadlockError, MismatchError, PeerFailed, RankTraffic,
    SimulatedWorld, chunk_bounds, wait_all,
)
from lib_dist.errors import RankFailure

pytestmark = pytest.mark.timeout(60)

SIZES = [1, 2, 3, 4, 8]


def run_failing(world: SimulatedWorld, fn, *args) -> RankFailure:
    """Run fn expecting a RankFailure, and return it. (Tests check the kind of each rank's
    error: a DeadlockError, PeerFailed or MismatchError was found at once, where waiting for
    the world's timeout would have given a CommTimeout.)"""
    with pytest.raises(RankFailure) as info:
        world.run(fn, *args)
    return info.value


# -- point to point ---------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", SIZES)
def test_send_recv_pairs(world_size):
    world = SimulatedWorld(world_size)
    results = world.run(alg.send_recv_pairs, 5)
    for r, got in enumerate(results):
        if r % 2:
            assert_same(got, alg.data(r - 1, 5), f"rank {r}")
        elif r + 1 < world_size:
            assert_same(got, alg.data(r, 5), f"rank {r}")
        else:
            assert got is None
    msgs = world.trace.messages()
    assert sorted((m.src, m.dst, m.nbytes) for m in msgs) == [
        (r, r + 1, 20) for r in range(0, world_size - 1, 2)]


def test_blocking_send_waits_for_the_receiver():
    """A send completes only once the receiver takes the message (gloo's rendezvous): rank
    1 posts its receive late, and rank 0's send returns only after that."""
    happened: list[str] = []

    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.ones(3), 1)
            happened.append("send returned")
        else:
            time.sleep(0.3)
            happened.append("recv posted")
            comm.recv(torch.empty(3), 0)

    SimulatedWorld(2).run(fn)
    assert happened == ["recv posted", "send returned"]


def test_isend_completes_when_matched_and_channels_are_fifo():
    def fn(comm):
        if comm.rank == 0:
            handles = [comm.isend(torch.full((2,), float(i)), 1) for i in range(4)]
            assert not handles[0].is_completed()  # nobody has posted a receive yet
            comm.barrier()
            comm.barrier()
            assert all(h.is_completed() for h in handles)
            wait_all(handles)
            return None
        comm.barrier()
        bufs = [torch.empty(2) for _ in range(4)]
        wait_all([comm.irecv(b, 0) for b in bufs])
        comm.barrier()
        return [b[0].item() for b in bufs]

    assert SimulatedWorld(2).run(fn)[1] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("world_size", SIZES + [16])
def test_ring_pass_results_and_exact_trace(world_size):
    n = 6
    world = SimulatedWorld(world_size)
    results = world.run(alg.ring_pass, n)
    everyone = [alg.data(q, n) for q in range(world_size)]
    for r, got in enumerate(results):
        assert_same(got, everyone, f"rank {r}")

    summary = world.trace.summary()
    per_rank = RankTraffic(world_size - 1, (world_size - 1) * n * 4,
                           world_size - 1, (world_size - 1) * n * 4)
    assert {r: summary.get(r, RankTraffic()) for r in range(world_size)} == {
        r: per_rank for r in range(world_size)}
    links = Counter((m.src, m.dst, m.nbytes) for m in world.trace.messages())
    assert links == Counter({(r, (r + 1) % world_size, n * 4): world_size - 1
                             for r in range(world_size)} if world_size > 1 else {})


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_summary_and_messages_agree(world_size):
    def fn(comm):  # an irregular pattern: rank r sends r+1 messages of r+1 floats to rank 0
        if comm.rank:
            wait_all([comm.isend(torch.ones(comm.rank + 1), 0) for _ in range(comm.rank + 1)])
        else:
            for src in range(1, comm.world_size):
                wait_all([comm.irecv(torch.empty(src + 1), src) for _ in range(src + 1)])
        alg.ring_pass(comm, 3)

    world = SimulatedWorld(world_size)
    world.run(fn)
    msgs = world.trace.messages()
    from_msgs: dict[int, list[int]] = {r: [0, 0, 0, 0] for r in range(world_size)}
    for m in msgs:
        from_msgs[m.src][0] += 1
        from_msgs[m.src][1] += m.nbytes
        from_msgs[m.dst][2] += 1
        from_msgs[m.dst][3] += m.nbytes
    assert world.trace.summary() == {r: RankTraffic(*c) for r, c in from_msgs.items()}
    assert all(m.start <= m.end for m in msgs)
    assert world.trace.summary()[1].sent_bytes == 2 * 2 * 4 + (world_size - 1) * 3 * 4


@pytest.mark.parametrize("world_size", SIZES)
def test_barrier_holds_every_rank_until_all_arrive(world_size):
    arrived: list[int] = []

    def fn(comm):
        time.sleep(0.02 * comm.rank)
        arrived.append(comm.rank)
        comm.barrier()
        return len(arrived)  # how many had arrived when this rank left

    world = SimulatedWorld(world_size)
    assert world.run(alg.barrier_twice) == list(range(world_size))
    assert world.run(fn) == [world_size] * world_size
    kinds = Counter((e.rank, e.kind) for e in world.trace.events)
    assert kinds == Counter({(r, "barrier"): 1 for r in range(world_size)})


def test_barrier_with_a_rank_that_returned_fails_at_once():
    def fn(comm):
        if comm.rank != 1:
            comm.barrier()

    err = run_failing(SimulatedWorld(3, timeout=5.0), fn)
    assert set(err.ranks) == {0, 2}
    for r in (0, 2):
        assert isinstance(err.exceptions[r], PeerFailed)
        assert "barrier" in str(err.exceptions[r]) and "rank 1 returned" in str(err.exceptions[r])


# -- collectives ------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", SIZES)
def test_collectives_match_local_computation(world_size):
    n = 5
    # lengths shorter than the world size (1, 3) and not divisible by it (7, 2N+1)
    lengths = sorted({1, 3, 7, 2 * world_size + 1, 4 * world_size})
    results = SimulatedWorld(world_size).run(alg.collectives, n, lengths)
    for r, got in enumerate(results):
        assert_same(got, alg.expected_collectives(world_size, r, n, lengths), f"rank {r}")


@pytest.mark.parametrize("world_size", SIZES)
def test_ring_all_reduce_and_gather_broadcast_sum(world_size):
    for n in (8, 7, 2):  # 2 < 8 leaves empty chunks
        want = torch.stack([alg.data(q, n) for q in range(world_size)]).sum(0)
        for fn in (alg.ring_all_reduce, alg.gather_then_broadcast):
            for r, got in enumerate(SimulatedWorld(world_size).run(fn, n)):
                assert_same(got, want, f"{fn.__name__} n={n} rank {r}")


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_reduce_scatter_chunks_cover_the_tensor(world_size):
    for n in (0, 1, 2, 5, 9):
        bounds = chunk_bounds(n, world_size)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        results = SimulatedWorld(world_size).run(
            lambda comm, m: comm.reduce_scatter(alg.data(comm.rank, m)), n)
        full = sum(alg.data(q, n) for q in range(world_size))
        assert_same(torch.cat(results), full if n else torch.empty(0))


def test_collectives_leave_inputs_they_do_not_own_alone():
    def fn(comm):
        x = alg.data(comm.rank, 6)
        comm.all_gather(x)
        comm.reduce_scatter(x)
        return x

    for r, x in enumerate(SimulatedWorld(3).run(fn)):
        assert_same(x, alg.data(r, 6))


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_both_send_first_is_a_deadlock_reported_at_once(world_size):
    timeout = 5.0
    world = SimulatedWorld(world_size, timeout=timeout)
    err = run_failing(world, alg.both_send_first, 4)
    assert err.still_running == []
    assert err.ranks == [0, 1]
    text = str(err)
    for r in (0, 1):
        assert isinstance(err.exceptions[r], DeadlockError)
        assert f"rank {r}: send to rank {1 - r}" in text
        assert f"rank {r}: waiting in send to rank {1 - r}" in text


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ring_of_blocking_sends_deadlocks_naming_every_rank(world_size):
    def fn(comm):
        comm.send(torch.ones(2), (comm.rank + 1) % comm.world_size)
        comm.recv(torch.empty(2), (comm.rank - 1) % comm.world_size)

    err = run_failing(SimulatedWorld(world_size, timeout=5.0), fn)
    assert err.ranks == list(range(world_size))
    for r in range(world_size):
        assert isinstance(err.exceptions[r], DeadlockError)
        assert f"rank {r}: send to rank {(r + 1) % world_size}" in str(err)


def test_world_is_reusable_after_a_failure():
    world = SimulatedWorld(2, timeout=5.0)
    run_failing(world, alg.both_send_first, 4)
    assert_same(world.run(alg.ring_pass, 3), [[alg.data(0, 3), alg.data(1, 3)]] * 2)
    assert len(world.trace.messages()) == 2


def test_a_rank_left_over_from_a_failed_run_cannot_disturb_the_next_run():
    """Run 1: rank 0 raises, rank 1 outlives it (still_running). Run 2 on the same world
    releases the old rank 1, which then sends and returns; run 2 must not see either."""
    release = threading.Event()

    def first(comm):
        if comm.rank == 0:
            raise ValueError("first run fails")
        release.wait(10)
        comm.send(torch.full((1,), 99.0), 0)  # into run 1, where rank 0 is gone

    def second(comm):
        buf = torch.zeros(1)
        if comm.rank == 0:
            comm.recv(buf, 1)
            return buf.item()
        release.set()
        time.sleep(0.3)  # the old rank 1 sends and fails meanwhile
        comm.send(torch.full((1,), 7.0), 0)
        return None

    world = SimulatedWorld(2, timeout=0.3)
    try:
        with pytest.raises(RankFailure) as info:
            world.run(first)
        assert info.value.still_running == [1]
        world.timeout = 5.0
        assert world.run(second) == [7.0, None]
        assert [(m.src, m.dst) for m in world.trace.messages()] == [(1, 0)]
    finally:
        release.set()


@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_mismatch_raises_on_both_ranks(kind):
    sent = torch.ones(4)
    buf = torch.empty(5) if kind == "shape" else torch.empty(4, dtype=torch.float64)

    def fn(comm):
        if comm.rank == 0:
            comm.send(sent, 1)
        else:
            comm.recv(buf, 0)

    err = run_failing(SimulatedWorld(2, timeout=5.0), fn)
    assert err.ranks == [0, 1]
    want = ["(4,)", "(5,)"] if kind == "shape" else ["float32", "float64"]
    for r in (0, 1):
        e = err.exceptions[r]
        assert isinstance(e, MismatchError)
        for needle in ["rank 0", "rank 1", *want]:
            assert needle in str(e), (needle, str(e))


def test_peer_that_returned_is_named():
    def fn(comm):
        if comm.rank == 1:
            comm.recv(torch.empty(3), 0)

    err = run_failing(SimulatedWorld(2, timeout=5.0), fn)
    assert err.ranks == [1]
    e = err.exceptions[1]
    assert isinstance(e, PeerFailed)
    assert "rank 1: recv from rank 0" in str(e) and "rank 0 returned" in str(e)


def test_peer_that_raised_is_listed_with_its_exception():
    def fn(comm):
        if comm.rank == 0:
            raise ValueError("boom in rank zero")
        comm.recv(torch.empty(3), 0)

    err = run_failing(SimulatedWorld(2, timeout=5.0), fn)
    assert err.ranks == [0]  # the cause; rank 1 only failed to hear from it
    assert err.consequences == [1]
    assert str(err).startswith("rank 0 failed\nrank 1 then failed in communication with it")
    assert isinstance(err.exceptions[0], ValueError)
    assert "ValueError: boom in rank zero" in err.failures[0]
    assert isinstance(err.exceptions[1], PeerFailed)
    assert "PeerFailed" in err.failures[1]
    assert "rank 0 failed (ValueError: boom in rank zero)" in str(err.exceptions[1])
    text = str(err)
    assert "rank 0 failed" in text
    assert "--- rank 0 ---" in text and "--- rank 1 ---" in text


def test_endless_compute_loop_gives_the_waiting_peer_a_timeout():
    timeout = 0.5
    stop = threading.Event()
    looper: list[threading.Thread] = []

    def fn(comm):
        if comm.rank == 0:
            looper.append(threading.current_thread())
            while not stop.is_set():  # "computing" forever; never communicates
                sum(range(1000))
            return
        comm.recv(torch.empty(3), 0)

    world = SimulatedWorld(2, timeout=timeout)
    try:
        with pytest.raises(RankFailure) as info:
            world.run(fn)
    finally:
        stop.set()
        for t in looper:
            t.join(5)
    assert not looper[0].is_alive()
    err = info.value
    assert err.ranks == [1]
    assert err.still_running == [0]  # still looping `timeout` s after rank 1 failed
    assert isinstance(err.exceptions[1], CommTimeout)
    assert "rank 1: recv from rank 0 did not complete within 0.5 s" in str(err.exceptions[1])
    assert "rank 0 had not finished" in str(err)


def test_a_wait_past_its_timeout_is_stretched_by_the_load_seen_then(monkeypatch):
    """A peer slower than `timeout` on a busy machine is waited for: once the timeout runs
    out, the wait is stretched by the load read then (here, as if three times over)."""
    import lib_dist.comm.simulated as simulated

    asked = []

    def thrice(seconds):
        asked.append(seconds)
        return 3 * seconds

    monkeypatch.setattr(simulated, "stretched", thrice)

    def slow_sender(comm):
        if comm.rank == 0:
            time.sleep(0.5)  # past the 0.3 s timeout, within 0.9
            comm.send(torch.ones(2), 1)
            return None
        out = torch.empty(2)
        comm.recv(out, 0)
        return out

    results = SimulatedWorld(2, timeout=0.3).run(slow_sender)
    assert_same(results[1], torch.ones(2))
    assert asked == [0.3]  # the load is read once the timeout ran out, not on every wait

    def never_sends(comm):
        if comm.rank == 0:
            time.sleep(1.5)
            return None
        comm.recv(torch.empty(2), 0)

    err = run_failing(SimulatedWorld(2, timeout=0.3), never_sends)
    assert isinstance(err.exceptions[1], CommTimeout)
    assert "did not complete within 0.3 s (waited 0.9 s:" in str(err.exceptions[1])


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -1, 2.0, None])
def test_world_size_must_be_a_positive_int(size):
    with pytest.raises(ValueError, match="world_size"):
        SimulatedWorld(size)


def _only_rank_0(action):
    def fn(comm):
        if comm.rank == 0:
            action(comm)
    return fn


@pytest.mark.parametrize("action, error, needle", [
    (lambda c: c.send(torch.ones(2), 2), CommError, "peer 2, but ranks are 0..1"),
    (lambda c: c.recv(torch.ones(2), -1), CommError, "peer -1"),
    (lambda c: c.isend(torch.ones(2), 0), CommError, "send to itself"),
    (lambda c: c.irecv(torch.ones(2), 0), CommError, "recv to itself"),
    (lambda c: c.send(torch.ones(3, 2).t(), 1), CommError, "contiguous"),
    (lambda c: c.send([1.0, 2.0], 1), CommError, "needs a torch.Tensor"),
    (lambda c: c.broadcast(torch.ones(2), src=5), CommError, "broadcast names peer 5"),
    (lambda c: c.all_reduce(torch.ones(2), "max"), ValueError, "'sum' or 'avg', got 'max'"),
    (lambda c: c.reduce_scatter(torch.ones(2), "max"), ValueError, "got 'max'"),
    (lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64), "avg"), ValueError, "floating"),
], ids=["peer-too-big", "peer-negative", "isend-self", "irecv-self", "non-contiguous",
        "not-a-tensor", "broadcast-root", "op-max", "reduce-scatter-op", "avg-int"])
def test_bad_input_is_rejected_by_the_calling_rank(action, error, needle):
    err = run_failing(SimulatedWorld(2, timeout=5.0), _only_rank_0(action))
    assert err.ranks == [0]
    assert isinstance(err.exceptions[0], error)
    assert needle in str(err.exceptions[0])
    assert str(err.exceptions[0]).startswith("rank 0") or error is ValueError
