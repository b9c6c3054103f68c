"""lib_dist.horovod's API on 4 real ranks (one cluster for the module): identities, every
tensor operation and its in-place and asynchronous forms, and what is refused. Objects, models,
optimizer state and gradients are in test_horovod_objects.py; DistributedOptimizer in
test_horovod_optimizer.py, Tensor Fusion and the timeline in test_horovod_fusion.py.

Every function below runs on each rank with `hvd.init()` first (a no-op once initialized).
"""

from __future__ import annotations

import re

import pytest
import torch

import lib_dist.horovod as hvd
from lib_dist.cluster import Cluster, RankFailure

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]
N = 4


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=30) as c:
        yield c


def identities(comm):
    import torch.distributed as dist

    import lib_dist.horovod as hvd

    hvd.init()
    return dict(size=hvd.size(), rank=hvd.rank(), local=(hvd.local_rank(), hvd.local_size()),
                cross=(hvd.cross_rank(), hvd.cross_size()), homogeneous=hvd.is_homogeneous(),
                initialized=hvd.is_initialized(), gloo=(hvd.gloo_built(), hvd.gloo_enabled()),
                nccl=hvd.nccl_built() == dist.is_nccl_available(), mpi=hvd.mpi_built())


def test_ranks_and_what_is_built(cluster):
    for r, got in enumerate(cluster.run(identities)):
        assert got == dict(size=N, rank=r, local=(r, N), cross=(0, 1), homogeneous=True,
                           initialized=True, gloo=(True, True), nccl=True, mpi=False)


def reductions(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    t = torch.tensor([1.0, -2.0, 3.0]) * (r + 1)
    before = t.clone()
    out = dict(
        average=hvd.allreduce(t), named=hvd.allreduce(t, name="my_tensor"),
        sum=hvd.allreduce(t, op=hvd.Sum), old_sum=hvd.allreduce(t, average=False),
        old_average=hvd.allreduce(t, average=True), min=hvd.allreduce(t, op=hvd.Min),
        max=hvd.allreduce(t, op=hvd.Max), product=hvd.allreduce(t, op=hvd.Product),
        scaled=hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
        scaled_average=hvd.allreduce(t, prescale_factor=3.0),
        fp16=hvd.allreduce(t.double(), compression=hvd.Compression.fp16),
        ints=hvd.allreduce(torch.tensor([r, 7]), op=hvd.Sum),
        int_average=hvd.allreduce(torch.tensor([r, 7])),
        matrix=hvd.allreduce(torch.full((2, 3), float(r)).t(), op=hvd.Sum))
    out["unchanged"] = torch.equal(t, before)
    in_place = t.clone()
    out["in_place_returns_it"] = hvd.allreduce_(in_place, op=hvd.Sum) is in_place
    out["in_place"] = in_place
    return out


def test_allreduce_ops_scale_factors_compression_and_dtypes(cluster):
    base = torch.tensor([1.0, -2.0, 3.0])
    factors = [r + 1 for r in range(N)]  # rank r holds base * (r + 1)
    for got in cluster.run(reductions):
        torch.testing.assert_close(got["average"], base * 2.5)
        torch.testing.assert_close(got["named"], base * 2.5)
        torch.testing.assert_close(got["sum"], base * 10)
        torch.testing.assert_close(got["old_sum"], base * 10)
        torch.testing.assert_close(got["old_average"], base * 2.5)
        torch.testing.assert_close(got["min"], torch.tensor([1.0, -8.0, 3.0]))
        torch.testing.assert_close(got["max"], torch.tensor([4.0, -2.0, 12.0]))
        torch.testing.assert_close(got["product"], base ** 4 * 24)
        torch.testing.assert_close(got["scaled"], base * 10 * 2 * 0.25)
        torch.testing.assert_close(got["scaled_average"], base * 2.5 * 3)
        assert got["fp16"].dtype == torch.float64  # sent as float16, returned as given
        torch.testing.assert_close(got["fp16"], base.double() * 2.5)
        assert got["ints"].tolist() == [6, 28] and got["ints"].dtype == torch.int64
        assert got["int_average"].tolist() == [1, 7]  # 6 / 4 rounded down
        assert got["matrix"].shape == (3, 2) and got["matrix"].eq(6.0).all()
        assert got["unchanged"] and got["in_place_returns_it"]
        torch.testing.assert_close(got["in_place"], base * sum(factors))


def handles(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    big = torch.full((100_000,), float(r))
    column = torch.arange(12.0).reshape(3, 4)[:, 1] * (r + 1)  # not contiguous
    h_big = hvd.allreduce_async(big, op=hvd.Sum, name="big")
    h_col = hvd.allreduce_async_(column, op=hvd.Sum)
    h_cast = hvd.broadcast_async(torch.full((2,), float(r)), root_rank=3)
    h_cast_ = hvd.broadcast_async_(mine := torch.full((2,), float(r)), root_rank=1)
    h_rows = hvd.allgather_async(torch.full((r + 1,), float(r)))
    blocking = hvd.allreduce(torch.ones(3), op=hvd.Sum)  # waits for the five above
    done = [hvd.poll(h) for h in (h_big, h_col, h_cast, h_cast_, h_rows)]
    rows = hvd.synchronize(h_rows)  # in any order
    out = dict(done=done, blocking=blocking, rows=rows, cast=hvd.synchronize(h_cast),
               cast_=hvd.synchronize(h_cast_), mine=mine, column_out=hvd.synchronize(h_col),
               column=column, big=hvd.synchronize(h_big), big_in=big[0].item())
    try:
        hvd.synchronize(h_big)
    except ValueError as e:
        out["again"] = str(e)
    return out


def test_async_handles_run_in_start_order_and_synchronize_in_any(cluster):
    for r, got in enumerate(cluster.run(handles)):
        assert got["done"] == [True] * 5  # the blocking allreduce waited for them
        assert got["blocking"].tolist() == [4.0] * 3
        assert got["rows"].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]
        assert got["cast"].tolist() == [3.0, 3.0]
        assert got["cast_"] is got["mine"] and got["mine"].tolist() == [1.0, 1.0]
        assert got["column_out"] is got["column"]
        assert got["column"].tolist() == [10.0 * v for v in (1.0, 5.0, 9.0)]
        assert got["big"].eq(6.0).all() and got["big_in"] == r  # allreduce_async: new tensor
        assert "synchronized once" in got["again"]


def gathers_and_broadcasts(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    out = dict(rows=hvd.allgather(torch.full((r, 2), float(r), dtype=torch.float64)),
               scalars=hvd.allgather(torch.tensor(r)))
    t = torch.full((3,), float(r))
    out["cast"], out["t"] = hvd.broadcast(t, root_rank=2), t
    out["cast_is_new"] = out["cast"] is not t
    u = torch.full((2, 2), float(r)).t()
    out["cast_"] = hvd.broadcast_(u, root_rank=3)
    out["cast_is_u"] = out["cast_"] is u
    refused = hvd.allgather_async(torch.zeros(1, 2 + (r == 3)), name="refused")
    for name, call in [("shapes", lambda: hvd.allgather(torch.zeros(1, 2 + (r == 3)))),
                       ("async_shapes", lambda: hvd.synchronize(refused)),
                       ("root", lambda: hvd.broadcast(t, root_rank=N)),
                       ("sparse", lambda: hvd.allreduce(torch.eye(2).to_sparse()))]:
        try:
            call()
        except (RuntimeError, TypeError) as e:  # HorovodInternalError, NotImplementedError
            out[name] = f"{type(e).__name__}: {e}"
    out["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum)  # the refusals broke nothing
    return out


def test_allgather_with_different_first_dimensions_and_broadcast(cluster):
    for r, got in enumerate(cluster.run(gathers_and_broadcasts)):
        expected = torch.cat([torch.full((k, 2), float(k), dtype=torch.float64)
                              for k in range(N)])
        assert torch.equal(got["rows"], expected)  # 0 + 1 + 2 + 3 rows, in rank order
        assert got["scalars"].tolist() == [0, 1, 2, 3]
        assert got["cast"].tolist() == [2.0] * 3 and got["cast_is_new"]
        assert got["t"].tolist() == [float(r)] * 3  # broadcast leaves its input alone
        assert got["cast_is_u"] and got["cast_"].eq(3.0).all()
        # every rank says which rank differs, and in what, before any data moved
        for key in ("shapes", "async_shapes"):
            assert re.fullmatch(r"HorovodInternalError: allgather '(refused|allgather\.noname\.\d+)"
                                r"': the ranks disagree on the shape \(rank 0: shape \(\*, 2\); "
                                r"rank 1: shape \(\*, 2\); rank 2: shape \(\*, 2\); rank 3: "
                                r"shape \(\*, 3\)\)", got[key]), got[key]
        assert "'refused'" in got["async_shapes"]
        assert got["after"].tolist() == [4.0]
        assert "HorovodInternalError: broadcast: root_rank must be a rank, 0..3" in got["root"]
        assert "sparse" in got["sparse"]


def refusals(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    out = {}
    attempts = {
        "adasum": lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum),
        "adasum_optimizer": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), op=hvd.Adasum),
        "process_set": lambda: hvd.allreduce(torch.ones(1), process_set=object()),
        "process_sets": lambda: hvd.add_process_set([0, N]),
        "both_ops": lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum),
        "unknown": lambda: hvd.no_such_function,
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except (NotImplementedError, ValueError, AttributeError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    out["global_set"] = hvd.allreduce(torch.ones(1), process_set=hvd.global_process_set)
    nobody = hvd.add_process_set([])  # legal, as in Horovod: no rank is in it
    try:
        hvd.allreduce(torch.ones(1), process_set=nobody)
    except ValueError as e:
        out["empty_set"] = f"{type(e).__name__}: {e}"
    out["empty_removed"] = hvd.remove_process_set(nobody)
    out["join"] = hvd.join()
    hvd.barrier()
    return out


def test_unsupported_names_raise_naming_themselves(cluster):
    for got in cluster.run(refusals):
        assert "does not support Adasum" in got["adasum"]
        assert "does not support Adasum" in got["adasum_optimizer"]
        assert "process_set must be hvd.global_process_set or one added" in got["process_set"]
        assert "ranks must be among 0..3, got [0, 4]" in got["process_sets"]
        assert got["both_ops"].startswith("ValueError")
        assert got["unknown"].startswith("AttributeError: lib_dist.horovod has no "
                                         "'no_such_function'")
        assert got["global_set"].tolist() == [1.0]
        assert "is not in ProcessSet(" in got["empty_set"] and "ranks=[])" in got["empty_set"]
        assert got["empty_removed"] is True
        assert got["join"] in range(N)


def mismatched(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise RuntimeError("rank 1 gives up before the allreduce")
    return hvd.allreduce(torch.ones(1)).item()


def test_a_rank_that_fails_is_named_and_the_others_do_not_hang(cluster):
    with pytest.raises(RankFailure) as info:
        cluster.run(mismatched, timeout=20)
    assert info.value.ranks == [1]
    assert cluster.run(identities)[3]["rank"] == 3  # fresh engines: init finds the new group


def test_before_init_every_call_says_to_call_init_and_alone_it_is_one_rank():
    hvd.shutdown()
    for call in (hvd.size, hvd.rank, lambda: hvd.allreduce(torch.ones(1))):
        with pytest.raises(ValueError, match=r"call hvd\.init\(\) first"):
            call()
    hvd.init()  # no cluster engine here: a world of one rank, as Horovod without horovodrun
    try:
        assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.cross_size()) == (1, 0, 1, 1)
        t = torch.tensor([1.0, 2.0])
        assert torch.equal(hvd.allreduce(t), t) and hvd.allgather(t).shape == (2,)
        assert hvd.broadcast_object("x") == "x" and hvd.allgather_object(1) == [1]
        assert hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum)).tolist() == [1.0, 2.0]
        assert hvd.join() == 0
    finally:
        hvd.shutdown()
    assert not hvd.is_initialized()
