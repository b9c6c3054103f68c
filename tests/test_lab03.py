"""Lab 3's tests catch what they promise, with messages a student can act on: the typical bug
(a ring of blocking sends) fails at once naming every rank and the deadlock, and a ring that
gives the right sum by sending whole tensors fails the trace test. They run the lab's own
test helpers, loaded from solutions/ with `definitions`, on stand-ins for a student's code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab_solutions import solution  # noqa: E402

from grader.demo import TYPICAL_BUGS  # noqa: E402

pytestmark = pytest.mark.timeout(120)

LAB = "lab03_collectives"


def lab_checks():
    return solution(LAB, "check_ring", "check_ring_trace", "ring_all_reduce", "broadcast",
                    "all_gather", "reduce_scatter", "check_broadcast", "check_all_gather",
                    "check_reduce_scatter", "data")


def with_ring(checks, ring):
    """The lab's check functions, calling `ring` as the student's ring_all_reduce."""
    checks.check_ring.__globals__["ring_all_reduce"] = ring
    return checks


def test_the_solution_passes_the_checks_at_every_world_size():
    c = lab_checks()
    for n in range(1, 9):
        c.check_ring(n, 2 * n + 1)
        c.check_ring(n, 3, torch.bfloat16, op="avg")
        c.check_ring_trace(n, 4 * n)
        c.check_broadcast(n, n - 1, lambda r: c.data(r, 5))
        c.check_all_gather(n, lambda r: c.data(r, 2, torch.float16))
        c.check_reduce_scatter(n, 7)


def test_a_ring_of_blocking_sends_fails_at_once_naming_every_rank():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q4-solution"
    c = lab_checks()
    namespace = dict(c.check_ring.__globals__)
    exec(source, namespace)  # noqa: S102 - the bug, as a student would write it
    with_ring(c, namespace["ring_all_reduce"])
    with pytest.raises(AssertionError) as info:
        c.check_ring(4, 8)
    message = str(info.value).splitlines()[0]
    assert "on 4 simulated ranks failed" in message
    for rank in range(4):
        assert f"rank {rank}: DeadlockError: send to rank {(rank + 1) % 4}" in message


def test_the_right_sum_from_whole_tensors_fails_the_trace_test():
    def gather_at_rank_0(comm, tensor, op="sum"):
        if comm.rank == 0:
            for src in range(1, comm.world_size):
                buf = torch.empty_like(tensor)
                comm.recv(buf, src)
                tensor += buf
            for dst in range(1, comm.world_size):
                comm.send(tensor, dst)
        else:
            comm.send(tensor, 0)
            comm.recv(tensor, 0)
        if op == "avg":
            tensor /= comm.world_size
        return tensor

    c = with_ring(lab_checks(), gather_at_rank_0)
    c.check_ring(4, 8)  # the values are right
    with pytest.raises(AssertionError, match="never the whole tensor|2\\(N-1\\)"):
        c.check_ring_trace(4, 16)
