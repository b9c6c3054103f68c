"""lib_dist.horovod's sparse all-reduce (`sparse_allreduce_async`) and DistributedOptimizer with
sparse gradients (`nn.Embedding(sparse=True)`), on simulated ranks (threads: fast) and on 4
real ranks, each against an oracle: the dense all-reduce of the same tensors, and one process
training on every rank's batch.
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
EPS = torch.finfo(torch.float32).eps


def random_sparse(seed: int, *shape: int) -> torch.Tensor:
    """About a fifth of the entries non-zero, as Horovod's own test draws them."""
    t = torch.rand(*shape, generator=torch.Generator().manual_seed(seed))
    t[t < 0.8] = 0
    return t


def sums(r, n):
    out = {}
    for op in ("Average", "Sum"):
        tensors = [random_sparse(100 * r + i, rows, 10) for i, rows in enumerate([17, 1, 81])]
        handles = [hvd.sparse_allreduce_async(t.to_sparse(), name=f"{op}.{i}", op=getattr(hvd, op))
                   for i, t in enumerate(tensors)]
        out[op] = [(h(), hvd.allreduce(t, op=getattr(hvd, op))) for h, t in zip(handles, tensors)]
        out[op + " nnz"] = [t.count_nonzero().item() for t in tensors]
    rows = torch.zeros(6, 2)
    rows[r] = torch.tensor([1.0, 2.0])  # one row per rank: sparse in rows, dense within them
    out["hybrid"] = hvd.sparse_allreduce_async(rows.to_sparse(1), op=hvd.Sum)()
    ints = torch.tensor([0, r + 1, 0, 5])
    out["ints"] = (hvd.sparse_allreduce_async(ints.to_sparse())().to_dense(), hvd.allreduce(ints))
    out["one empty"] = hvd.sparse_allreduce_async(
        (torch.eye(3) * (r != 1)).to_sparse(), op=hvd.Sum)().to_dense()
    out["all empty"] = hvd.sparse_allreduce_async(torch.zeros(3, 2).to_sparse())()
    handle = hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), name="again")
    out["again"] = handle() is handle() and handle.poll()
    return out


def test_sparse_allreduce_is_the_dense_allreduce_of_the_same_tensors():
    n = 3
    results = on_ranks(n, sums, n)
    for got in results:
        for op in ("Average", "Sum"):
            for (sparse, dense), theirs, nnz in zip(got[op], results[0][op],
                                                    zip(*(g[op + " nnz"] for g in results))):
                assert sparse.is_sparse and sparse.is_coalesced()
                assert torch.equal(sparse.to_dense(), theirs[0].to_dense())  # same everywhere
                assert sparse._nnz() <= sum(nnz)  # only entries some rank had travel
                # the same n terms added in another order: at most n - 1 roundings apart
                torch.testing.assert_close(sparse.to_dense(), dense, rtol=n * EPS, atol=0)
        hybrid = got["hybrid"]
        assert (hybrid.sparse_dim(), hybrid.dense_dim()) == (1, 1)
        assert hybrid.to_dense().tolist() == [[1.0, 2.0]] * n + [[0.0, 0.0]] * (6 - n)
        sparse, dense = got["ints"]  # an integer average truncates, as allreduce's does
        assert sparse.tolist() == dense.tolist() == [0, (1 + 2 + 3) // 3, 0, 5]
        assert torch.equal(got["one empty"], torch.eye(3) * (n - 1))
        assert got["all empty"]._nnz() == 0 and got["all empty"].shape == (3, 2)
        assert got["again"]


def mismatches(r, n):
    out = {
        "size": failure(lambda: hvd.sparse_allreduce_async(
            torch.eye(3 + (r == 1)).to_sparse(), name="size")()),
        "dims": failure(lambda: hvd.sparse_allreduce_async(
            torch.eye(2).to_sparse(1 + (r == 2)), name="dims")()),
        "dtype": failure(lambda: hvd.sparse_allreduce_async(
            torch.eye(2, dtype=torch.float64 if r == 0 else torch.float32).to_sparse(),
            name="dtype")()),
        "op": failure(lambda: hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), op=hvd.Max)),
        "dense": failure(lambda: hvd.sparse_allreduce_async(torch.eye(2))),
        "allreduce": failure(lambda: hvd.allreduce(torch.eye(2).to_sparse())),
    }
    out["after"] = hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), op=hvd.Sum)().to_dense()
    return out


def test_ranks_that_disagree_fail_on_every_rank_and_the_group_goes_on():
    n = 3
    for got in on_ranks(n, mismatches, n):
        assert got["size"].startswith("HorovodInternalError: sparse_allreduce 'size.indices': "
                                      "the ranks disagree on the size")
        assert "rank 0: size (3, 3); rank 1: size (4, 4); rank 2: size (3, 3)" in got["size"]
        assert "disagree on the shape and the sparse_dims" in got["dims"]
        assert "'dtype.values': the ranks disagree on the dtype (rank 0: dtype float64" in \
            got["dtype"]
        assert got["op"] == ("NotImplementedError: sparse_allreduce_async supports "
                             "op=hvd.Average and hvd.Sum, not hvd.Max")
        assert got["dense"].startswith("TypeError: sparse_allreduce_async needs a sparse COO")
        assert "hvd.sparse_allreduce_async" in got["allreduce"]
        assert torch.equal(got["after"], torch.eye(2) * n)


def embedding_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict(dict(emb=torch.nn.Embedding(12, 3, sparse=True),
                                    out=torch.nn.Linear(3, 1)))


def step_loss(model, rank, step):
    """Rank `rank`'s loss at `step`: rows of the table that overlap between ranks; at step 2
    rank 1 does not use the table at all (its gradient is None there)."""
    if step == 2 and rank == 1:
        return model["out"](torch.ones(1, 3)).sum()
    rows = torch.tensor([[rank, rank + 1, 5], [(rank + step) % 12, 7, 7]])
    return model["out"](model["emb"](rows)).pow(2).sum()


def train(r, n, as_dense, start):
    model = torch.nn.ModuleDict(dict(emb=torch.nn.Embedding(12, 3, sparse=True),
                                     out=torch.nn.Linear(3, 1)))
    model.load_state_dict(start)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=as_dense)
    layouts, sparse = [], []
    for step in range(3):
        opt.zero_grad()
        step_loss(model, r, step).backward()
        opt.step()
        layouts.append(sum(opt._hvd.buckets.layout(), []))
        sparse.append(model["emb"].weight.grad.is_sparse)
    return {k: v.clone() for k, v in model.state_dict().items()}, layouts, sparse


@pytest.mark.parametrize("as_dense", [False, True])
def test_sparse_gradients_train_as_one_process_on_every_ranks_batch(as_dense):
    n = 3
    oracle = embedding_model()
    start = {k: v.clone() for k, v in oracle.state_dict().items()}
    sgd = torch.optim.SGD(oracle.parameters(), lr=0.05)
    for step in range(3):
        sgd.zero_grad()
        (sum(step_loss(oracle, r, step) for r in range(n)) / n).backward()
        sgd.step()
    for params, layouts, sparse in on_ranks(n, train, n, as_dense, start):
        for name, value in oracle.state_dict().items():
            # three steps of sums of at most n * 4 terms of magnitude ~1
            torch.testing.assert_close(params[name], value, rtol=3 * 4 * n * EPS, atol=1e-6)
        assert sparse == [True] * 3  # the optimizer gets the gradient in its own layout
        # sparse: the table travels in the buckets in the first step only, as nothing
        assert layouts == ([["out.bias", "out.weight"]] * 3 if not as_dense else
                           [["out.bias", "out.weight", "emb.weight"]] * 3)


def on_real_ranks(comm):
    import torch
    import torch.distributed as dist

    import lib_dist.horovod as hvd

    hvd.init()
    r, n = comm.rank, comm.world_size
    t = torch.rand(40, 6, generator=torch.Generator().manual_seed(r))
    t[t < 0.8] = 0
    out = {"sum": hvd.sparse_allreduce_async(t.to_sparse(), op=hvd.Sum)().to_dense()}
    torch_sum = t.clone()
    dist.all_reduce(torch_sum)
    out["torch_sum"] = torch_sum
    evens, odds = hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])
    mine = evens if r % 2 == 0 else odds
    out["set"] = hvd.sparse_allreduce_async(t.to_sparse(), name="in set", process_set=mine)()
    out["set_dense"] = hvd.allreduce(t, process_set=mine)
    hvd.remove_process_set(odds)
    hvd.remove_process_set(evens)
    # Horovod's own example: SparseAdam, which takes sparse gradients only
    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 8, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1))
    before = len([e for e in comm.trace.events if e.kind == "all_reduce"])
    for step in range(3):
        opt.zero_grad()
        emb(torch.tensor([r, 10 + r, 500, step])).pow(2).sum().backward()
        opt.step()
    reduced = [e.nbytes for e in comm.trace.events if e.kind == "all_reduce"][before:]
    out["emb"], out["reduced"] = emb.weight.detach().clone(), reduced
    return out


@pytest.mark.cluster
def test_on_four_real_ranks_against_torch_distributed_and_process_sets():
    with Cluster(4, timeout=30) as cluster:
        results = cluster.run(on_real_ranks)
    for r, got in enumerate(results):
        torch.testing.assert_close(got["sum"], got["torch_sum"], rtol=4 * EPS, atol=0)
        assert torch.equal(got["set"].to_dense(), got["set_dense"])  # two terms: one order
        assert torch.equal(got["emb"], results[0]["emb"])  # every replica the same
        # the first step's bucket still holds the table's 8000 floats (as nothing); then none
        assert len(got["reduced"]) == 1 and got["reduced"][0] >= 1000 * 8 * 4
