"""hvd.DistributedOptimizer on 4 real ranks (one cluster for the module), against an oracle
each rank computes itself: the same model trained by one process on the whole batch.

- averaged gradients equal the whole batch's (momentum, a frozen and an unused parameter,
  a metric all-reduced while the gradients' buckets are in flight); Sum; the predivide factor;
- backward_passes_per_step=2 accumulates two passes before sending, and refuses a third;
- synchronize() then skip_synchronize() for loss scaling and clipping sends nothing twice;
Tensor Fusion and the timeline are in test_horovod_fusion.py.
"""

from __future__ import annotations

import cloudpickle
import pytest
import torch

from lib_dist.cluster import Cluster

import hvd_models
from hvd_models import B, N, all_reduces, batch, build, forward, params, shard

cloudpickle.register_pickle_by_value(hvd_models)  # the engines cannot import it from tests/
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=30) as c:
        yield c


def train(comm, op_name, predivide, lr_scale):
    import copy

    import torch
    import torch.nn.functional as F

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    model = build(seed=r)  # different on every rank until the broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    oracle = copy.deepcopy(model)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1 * lr_scale, momentum=0.9),
        named_parameters=model.named_parameters(), op=getattr(hvd, op_name),
        gradient_predivide_factor=predivide)
    reference = torch.optim.SGD(oracle.parameters(), lr=0.1, momentum=0.9)
    sent, metrics = len(all_reduces(comm)), []
    for step in range(3):
        x, y = shard(step, r)
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(model, x), y)
        loss.backward()  # the gradients' all-reduce is under way
        metrics.append(hvd.allreduce(loss.detach(), name="loss").item())  # queued behind it
        optimizer.step()
        x, y = batch(step, N * B)
        reference.zero_grad()
        whole = F.cross_entropy(forward(oracle, x), y)
        whole.backward()
        reference.step()
        metrics[-1] -= whole.item()  # the average of the ranks' losses is the whole batch's
    return dict(params=params(model), oracle=params(oracle), metrics=metrics,
                sent=len(all_reduces(comm)) - sent,
                grads={k: p.grad is None for k, p in model.named_parameters()},
                is_sgd=isinstance(optimizer, torch.optim.SGD))


@pytest.mark.parametrize("op_name, predivide, lr_scale", [
    ("Average", 1.0, 1), ("Average", 4.0, 1), ("Sum", 1.0, 1 / N)])
def test_averaged_gradients_train_as_one_process_on_the_whole_batch(cluster, op_name,
                                                                    predivide, lr_scale):
    results = cluster.run(train, op_name, predivide, lr_scale)
    for got in results:
        assert got["is_sgd"]
        for name, value in got["params"].items():
            assert torch.equal(value, results[0]["params"][name])  # every replica the same
            torch.testing.assert_close(value, got["oracle"][name], rtol=1e-5, atol=1e-6)
        assert max(abs(m) for m in got["metrics"]) < 1e-5
        assert got["sent"] == 3 * 2  # per step: one fused bucket, one metric
        # frozen and unused parameters have no gradient, as in one process
        assert [k for k, none in got["grads"].items() if none] == [
            "frozen.weight", "frozen.bias", "unused.weight", "unused.bias"]


def accumulate(comm):
    import copy

    import torch
    import torch.nn.functional as F

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    model = build(seed=0)
    oracle = copy.deepcopy(model)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    reference = torch.optim.SGD(oracle.parameters(), lr=0.1)
    out = {"sent_per_pass": []}
    for step in range(2):
        optimizer.zero_grad()
        reference.zero_grad()
        for micro in range(2):
            before = len(all_reduces(comm))
            x, y = shard(10 * step + micro, r)
            F.cross_entropy(forward(model, x), y).backward()
            out["sent_per_pass"].append(len(all_reduces(comm)) - before)
            x, y = batch(10 * step + micro, N * B)
            F.cross_entropy(forward(oracle, x), y).backward()
        if step == 0:
            try:
                optimizer.zero_grad()
            except AssertionError as e:
                out["zero_grad"] = str(e)
        optimizer.step()
        reference.step()
    out["params"], out["oracle"] = params(model), params(oracle)
    optimizer.zero_grad()
    try:
        for micro in range(3):
            x, y = shard(micro, r)
            F.cross_entropy(forward(model, x), y).backward()
    except AssertionError as e:
        out["third"] = str(e)
    return out


def test_backward_passes_per_step_accumulates_before_sending(cluster):
    for got in cluster.run(accumulate):
        # the first pass sends nothing; the second fills the bucket, whose all-reduce starts
        # in backward (and is usually done before backward returns, so counted there or not)
        assert got["sent_per_pass"][0] == got["sent_per_pass"][2] == 0
        for name, value in got["params"].items():
            torch.testing.assert_close(value, got["oracle"][name], rtol=1e-5, atol=1e-6)
        assert "zero_grad() between loss.backward() and optimizer.step()" in got["zero_grad"]
        assert "more than backward_passes_per_step=2 times" in got["third"]


def scaled_and_clipped(comm):
    import copy
    import warnings

    import torch
    import torch.nn.functional as F

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    model = build(seed=0)
    oracle = copy.deepcopy(model)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters())
    reference = torch.optim.SGD(oracle.parameters(), lr=0.5)
    scale, sent = 1024.0, []
    for step in range(2):
        for net, opt, (x, y) in ((model, optimizer, shard(step, r)),
                                 (oracle, reference, batch(step, N * B))):
            opt.zero_grad()
            before = len(all_reduces(comm))
            (F.cross_entropy(forward(net, x), y) * scale).backward()
            if opt is optimizer:
                optimizer.synchronize()  # the averaged, still scaled gradients
            for p in net.parameters():
                if p.grad is not None:
                    p.grad /= scale
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
            if opt is optimizer:
                with optimizer.skip_synchronize():
                    optimizer.step()
                sent.append(len(all_reduces(comm)) - before)
            else:
                opt.step()
    trained = params(model)
    x, y = shard(5, r)
    F.cross_entropy(forward(model, x), y).backward()
    optimizer.synchronize()
    before = len(all_reduces(comm))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()  # outside skip_synchronize: warned, not sent again
    return dict(params=trained, oracle=params(oracle), sent=sent,
                warned=[str(w.message) for w in caught], resent=len(all_reduces(comm)) - before)


def test_synchronize_then_skip_synchronize_for_loss_scaling_and_clipping(cluster):
    for got in cluster.run(scaled_and_clipped):
        for name, value in got["params"].items():
            torch.testing.assert_close(value, got["oracle"][name], rtol=1e-5, atol=1e-6)
        assert got["sent"] == [1, 1]  # the bucket, once: step inside skip sends nothing
        assert got["resent"] == 0
        assert any("already synchronized" in w for w in got["warned"])
