"""Trace: the alpha-beta replay of a traced pattern, Chrome-trace export, and merging."""

from __future__ import annotations

import copy
import json
import pickle
from collections import Counter

import pytest
import torch

import algorithms as alg

from lib_dist.comm import AlphaBeta, Event, SimulatedWorld, Trace, wait_all

pytestmark = pytest.mark.timeout(60)

# Powers of two, so every modeled time below is exact in binary floating point.
MODEL = AlphaBeta(alpha=2.0**-10, beta=2.0**20)


def traced(world_size: int, fn, *args) -> Trace:
    world = SimulatedWorld(world_size)
    world.run(fn, *args)
    return world.trace


# -- modeled_time -------------------------------------------------------------------------


def test_cost_is_alpha_plus_bytes_over_beta():
    assert MODEL.cost(0) == MODEL.alpha
    assert MODEL.cost(4096) == 2.0**-10 + 2.0**-8
    assert AlphaBeta(alpha=1e-6, beta=1e9).cost(1000) == pytest.approx(2e-6)


@pytest.mark.parametrize("n", [1, 256, 10_000])
def test_single_message_costs_alpha_plus_bytes_over_beta(n):
    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.ones(n), 1)
        else:
            comm.recv(torch.empty(n), 0)

    trace = traced(2, fn)
    assert trace.modeled_time(MODEL) == MODEL.alpha + 4 * n / MODEL.beta
    assert trace.modeled_time() == pytest.approx(AlphaBeta().alpha + 4 * n / AlphaBeta().beta)


def test_empty_trace_takes_no_time():
    assert Trace().modeled_time(MODEL) == 0.0
    assert traced(3, lambda comm: None).modeled_time(MODEL) == 0.0


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_ring_all_reduce_costs_2_n_minus_1_chunk_messages(world_size):
    n = 64 * world_size
    trace = traced(world_size, alg.ring_all_reduce, n)
    step = MODEL.alpha + (n / world_size) * 4 / MODEL.beta
    assert trace.modeled_time(MODEL) == 2 * (world_size - 1) * step
    default = AlphaBeta()
    assert trace.modeled_time(default) == pytest.approx(
        2 * (world_size - 1) * (default.alpha + (n / world_size) * 4 / default.beta), rel=1e-12)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_gather_then_broadcast_serialises_on_rank_0(world_size):
    n = 256
    want = 2 * (world_size - 1) * (MODEL.alpha + 4 * n / MODEL.beta)
    assert traced(world_size, alg.gather_then_broadcast, n).modeled_time(MODEL) == want
    # the default all_reduce over point-to-point is the same pattern
    trace = traced(world_size, lambda comm: comm.all_reduce(alg.data(comm.rank, n)))
    assert trace.modeled_time(MODEL) == want


def test_program_order_chains_messages():
    """0 -> 1, then 1 forwards to 2 only after receiving: two message times, not one."""
    def fn(comm):
        buf = torch.empty(256)
        if comm.rank == 0:
            comm.send(buf, 1)
        elif comm.rank == 1:
            comm.recv(buf, 0)
            comm.send(buf, 2)
        else:
            comm.recv(buf, 1)

    assert traced(3, fn).modeled_time(MODEL) == 2 * MODEL.cost(1024)


def test_links_are_full_duplex_and_disjoint_links_overlap():
    """A swap between two pairs costs one message: 0<->1 and 2<->3 all at once."""
    def fn(comm):
        peer = comm.rank ^ 1
        wait_all([comm.isend(torch.ones(256), peer), comm.irecv(torch.empty(256), peer)])

    assert traced(4, fn).modeled_time(MODEL) == MODEL.cost(1024)


def test_one_senders_outbound_link_is_shared():
    def fn(comm):
        if comm.rank == 0:
            wait_all([comm.isend(torch.ones(256), dst) for dst in range(1, comm.world_size)])
        else:
            comm.recv(torch.empty(256), 0)

    assert traced(4, fn).modeled_time(MODEL) == 3 * MODEL.cost(1024)


def test_receives_pair_with_sends_in_posting_order_not_waiting_order():
    """Rank 1 posts irecv A, then a blocking recv B, forwards B back to rank 0, and only then
    waits on A. FIFO matching gives A the first send, B the second; the reply must wait for
    the second message: three message times, not two."""
    def fn(comm):
        a, b = torch.zeros(256), torch.zeros(256)
        if comm.rank == 0:
            sends = [comm.isend(torch.full((256,), float(i)), 1) for i in (1, 2)]
            comm.recv(torch.empty(256), 1)
            wait_all(sends)
            return None
        first = comm.irecv(a, 0)
        comm.recv(b, 0)
        comm.send(b, 0)
        first.wait()
        return a[0].item(), b[0].item()

    world = SimulatedWorld(2)
    assert world.run(fn)[1] == (1.0, 2.0)
    assert world.trace.modeled_time(MODEL) == 3 * MODEL.cost(1024)


# -- Chrome trace -----------------------------------------------------------------------------


def test_chrome_trace_has_one_complete_event_per_op_and_a_row_per_rank(tmp_path):
    def fn(comm):
        alg.ring_pass(comm, 4)
        comm.barrier()
        comm.all_reduce(alg.data(comm.rank, 4))

    world_size = 3
    trace = traced(world_size, fn)
    path = tmp_path / "trace.json"
    doc = trace.to_chrome_trace(path)

    assert json.loads(path.read_text()) == doc
    rows = doc["traceEvents"]
    complete = [r for r in rows if r["ph"] == "X"]
    assert len(complete) == len(trace.events)
    assert Counter(r["tid"] for r in complete) == Counter(e.rank for e in trace.events)
    assert Counter(r["cat"] for r in complete) == Counter(
        "p2p" if e.kind in ("send", "recv") else "collective" for e in trace.events)
    assert all(r["ts"] >= 0 and r["dur"] > 0 for r in complete)
    assert min(r["ts"] for r in complete) == 0
    names = Counter(r["name"] for r in complete)
    assert names["send to 1"] == world_size - 1 + 1  # ring steps from rank 0, all_reduce bcast
    assert names["barrier"] == world_size
    meta = [r for r in rows if r["ph"] == "M"]
    assert sorted((r["name"], r["tid"], r["args"]["name"]) for r in meta) == [
        ("thread_name", r, f"rank {r}") for r in range(world_size)]


def test_chrome_trace_of_empty_trace_is_valid(tmp_path):
    doc = Trace().to_chrome_trace(tmp_path / "empty.json")
    assert doc["traceEvents"] == []
    assert json.loads((tmp_path / "empty.json").read_text()) == doc


# -- merge, copies ------------------------------------------------------------------------------


def test_merge_of_per_rank_traces_equals_the_whole():
    world_size, n = 4, 64
    whole = traced(world_size, alg.ring_all_reduce, n * world_size)
    parts = [Trace(whole.of_rank(r)) for r in range(world_size)]
    assert [len(p.events) for p in parts] == [2 * (world_size - 1) * 2] * world_size
    merged = Trace.merge(parts)
    assert sorted(merged.events, key=lambda e: (e.rank, e.seq)) == sorted(
        whole.events, key=lambda e: (e.rank, e.seq))
    assert merged.summary() == whole.summary()
    assert merged.messages() == whole.messages()
    assert merged.modeled_time(MODEL) == whole.modeled_time(MODEL)
    assert Trace.merge([]).events == []
    parts[0].record(Event(0, "send", 1, 4, 0.0, 0.0, seq=99, after=99))
    assert len(merged.events) == len(whole.events)  # merge copies, it does not alias


def test_of_rank_orders_by_completion():
    trace = traced(3, alg.ring_pass, 2)
    for r in range(3):
        events = trace.of_rank(r)
        assert [e.seq for e in events] == list(range(len(events)))
        assert all(e.rank == r for e in events)


def test_trace_pickles_and_copies_for_multi_process_runs():
    trace = traced(2, alg.ring_pass, 3)
    for clone in (pickle.loads(pickle.dumps(trace)), copy.deepcopy(trace)):
        assert clone.events == trace.events
        clone.record(Event(0, "barrier", -1, 0, 0.0, 0.0, seq=9, after=9))  # has its own lock
        assert len(clone.events) == len(trace.events) + 1
    assert Trace([Event(**d) for d in trace.to_dicts()]).events == trace.events


def test_format_summary_lists_every_rank():
    text = traced(3, alg.ring_pass, 5).format_summary()
    lines = text.splitlines()
    assert lines[0].split() == ["rank", "sent", "msgs", "sent", "bytes", "recv", "msgs",
                                "recv", "bytes"]
    assert [line.split() for line in lines[1:]] == [[str(r), "2", "40", "2", "40"]
                                                     for r in range(3)]
