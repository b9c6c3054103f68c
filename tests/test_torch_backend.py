"""TorchCommunicator over real gloo processes: the algorithms of tests/algorithms.py give the
same results and the same point-to-point traces as on the simulated world, the native
collectives agree with local computation, and a deadlock ends in CommTimeout. All of it with
messages through shared memory (the default on one host), through gloo's own sockets, and
with the default on a machine that shared memory is not safe on (an arm64 one, pretended):
the fallback to gloo's sockets, with no shared-memory all-reduce either.

Each world size and transport is one spawned run (torch imports cost seconds per process) executing every
check in turn; the tests below read its results. The deadlock runs last, as a timed-out gloo
group is unusable.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue as queue_module
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

import algorithms as alg
from algorithms import assert_same

from lib_dist.comm import (
    CommError, Event, RankTraffic, SimulatedWorld, TorchCommunicator, Trace,
)
from lib_dist.errors import RankFailure
from lib_dist.patience import stretched

pytestmark = [
    pytest.mark.timeout(180),
]

N = 5
SCATTER_LENGTHS = [1, 3, 7, 8, 9]  # shorter than and not divisible by 2 and 4
DEADLOCK_TIMEOUT = 3.0
CHECKS = [
    ("send_recv", "send_recv_pairs", (N,)),
    ("ring", "ring_pass", (6,)),
    ("ring_all_reduce", "ring_all_reduce", (8,)),
    ("registered_ring", "registered_ring", (9,)),
    ("gather_then_broadcast", "gather_then_broadcast", (N,)),
    ("assorted", "assorted_messages", (3_000_000,)),  # 12 MB: more than a channel holds
    ("blocked", "delivered_while_blocked", (3_000_000,)),
    ("barrier", "barrier_twice", ()),
    ("collectives", "collectives", (N, SCATTER_LENGTHS)),
    ("all_to_all", "all_to_all_cases", ()),
    ("all_to_all_disagreements", "all_to_all_disagreements", ()),
    ("all_to_all_subgroup", "all_to_all_in_subgroup", ()),
]
P2P_CHECKS = [c for c in CHECKS if c[0] not in ("barrier", "collectives", "registered_ring")
              and not c[0].startswith("all_to_all")]


@dataclass
class Outcome:
    """What one spawned run reported: per check, per rank, (status, payload, trace)."""

    world_size: int
    checks: dict[str, dict[int, tuple[str, object, Trace]]] = field(default_factory=dict)
    setup_errors: dict[int, object] = field(default_factory=dict)
    exitcodes: list[int | None] = field(default_factory=list)
    seconds: float = 0.0

    def results(self, name: str) -> list[object]:
        """The check's results by rank; fails the test with the ranks' errors if any."""
        got = self.checks.get(name, {})
        assert not self.setup_errors, f"ranks failed to start: {self.setup_errors}"
        bad = {r: v[1] for r, v in got.items() if v[0] != "ok"}
        assert not bad and sorted(got) == list(range(self.world_size)), (
            f"{name}: ranks reported {sorted(got)}, errors {bad}")
        return [got[r][1] for r in range(self.world_size)]

    def trace(self, name: str) -> Trace:
        self.results(name)
        return Trace.merge([self.checks[name][r][2] for r in range(self.world_size)])


def spawn_run(world_size: int, messages: str, checks: list, timeout: float,
              budget: float = 90.0) -> Outcome:
    """Spawn `world_size` gloo ranks running `checks`; collect their reports; leave no child
    process behind, whatever happens."""
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    reports = ctx.Queue()
    procs = [ctx.Process(target=alg.torch_rank_main, name=f"gloo-rank-{r}", daemon=True,
                         args=(r, world_size, store.port, timeout, checks, reports, messages))
             for r in range(world_size)]
    out = Outcome(world_size)
    start = time.monotonic()
    deadline = start + stretched(budget)  # a busy machine slows the spawns, the imports
    try:
        for p in procs:
            p.start()
        done: set[int] = set()
        while len(done) < world_size:
            try:
                rank, name, status, payload, events = reports.get(
                    timeout=max(deadline - time.monotonic(), 0.1))
            except queue_module.Empty:
                alive = [p.name for p in procs if p.is_alive()]
                pytest.fail(f"no report within {deadline - start:.0f} s ({budget:g} s, "
                            f"stretched by the load); ranks done {sorted(done)}, "
                            f"processes alive {alive}")
            if status == "done":
                done.add(rank)
            elif name == "<setup>":
                out.setup_errors[rank] = pickle.loads(payload)
            else:
                trace = Trace([Event(**e) for e in events])
                out.checks.setdefault(name, {})[rank] = (status, pickle.loads(payload), trace)
        out.seconds = time.monotonic() - start
    finally:
        grace = max(deadline, time.monotonic() + 5.0)  # for exiting cleanly, then killed
        for p in procs:
            if p.pid is not None:
                p.join(max(grace - time.monotonic(), 0.0))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        out.exitcodes = [p.exitcode for p in procs]
        reports.close()
        reports.join_thread()
    return out


_RUNS: dict[tuple[int, str], Outcome] = {}
TRANSPORTS = ("shared_memory", "backend")
FALLBACK = "arm64"  # "auto" where shared memory is ruled out: see algorithms.torch_rank_main


def gloo_world(world_size: int, messages: str) -> Outcome:
    """The spawned run of this world size and transport, made once per session."""
    key = (world_size, messages)
    if key not in _RUNS:
        if world_size == 2:  # both-send-first at the end: the group times out and is done
            checks = CHECKS + [("deadlock", "both_send_first", (4,))]
            _RUNS[key] = spawn_run(world_size, messages, checks, timeout=DEADLOCK_TIMEOUT)
        else:
            _RUNS[key] = spawn_run(world_size, messages, CHECKS, timeout=stretched(30.0))
    return _RUNS[key]


@pytest.fixture(scope="module",
                params=[(n, m) for m in TRANSPORTS for n in (2, 4)] + [(4, FALLBACK)],
                ids=lambda p: f"world{p[0]}-{p[1]}")
def gloo_run(request) -> Outcome:
    return gloo_world(*request.param)


def simulated(world_size: int, fn_name: str, args: tuple) -> tuple[list[object], Trace]:
    world = SimulatedWorld(world_size)
    results = world.run(getattr(alg, fn_name), *args)
    return results, world.trace


# -- same algorithms, same answers, same traffic ----------------------------------------------


@pytest.mark.parametrize("name, fn_name, args", P2P_CHECKS, ids=[c[0] for c in P2P_CHECKS])
def test_point_to_point_matches_the_simulated_world(gloo_run, name, fn_name, args):
    want, sim_trace = simulated(gloo_run.world_size, fn_name, args)
    assert_same(gloo_run.results(name), want, name)
    trace = gloo_run.trace(name)
    assert trace.summary() == sim_trace.summary()
    assert Counter((m.src, m.dst, m.nbytes) for m in trace.messages()) == Counter(
        (m.src, m.dst, m.nbytes) for m in sim_trace.messages())


def test_ring_trace_counts_per_rank(gloo_run):
    ws, n = gloo_run.world_size, 6
    summary = gloo_run.trace("ring").summary()
    assert sorted(summary) == list(range(ws))
    for r in range(ws):
        assert summary[r].sent_messages == summary[r].recv_messages == ws - 1
        assert summary[r].sent_bytes == summary[r].recv_bytes == (ws - 1) * n * 4
        events = gloo_run.checks["ring"][r][2].of_rank(r)
        # seq counts the communicator's completions since it joined: consecutive here
        assert [e.seq - events[0].seq for e in events] == list(range(2 * (ws - 1)))
        assert {e.peer for e in events if e.kind == "send"} == {(r + 1) % ws}
        assert {e.peer for e in events if e.kind == "recv"} == {(r - 1) % ws}


def test_a_students_registered_ring_runs_on_real_ranks(gloo_run):
    """lab03's ring, registered as a student's would be (`lib_dist.registry`), is what
    `TorchCommunicator.all_reduce(..., algorithm="mine")` runs: its traced messages are a
    ring's, 2(N-1) to the right neighbour, then one all_reduce event."""
    ws = gloo_run.world_size
    want = sum(alg.data(r, 9) for r in range(ws))
    assert all(torch.equal(got, want) for got in gloo_run.results("registered_ring"))
    for r in range(ws):
        events = gloo_run.checks["registered_ring"][r][2].of_rank(r)
        assert [e.peer for e in events if e.kind == "send"] == [(r + 1) % ws] * 2 * (ws - 1)
        assert [e.kind for e in events][-1] == "all_reduce"


def test_barrier(gloo_run):
    assert gloo_run.results("barrier") == list(range(gloo_run.world_size))
    kinds = Counter(e.kind for e in gloo_run.trace("barrier").events)
    assert kinds == Counter({"barrier": 2 * gloo_run.world_size})


def test_native_collectives_match_local_computation_and_simulated(gloo_run):
    ws = gloo_run.world_size
    got = gloo_run.results("collectives")
    for r in range(ws):
        assert_same(got[r], alg.expected_collectives(ws, r, N, SCATTER_LENGTHS), f"rank {r}")
    sim, _ = simulated(ws, "collectives", (N, SCATTER_LENGTHS))
    assert_same(got, sim)
    trace = gloo_run.trace("collectives")
    # native collectives send no traced point-to-point messages
    assert trace.summary() == {r: RankTraffic() for r in range(ws)}
    per_rank = Counter(e.kind for e in trace.of_rank(0))
    assert per_rank == Counter({"broadcast": ws, "all_reduce": 3, "all_gather": 1,
                                "reduce_scatter": 2 * len(SCATTER_LENGTHS) + 1})
    assert all(e.peer == -1 for e in trace.events)


def test_all_to_all_is_the_transpose_of_the_input_lists(gloo_run):
    ws = gloo_run.world_size
    got = gloo_run.results("all_to_all")
    for r in range(ws):
        assert_same(got[r], alg.expected_all_to_all(ws, r), f"rank {r}")
    trace = gloo_run.trace("all_to_all")
    assert trace.summary() == {r: RankTraffic() for r in range(ws)}  # native: no messages
    calls = len(alg.A2A_DTYPES) + 2
    for r in range(ws):
        events = trace.of_rank(r)
        assert [e.kind for e in events] == ["all_to_all_check", "all_to_all"] * calls
        uneven = events[1]  # the first call's data: every piece this rank sends, its own too
        assert uneven.nbytes == sum(alg.tokens(r, d).nbytes for d in range(ws))


def test_all_to_all_disagreements_fail_every_rank_as_on_simulated_ranks(gloo_run):
    """Unchecked, gloo aborts a process that receives more than its buffer holds, and leaves
    the end of a larger buffer as it was; here every rank raises what simulated ranks raise,
    and the group goes on."""
    ws = gloo_run.world_size
    got = gloo_run.results("all_to_all_disagreements")
    assert_same(got, SimulatedWorld(ws).run(alg.all_to_all_disagreements))
    assert all(got[r]["smaller"][0] == "MismatchError" for r in range(ws))


def test_all_to_all_in_a_subgroup(gloo_run):
    ws = gloo_run.world_size
    got = gloo_run.results("all_to_all_subgroup")
    assert got[0] == {"unsorted": "rank 0: subgroup ranks must be distinct and in increasing "
                      "order (torch.distributed numbers a group's ranks so), got [1, 0]"}
    simulated_ranks = SimulatedWorld(ws - 1).run(alg.all_to_all_disagreements)
    for r in range(1, ws):
        mine = got[r]
        assert mine["unsorted"].startswith(f"rank {r}: subgroup ranks must be")
        assert mine["rank"] == r - 1
        assert_same(mine["uneven"], [alg.tokens(s, r - 1) for s in range(ws - 1)])
        assert_same(mine["after"], mine["uneven"])
        assert mine["smaller"] == (simulated_ranks[r - 1]["smaller"] if ws > 2 else None)


# -- failure ------------------------------------------------------------------------------------


@pytest.mark.parametrize("messages", TRANSPORTS)
def test_both_send_first_times_out_on_both_ranks(messages):
    run = gloo_world(2, messages)
    assert all(run.checks[name][r][0] == "ok" for name, _, _ in CHECKS for r in (0, 1))
    reports = run.checks["deadlock"]
    assert sorted(reports) == [0, 1]
    kinds = []
    for r in (0, 1):
        status, (kind, message), _ = reports[r]
        kinds.append(kind)
        assert status == "error" and kind in ("CommTimeout", "CommError"), message
        assert message.startswith(f"rank {r}: send to rank {1 - r} ")
    # The first rank to time out closes the connection, so under load its peer may see the
    # closure ("failed: ... Connection closed by peer") a moment before its own timeout.
    assert "CommTimeout" in kinds


def test_every_child_exited(gloo_run):
    assert gloo_run.exitcodes == [0] * gloo_run.world_size
    assert not gloo_run.setup_errors


# -- in-process checks that need no spawn -------------------------------------------------------


def test_communicator_needs_a_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(CommError, match="join_group"):
        TorchCommunicator()


def test_simulated_deadlock_is_a_rank_failure_for_comparison():
    """The same algorithm the gloo ranks time out on fails at once on the simulated world."""
    with pytest.raises(RankFailure, match="send to rank 1"):
        SimulatedWorld(2, timeout=DEADLOCK_TIMEOUT).run(alg.both_send_first, 4)
