"""lib_dist.horovod's negotiation (every operation matched by name and checked on every rank
before data moves), join with uneven batches, and the operations built on it (alltoall,
reducescatter, grouped), on simulated ranks (threads: fast) and on 4 real ranks; and the
communicator's all_to_all against torch.distributed's on gloo.
"""

from __future__ import annotations

import cloudpickle
import pytest
import torch

import hvd_ranks
import lib_dist.horovod as hvd
from hvd_ranks import failure, on_ranks
from lib_dist.cluster import Cluster

pytestmark = [pytest.mark.timeout(180)]
cloudpickle.register_pickle_by_value(hvd_ranks)  # the engines cannot import it from tests/


def mismatches(r):
    out = {
        "shape": failure(lambda: hvd.allreduce(torch.ones(2 + (r == 2)), name="s")),
        "dtype": failure(lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32 if r else
                                                            torch.float32), name="d")),
        "root": failure(lambda: hvd.broadcast(torch.ones(2), root_rank=r, name="b")),
        "kind": failure(lambda: hvd.allreduce(torch.ones(1), name="k") if r else
                        hvd.allgather(torch.ones(1), name="k")),
        "op": failure(lambda: hvd.allreduce(torch.ones(1), name="o", op=hvd.Sum if r else
                                            hvd.Max)),
        "gather": failure(lambda: hvd.allgather(torch.ones(r + 1, 2 + (r == 1)), name="g")),
        "a2a": failure(lambda: hvd.alltoall(torch.ones(3, 1 + r), name="a")),
    }
    t = torch.ones(2)
    first = hvd.allreduce_async(t, name="twice")
    out["twice"] = failure(lambda: hvd.allreduce_async(t, name="twice"))
    out["first"] = hvd.synchronize(first).tolist()
    out["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()  # the group still works
    return out


def test_every_mismatch_fails_on_every_rank_naming_ranks_and_what_differed():
    for r, got in enumerate(on_ranks(3, mismatches)):
        assert got["shape"] == ("HorovodInternalError: allreduce 's': the ranks disagree on "
                                "the shape (rank 0: shape (2,); rank 1: shape (2,); rank 2: "
                                "shape (3,))")
        assert got["dtype"] == ("HorovodInternalError: allreduce 'd': the ranks disagree on "
                                "the dtype (rank 0: dtype float32; rank 1: dtype int32; rank 2: "
                                "dtype int32)")
        assert got["root"] == ("HorovodInternalError: broadcast 'b': the ranks disagree on the "
                               "root (rank 0: root 0; rank 1: root 1; rank 2: root 2)")
        assert got["kind"] == ("HorovodInternalError: 'k' names different operations on "
                               "different ranks (rank 0: allgather; rank 1: allreduce; rank 2: "
                               "allreduce)")
        assert "disagree on the op (rank 0: op 4; rank 1: op 1" in got["op"]
        assert "rank 1: shape (*, 3)" in got["gather"] and "rank 0: shape (*, 2)" in got["gather"]
        assert got["a2a"].startswith("HorovodInternalError: alltoall 'a': the ranks disagree on "
                                     "the shape (rank 0: shape (*, 1); rank 1: shape (*, 2)")
        assert got["twice"] == ("ValueError: allreduce 'twice': another operation named 'twice' "
                                f"is still in flight on rank {r}; names of operations in flight "
                                "must be unique (synchronize the first, or rename)")
        assert got["first"] == [1.0, 1.0] and got["after"] == 3.0
    assert issubclass(hvd.HorovodInternalError, RuntimeError)  # what Horovod's users catch


def out_of_order(r):
    """Ranks start two operations in opposite orders, and a name only rank 0 has in flight
    waits across a barrier for the others (Horovod matches by name, not by order)."""
    a, b = torch.full((2,), 1.0 + r), torch.full((2,), 10.0 * (r + 1))
    ha = hvd.allreduce_async(a, name="a", op=hvd.Sum)
    hb = hvd.allreduce_async(b, name="b", op=hvd.Sum)
    if r == 1:
        ha, hb = hb, ha  # synchronize in the other order too
    first, second = hvd.synchronize(ha), hvd.synchronize(hb)
    if r == 0:
        early = hvd.allreduce_async(torch.ones(1), name="early", op=hvd.Sum)
    hvd.barrier()
    if r != 0:
        early = hvd.allreduce_async(torch.ones(1), name="early", op=hvd.Sum)
    hvd.barrier()
    return first.tolist(), second.tolist(), hvd.synchronize(early).item()


def test_operations_are_matched_by_name_not_by_order():
    for r, (first, second, early) in enumerate(on_ranks(2, out_of_order)):
        assert (first, second) == (([3.0] * 2, [30.0] * 2) if r == 0 else
                                   ([30.0] * 2, [3.0] * 2))
        assert early == 2.0


START = torch.tensor([[0.25, -0.5, 1.0]])


def uneven(r, steps):
    """Rank r trains on steps[r] batches, then joins; the others go on averaging."""
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(START)  # ranks are threads: no seeding one random stream each
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    for step in range(steps[r]):
        opt.zero_grad()
        model(torch.full((1, 3), float(r + 1))).sum().backward()
        opt.step()
    last = hvd.join()
    out = dict(weight=model.weight.detach().clone(), last=last)
    # an allgather cannot run while a rank has joined: it fails on the ranks that started it
    out["gather"] = failure(lambda: hvd.allgather(torch.ones(1))) if r == 0 else None
    hvd.join()
    return out


def test_join_lets_ranks_with_fewer_batches_stop_early():
    steps = [1, 3, 2]
    results = on_ranks(3, uneven, steps)
    # rank r's gradient is r + 1 for every weight; each step's is averaged over all 3 ranks,
    # a rank that has joined adding zeros: (1 + 2 + 3) / 3, then (2 + 3) / 3, then 2 / 3
    grads = [2.0, 5.0 / 3, 2.0 / 3]
    start = START
    assert all(got["last"] == 1 for got in results)  # rank 1 joined last
    assert "only allreduce runs with ranks that have joined" in results[0]["gather"]
    for r, got in enumerate(results):
        want = start - 0.5 * sum(grads[: steps[r]])  # each rank took its own steps
        # a few roundings of values below 10: a few float32 eps of 10
        torch.testing.assert_close(got["weight"], want, rtol=0, atol=4 * 10 * torch.finfo().eps)


def joins_in_turn(r, n):
    """Each rank in turn joins first while the others try an unnamed allgather: its name
    differs between ranks by then (each counts its own), and it must still fail at once."""
    out = []
    for first in range(n):
        if r != first:
            out.append(failure(lambda: hvd.allgather(torch.ones(1))))
        out.append(hvd.join())
    return out


def test_what_cannot_run_beside_a_joined_rank_fails_without_waiting_for_its_name():
    for r, got in enumerate(on_ranks(4, joins_in_turn, 4)):
        refusals = [g for g in got if isinstance(g, str)]
        assert len(refusals) == 3 and all("has joined (hvd.join)" in g for g in refusals)
        lasts = [g for g in got if isinstance(g, int)]
        assert len(lasts) == 4 and all(last != first for first, last in enumerate(lasts))


def moves(r, n):
    out = {}
    rows = torch.cat([torch.full((d + 1, 2), 10.0 * r + d) for d in range(n)])
    got, received = hvd.alltoall(rows, splits=[d + 1 for d in range(n)])
    out["alltoall"] = (got[:, 0].tolist(), received.tolist())
    out["equal"] = hvd.alltoall(torch.arange(2 * n, dtype=torch.int16) + 100 * r).tolist()
    out["scatter"] = hvd.reducescatter(torch.arange(7.0) * (r + 1), op=hvd.Sum).tolist()
    out["grouped"] = [t.tolist() for t in hvd.grouped_allreduce(
        [torch.ones(2) * r, torch.ones(1, dtype=torch.int8)], op=hvd.Sum)]
    out["small"] = {str(dt): (hvd.allreduce(torch.ones(2, dtype=dt), op=hvd.Sum).tolist(),
                              hvd.allgather(torch.ones(1, dtype=dt)).tolist(),
                              hvd.broadcast(torch.full((1,), r, dtype=dt) > 0 if dt == torch.bool
                                            else torch.full((1,), r, dtype=dt), 1).tolist())
                    for dt in (torch.int8, torch.int16, torch.uint8, torch.bool)}
    x = torch.ones(3, requires_grad=True)
    (hvd.alltoall(x * (r + 1), splits=[1, 1, 1])[0] * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    out["a2a_grad"] = x.grad.tolist()
    return out


def test_alltoall_reducescatter_grouped_and_small_integers():
    n = 3
    for r, got in enumerate(on_ranks(n, moves, n)):
        assert got["alltoall"] == ([10.0 * s + r for s in range(n) for _ in range(r + 1)],
                                   [r + 1] * n)
        assert got["equal"] == [100 * s + 2 * r + i for s in range(n) for i in range(2)]
        # 7 rows over 3 ranks: 3, 2, 2 (the first ranks take one more); (1 + 2 + 3) x rows
        assert got["scatter"] == [6.0 * i for i in [(0, 1, 2), (3, 4), (5, 6)][r]]
        assert got["grouped"] == [[3.0, 3.0], [3]]
        for dt, (summed, gathered, cast) in got["small"].items():
            ones = [True] * 2 if dt == "torch.bool" else [3] * 2
            assert summed == ones if dt != "torch.bool" else summed == [True, True]
            assert len(gathered) == 3 and cast == ([True] if dt == "torch.bool" else [1])
        # the gradient comes back the way the rows went: every row rank r sent sits at
        # position r of its receiver's output, weighted r + 1 there, after the factor r + 1
        assert got["a2a_grad"] == [(r + 1.0) ** 2] * n


def unchecked(r):
    return hvd.allreduce(torch.ones(2) * r, op=hvd.Sum).tolist(), hvd.join()


def test_checks_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("LIB_DIST_HVD_CHECKS", "0")
    for got in on_ranks(2, unchecked):
        assert got[0] == [1.0, 1.0] and got[1] in (0, 1)
    monkeypatch.setenv("LIB_DIST_HVD_CHECKS", "maybe")
    with pytest.raises(ValueError, match="LIB_DIST_HVD_CHECKS must be 1"):
        hvd.init()


def on_real_ranks(comm):
    import torch
    import torch.distributed as dist

    import lib_dist.horovod as hvd

    hvd.init()
    r, n = comm.rank, comm.world_size
    inputs = [torch.full((d + 1,), 10.0 * r + d) for d in range(n)]
    outputs = [torch.empty(r + 1) for _ in range(n)]
    mine = [t.clone() for t in comm.all_to_all(inputs, outputs)]
    theirs = torch.empty(n * (r + 1))
    dist.all_to_all_single(theirs, torch.cat(inputs), [r + 1] * n, [d + 1 for d in range(n)])
    out = dict(same=torch.equal(torch.cat(mine), theirs), mine=torch.cat(mine).tolist(),
               traced=comm.trace.events[-1].kind)
    out["shape"] = failure(lambda: hvd.allreduce(torch.ones(1 + (r == 3)), name="shape"))
    out["root"] = failure(lambda: hvd.broadcast(torch.ones(1), root_rank=r % 2, name="root"))
    out["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    evens, odds = hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])
    mine = evens if r % 2 == 0 else odds
    out["set"] = (mine.size(), mine.rank(), mine.included(), evens.included())
    out["set_sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine).item()
    out["set_cast"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=mine.ranks[-1],
                                    process_set=mine).item()
    out["outside"] = failure(lambda: hvd.allreduce(torch.ones(1), process_set=odds if r % 2 == 0
                                                   else evens))
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)
    out["global_after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    return out


@pytest.mark.cluster
def test_on_four_real_ranks_against_torch_distributed():
    with Cluster(4, timeout=30) as cluster:
        results = cluster.run(on_real_ranks)
    for r, got in enumerate(results):
        assert got["same"] and got["traced"] == "all_to_all"
        assert got["mine"] == [10.0 * s + r for s in range(4) for _ in range(r + 1)]
        assert "rank 3: shape (2,)" in got["shape"] and got["shape"].startswith("Horovod")
        assert "rank 1: root 1" in got["root"]
        assert got["after"] == 4.0
        # process sets: evens {0, 2} and odds {1, 3}, each its own subgroup
        assert got["set"] == (2, r // 2, True, r % 2 == 0)
        assert got["set_sum"] == (0.0 + 2.0 if r % 2 == 0 else 1.0 + 3.0)
        assert got["set_cast"] == (2.0 if r % 2 == 0 else 3.0)  # root_rank: a global rank
        assert got["outside"].startswith(f"NotInProcessSet: allreduce: rank {r} is not in")
        assert got["global_after"] == 4.0
