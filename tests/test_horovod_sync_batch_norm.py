"""lib_dist.horovod's SyncBatchNorm against its oracle, torch's BatchNorm over the concatenated
batch in one process: outputs, running statistics over several steps, the gradients of every
rank's input and of the weights, and eval mode; on simulated ranks and on 2 real ones. Also a
grouped operation over tensors on two devices, which Horovod refuses as well."""

from __future__ import annotations

import threading

import cloudpickle
import pytest
import torch

import hvd_ranks
import lib_dist.horovod as hvd
from hvd_ranks import failure, on_ranks
from lib_dist.cluster import Cluster

pytestmark = [pytest.mark.timeout(180)]
cloudpickle.register_pickle_by_value(hvd_ranks)  # the engines cannot import it from tests/
# float32 sums over at most 4 x 2 x 5 = 40 elements per channel, then a square root: a few
# ulps of the values (of order 1) apart from the one-process order of summation
RTOL, ATOL = 1e-5, 1e-6
SHAPES = {1: (8, 3), 2: (8, 3, 5), 3: (8, 3, 2, 5)}  # BatchNorm1d on (B, C) and (B, C, L); 2d
# simulated ranks on CPU; CUDA at 1 rank only: autograd runs CUDA backward passes on a thread
# of its own, outside the ranks' threads (test_a_thread_outside_the_simulated_ranks_is_told_so)
RANKS = [(1, "cpu"), (2, "cpu"), (4, "cpu"), pytest.param(1, "cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))]


def batches(dims: int, steps: int, device: str = "cpu") -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(dims)
    return [(torch.randn(*SHAPES[dims], generator=gen) * 3 + 1).to(device) for _ in range(steps)]


def oracle(dims: int, steps: int, momentum: float | None, device: str = "cpu") -> dict:
    """One process normalising every rank's batch together."""
    torch.manual_seed(0)
    bn = (torch.nn.BatchNorm2d if dims == 3 else torch.nn.BatchNorm1d)(3, momentum=momentum)
    bn.to(device)
    out: dict = {"outputs": [], "input_grads": []}
    for x in batches(dims, steps, device):
        x = x.clone().requires_grad_()
        y = bn(x)
        (y * torch.arange(y.numel(), device=device).view_as(y).sin()).sum().backward()  # uneven
        out["outputs"].append(y.detach())
        out["input_grads"].append(x.grad)
    out["running"] = (bn.running_mean.clone(), bn.running_var.clone())
    out["weight_grads"] = (bn.weight.grad, bn.bias.grad)
    bn.eval()
    out["eval"] = bn(batches(dims, 1, device)[0]).detach()
    return out


def synced(rank: int, n: int, dims: int, steps: int, momentum: float | None,
           device: str = "cpu") -> dict:
    """Each rank normalises its slice of the same batches with SyncBatchNorm."""
    torch.manual_seed(0)
    bn = hvd.SyncBatchNorm(3, momentum=momentum).to(device)
    mine = slice(rank * 8 // n, (rank + 1) * 8 // n)
    out: dict = {"outputs": [], "input_grads": []}
    everything = torch.Size(SHAPES[dims]).numel()
    for x in batches(dims, steps, device):
        x = x[mine].clone().requires_grad_()
        y = bn(x)
        weights = torch.arange(everything, device=device).view(SHAPES[dims]).sin()[mine]
        (y * weights).sum().backward()
        out["outputs"].append(y.detach())
        out["input_grads"].append(x.grad)
    out["running"] = (bn.running_mean.clone(), bn.running_var.clone())
    out["weight_grads"] = (hvd.allreduce(bn.weight.grad, op=hvd.Sum),
                           hvd.allreduce(bn.bias.grad, op=hvd.Sum))
    bn.eval()
    out["eval"] = bn(batches(dims, 1, device)[0][mine]).detach()
    out["too_flat"] = failure(lambda: bn(torch.ones(3, device=device)))
    bn.train()
    out["one_value"] = failure(lambda: bn(torch.ones(1 if rank == 0 else 0, 3, device=device)))
    out["mixed_devices"] = failure(
        lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, device="meta")]))
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def assert_matches_oracle(results: list[dict], n: int, dims: int, steps: int,
                          momentum: float | None, device: str = "cpu") -> None:
    want = oracle(dims, steps, momentum, device)
    for step in range(steps):
        for key in ("outputs", "input_grads"):
            got = torch.cat([r[key][step] for r in results])
            assert close(got, want[key][step]), (key, step, (got - want[key][step]).abs().max())
    for r in results:
        for key in ("running", "weight_grads"):
            for got, expected in zip(r[key], want[key]):
                assert close(got, expected), (key, got, expected)
        assert "expected an input (batch, channels, ...) of at least 2 dimensions" in r["too_flat"]
        assert "expected more than 1 value per channel over all ranks" in r["one_value"]
        assert r["mixed_devices"] == ("RuntimeError: grouped_allreduce: the tensors are on cpu "
                                      "and meta; put every tensor of a group on one device")
    assert close(torch.cat([r["eval"] for r in results]), want["eval"])


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("n, device", RANKS)
def test_sync_batch_norm_is_batch_norm_of_the_whole_batch(n, device, dims):
    results = on_ranks(n, synced, n, dims, 3, 0.1, device)
    assert_matches_oracle(results, n, dims, 3, 0.1, device)


def test_cumulative_running_statistics_as_batch_norms_momentum_none():
    assert_matches_oracle(on_ranks(4, synced, 4, 2, 4, None), 4, 2, 4, None)


def on_a_rank(comm, dims: int, steps: int) -> dict:
    hvd.init()
    return synced(hvd.rank(), hvd.size(), dims, steps, 0.1)


def test_on_real_ranks():
    with Cluster(2) as cluster:
        results = cluster.run(on_a_rank, 3, 2)
    assert_matches_oracle(results, 2, 3, 2, 0.1)


def test_a_thread_outside_the_simulated_ranks_is_told_so():
    """As autograd's CUDA thread is: not "call hvd.init() first", which the rank did."""
    def from_another_thread(rank):
        result = []
        worker = threading.Thread(target=lambda: result.append(failure(hvd.rank)))
        worker.start()
        worker.join()
        return result[0]

    for said in on_ranks(2, from_another_thread):
        assert "this thread is none of the simulated ranks" in said, said
        assert "a Cluster (a process per rank) takes GPU tensors" in said
    assert "call hvd.init() first" in failure(hvd.rank)  # none left: plain "not initialized"
