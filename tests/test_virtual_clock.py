"""The simulated world's virtual clock: compute costs what it declares, a message leaves once
both ends have posted it and costs its alpha-beta time, a barrier ends at the last arrival,
and the same program gives the same times on every run, whatever the threads' speed."""

from __future__ import annotations

import json
import time

import pytest
import torch

from lib_dist.comm import AlphaBeta, SimulatedWorld, Trace, VirtualClock, plot_trace


def ping(comm, work=(1.0, 3.0), sleep=0.0):
    """Rank 0 works work[0] then sends 4 floats; rank 1 works work[1] then receives."""
    with comm.compute("F0", work[comm.rank]):
        time.sleep(sleep * (1 - comm.rank))  # wall time must not matter
    if comm.rank == 0:
        comm.send(torch.ones(4), 1)
    else:
        comm.recv(torch.empty(4), 0)
    comm.barrier()
    return comm.virtual_time()


def times(trace):
    return sorted((e.rank, e.name, e.vstart, e.vend) for e in trace.events)


def test_a_message_leaves_when_both_ends_have_posted_and_costs_its_alpha_beta_time():
    world = SimulatedWorld(2, clock=VirtualClock(AlphaBeta(alpha=0.5, beta=8.0)))
    assert world.run(ping) == [5.5, 5.5]  # 16 bytes: 0.5 + 2 = 2.5 after the receiver's 3
    assert times(world.trace) == [
        (0, "F0", 0.0, 1.0), (0, "barrier", 5.5, 5.5), (0, "send to 1", 1.0, 5.5),
        (1, "F0", 0.0, 3.0), (1, "barrier", 5.5, 5.5), (1, "recv from 0", 3.0, 5.5)]


def test_a_receiver_that_posts_late_finds_the_message_arrived():
    def late(comm):
        if comm.rank == 0:
            handle = comm.isend(torch.ones(2), 1)
            with comm.compute("W", 10.0):
                pass
            handle.wait()  # done long before: the clock does not move back
        else:
            with comm.compute("W", 4.0):
                pass
            comm.recv(torch.empty(2), 0)
        return comm.virtual_time()

    assert SimulatedWorld(2, clock=VirtualClock()).run(late) == [10.0, 4.0]


def test_the_times_do_not_depend_on_the_threads_speed():
    a = SimulatedWorld(2, clock=VirtualClock(AlphaBeta(0.1, 100.0)))
    a.run(ping, sleep=0.0)
    b = SimulatedWorld(2, clock=VirtualClock(AlphaBeta(0.1, 100.0)))
    b.run(ping, sleep=0.05)
    assert times(a.trace) == times(b.trace)


def test_without_a_clock_there_is_no_virtual_time():
    world = SimulatedWorld(2)
    assert world.run(ping) == [None, None]
    assert all(e.vstart is None for e in world.trace.events)
    with pytest.raises(ValueError, match="no virtual time"):
        world.trace.to_chrome_trace(clock="virtual")
    assert world.trace.to_chrome_trace(clock="wall")["traceEvents"]


def test_a_negative_cost_is_refused():
    def negative(comm):
        with comm.compute("F0", -1.0):
            pass

    with pytest.raises(Exception, match="compute cost must be >= 0"):
        SimulatedWorld(1, clock=VirtualClock()).run(negative)


def test_chrome_trace_and_plot_use_the_virtual_times(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    world = SimulatedWorld(2, clock=VirtualClock())
    world.run(ping)
    doc = world.trace.to_chrome_trace(tmp_path / "t.json", clock="virtual")
    work = {(row["tid"], row["name"]): (row["ts"], row["dur"]) for row in doc["traceEvents"]
            if row.get("cat") == "compute"}
    assert work == {(0, "F0"): (0.0, 1000.0), (1, "F0"): (0.0, 3000.0)}  # a unit as a ms
    assert json.loads((tmp_path / "t.json").read_text()) == doc
    ax = plot_trace(world.trace)
    assert sorted(t.get_text() for t in ax.texts) == ["F0", "F0"]
    with pytest.raises(ValueError, match="no compute events"):
        plot_trace(Trace())
