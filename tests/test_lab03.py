"""Lab 3's tests catch what they promise, with messages a student can act on: the typical bug
(a ring of blocking sends) fails at once naming every rank and the deadlock, a ring that
gives the right sum by sending whole tensors fails the trace test, and a broadcast or an
all-gather with the right values but without the tree or the ring keeps its value points and
fails the pattern test, naming the pattern expected and the one seen. They run the lab's own
test helpers, loaded from solutions/ with `definitions`, on stand-ins for a student's code."""

from __future__ import annotations

import pytest
import torch

from lab_solutions import solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(120)

LAB = "lab03_collectives"


def lab_checks():
    return solution(LAB, "check_ring", "check_ring_trace", "ring_all_reduce", "broadcast",
                    "all_gather", "reduce_scatter", "check_broadcast", "check_all_gather",
                    "check_reduce_scatter", "data", "check_broadcast_tree", "check_all_gather",
                    "check_gather_traffic", "check_gather_ring")


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
        c.check_broadcast_tree(n, n // 2)
        c.check_gather_ring(n)


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


def with_student(checks, name, fn):
    """The lab's check functions, calling `fn` as the student's `name`."""
    checks.check_ring.__globals__[name] = fn
    return checks


def root_sends_to_every_rank(comm, tensor, root=0):
    if comm.rank == root:
        for dst in range(comm.world_size):
            if dst != root:
                comm.send(tensor, dst)
    else:
        comm.recv(tensor, root)
    return tensor


def chain(comm, tensor, root=0):
    n, me = comm.world_size, (comm.rank - root) % comm.world_size
    if me > 0:
        comm.recv(tensor, (comm.rank - 1) % n)
    if me < n - 1:
        comm.send(tensor, (comm.rank + 1) % n)
    return tensor


def test_a_broadcast_from_the_root_alone_keeps_its_values_but_fails_the_tree():
    c = with_student(lab_checks(), "broadcast", root_sends_to_every_rank)
    c.check_broadcast(8, 3, lambda r: c.data(r, 5))  # values and receive counts: right
    with pytest.raises(AssertionError) as info:
        c.check_broadcast_tree(8, 3)
    assert str(info.value) == (
        "broadcast from root 3 on 8 ranks: expected a binomial tree, in which the root sends "
        "ceil(log2 N) = 3 messages, N-1 = 7 are sent in all, and the last rank has the data "
        "after 3 rounds; seen: the root sent 7 messages, 7 in all, the last rank had the data "
        "after 7 rounds (the root sends to every rank itself)")
    c = with_student(lab_checks(), "broadcast", chain)
    c.check_broadcast(5, 0, lambda r: c.data(r, 5))
    with pytest.raises(AssertionError, match="after 4 rounds \\(a chain, each rank passing"):
        c.check_broadcast_tree(5, 0)


def test_an_all_gather_by_direct_sends_keeps_its_points_but_fails_the_ring():
    def direct(comm, tensor):
        out = [torch.empty_like(tensor) for _ in range(comm.world_size)]
        out[comm.rank].copy_(tensor)
        handles = [comm.isend(tensor, q) for q in range(comm.world_size) if q != comm.rank]
        handles += [comm.irecv(out[q], q) for q in range(comm.world_size) if q != comm.rank]
        for handle in handles:
            handle.wait()
        return out

    c = with_student(lab_checks(), "all_gather", direct)
    c.check_all_gather(4, lambda r: c.data(r, 3))
    c.check_gather_traffic(4, 6)  # N-1 messages of one tensor each way: right too
    with pytest.raises(AssertionError) as info:
        c.check_gather_ring(4)
    assert str(info.value) == (
        "all_gather on 4 ranks: expected a ring, in which every rank sends its N-1 = 3 "
        "messages to its right neighbour (rank + 1) % 4 only; seen: each rank sends straight "
        "to every other rank")
