"""Sub-communicators (lib_dist.comm.mesh) on a simulated world of 8 and on 4 real ranks: a
(dp, pp, tp) mesh gives each rank the groups of the ranks that differ from it along one
dimension, numbered within them; collectives in a group reduce over its ranks only; each
group's events are in its own trace; messages of two groups between the same two ranks never
meet; a deadlock inside a group is found and named; split's order and a mesh whose size is
not the world's are refused."""

from __future__ import annotations

import pytest
import torch

from lib_dist.cluster import Cluster
from lib_dist.comm import SimulatedWorld
from lib_dist.comm.errors import DeadlockError
from lib_dist.comm.mesh import Mesh, coordinates, rank_of, split
from lib_dist.errors import RankFailure

SHAPE, NAMES = (2, 2, 2), ("dp", "pp", "tp")


def group_sums(comm):
    mesh = Mesh(comm, SHAPE, NAMES)
    out = {}
    for name in NAMES:
        group = mesh[name]
        t = torch.tensor([float(comm.rank)])
        out[name] = (group.rank, group.world_size, group.all_reduce(t).item())
        group.barrier()
    return mesh.coords, out


def test_a_mesh_gives_each_rank_its_group_along_each_dimension():
    world = SimulatedWorld(8)
    results = world.run(group_sums)
    for rank, (coords, out) in enumerate(results):
        assert coords == coordinates(rank, SHAPE) and rank_of(coords, SHAPE) == rank
        for d, name in enumerate(NAMES):
            members = [r for r in range(8) if all(
                c == coords[i] for i, c in enumerate(coordinates(r, SHAPE)) if i != d)]
            group_rank, size, total = out[name]
            assert (group_rank, size, total) == (members.index(rank), 2, float(sum(members)))
    # tp groups are neighbours (0, 1), dp groups are 4 apart (0, 4)
    assert results[0][1]["tp"][2] == 1.0 and results[0][1]["dp"][2] == 4.0
    # the world's own trace holds only split's bookkeeping: the groups have their own
    assert [e for e in world.trace.events if e.kind == "all_reduce"] == []


def two_groups_crossed(comm):
    """Ranks 0 and 1 in two groups of the same ranks: rank 0 sends in A then B, rank 1
    receives in B then A; each receive must get its own group's message."""
    a, b = comm.subgroup([0, 1]), comm.subgroup([0, 1])
    if comm.rank == 0:
        handles = [a.isend(torch.tensor([1.0]), 1), b.isend(torch.tensor([2.0]), 1)]
        for h in handles:
            h.wait()
        return a.trace, b.trace
    got_b, got_a = torch.zeros(1), torch.zeros(1)
    b.recv(got_b, 0)
    a.recv(got_a, 0)
    return got_a.item(), got_b.item()


def test_two_groups_messages_between_the_same_ranks_never_meet():
    (trace_a, trace_b), got = SimulatedWorld(2).run(two_groups_crossed)
    assert got == (1.0, 2.0)
    for trace in (trace_a, trace_b):  # each group's trace: its own send and receive only
        assert sorted(e.kind for e in trace.events) == ["recv", "send"]


def test_a_deadlock_inside_a_group_is_found_and_named():
    def both_send_first(comm):
        mesh = Mesh(comm, (2, 2), ("dp", "tp"))
        tp = mesh["tp"]
        tp.send(torch.zeros(1), 1 - tp.rank)  # both ranks of the group send first

    with pytest.raises(RankFailure) as failure:
        SimulatedWorld(4).run(both_send_first)
    assert all(isinstance(e, DeadlockError) for e in failure.value.exceptions.values())
    assert "deadlock" in str(failure.value)


def test_bad_meshes_and_splits_are_refused_saying_what_to_do():
    def body(comm):
        with pytest.raises(ValueError, match="has 8 ranks; the communicator has 4"):
            Mesh(comm, (2, 2, 2), NAMES)
        with pytest.raises(ValueError, match="keys must keep the ranks in increasing order"):
            split(comm, 0, key=-comm.rank)
        return True

    assert SimulatedWorld(4).run(body) == [True] * 4


def mesh_on_real_ranks(comm):
    import torch

    from lib_dist.comm.mesh import Mesh

    mesh = Mesh(comm, (2, 2), ("dp", "tp"))
    t = torch.tensor([float(comm.rank)])
    return (mesh.coords, mesh["dp"].all_reduce(t.clone()).item(),
            mesh["tp"].all_reduce(t.clone()).item())


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_mesh_on_real_ranks():
    with Cluster(4, timeout=60) as cluster:
        results = cluster.run(mesh_on_real_ranks)
    assert results == [((0, 0), 2.0, 1.0), ((0, 1), 4.0, 1.0), ((1, 0), 2.0, 5.0),
                       ((1, 1), 4.0, 5.0)]
