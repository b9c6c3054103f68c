"""hvd.DistributedOptimizer on 4 real ranks (one cluster for the module), against an oracle
each rank computes itself: the same model trained by one process on the whole batch.

- averaged gradients equal the whole batch's (momentum, a frozen and an unused parameter,
  a metric all-reduced while the gradients' buckets are in flight); Sum; the predivide factor;
- backward_passes_per_step=2 accumulates two passes before sending, and refuses a third;
- synchronize() then skip_synchronize() for loss scaling and clipping sends nothing twice;
- HOROVOD_FUSION_THRESHOLD sets how many fused all-reduces a step makes, counted in the trace;
- HOROVOD_TIMELINE and start_timeline write one Chrome trace, on rank 0, of every rank.
"""

from __future__ import annotations

import json

import pytest
import torch

import lib_dist.horovod as hvd
from lib_dist.cluster import Cluster

pytestmark = pytest.mark.timeout(180)
N, B = 4, 8  # ranks, examples per rank and step


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=30) as c:
        yield c


def build(seed):
    """A small classifier with a frozen layer and a layer forward never uses."""
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict(dict(frozen=torch.nn.Linear(6, 6), hidden=torch.nn.Linear(6, 5),
                                     out=torch.nn.Linear(5, 3), unused=torch.nn.Linear(2, 2)))
    model["frozen"].requires_grad_(False)
    return model


def forward(model, x):
    return model["out"](torch.tanh(model["hidden"](model["frozen"](x))))


def batch(step, n):
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def shard(step, rank):
    x, y = batch(step, N * B)
    return x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def all_reduces(comm):
    return [e for e in comm.trace.events if e.kind == "all_reduce"]


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


def fusion(comm, thresholds):
    import os

    import torch

    import lib_dist.horovod as hvd

    out = {}
    try:
        for threshold in thresholds:
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(threshold)
            hvd.shutdown()
            hvd.init()
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
            for _ in range(2):  # wrapped twice: the second wrapper's hooks replace the first's
                optimizer = hvd.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.1),
                    named_parameters=model.named_parameters())
            before = len(all_reduces(comm))
            model(torch.randn(4, 10)).sum().backward()
            # every bucket's all-reduce was started by the hooks, during backward
            out[threshold, "started"] = [b.handle is not None
                                         for b in optimizer._hvd.buckets.buckets]
            optimizer.step()
            out[threshold] = [e.nbytes for e in all_reduces(comm)[before:]]
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "lots"
        hvd.shutdown()
        try:
            hvd.init()
        except ValueError as e:
            out["bad"] = str(e)
    finally:
        os.environ.pop("HOROVOD_FUSION_THRESHOLD", None)
        hvd.shutdown()
        hvd.init()
    return out


def test_fusion_threshold_sets_the_number_of_fused_allreduces(cluster):
    # gradients from the last parameter back: bias 40 B, weight 400 B, bias 40 B, weight 400 B;
    # each bucket also carries one 4-byte flag per tensor (which ranks had a gradient)
    for got in cluster.run(fusion, [0, 440, 480, 128 * 2**20]):
        assert got[0] == [44, 404, 44, 404]  # 0: no fusion, one all-reduce per tensor
        assert got[440] == [448, 448]  # bias and weight of each layer
        assert got[480] == [492, 404]  # three tensors fit in 480 bytes, the fourth does not
        assert got[128 * 2**20] == [896]  # Horovod's default: everything in one
        for threshold, sizes in ((0, 4), (440, 2), (480, 2), (128 * 2**20, 1)):
            assert got[threshold, "started"] == [True] * sizes
        assert "HOROVOD_FUSION_THRESHOLD must be a number of bytes" in got["bad"]


def timelines(comm, directory):
    import os

    import torch

    import lib_dist.horovod as hvd

    r = comm.rank
    os.environ["HOROVOD_TIMELINE"] = os.path.join(directory, "env.json")
    try:
        hvd.shutdown()
        hvd.init()  # records from here
    finally:
        del os.environ["HOROVOD_TIMELINE"]
    model = torch.nn.Sequential(torch.nn.Linear(50, 50), torch.nn.Linear(50, 3))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.allreduce(torch.ones(3), name="avg_loss")
    hvd.synchronize(hvd.allgather_async(torch.ones(r + 1), name="rows"))
    model(torch.randn(4, 50)).sum().backward()
    optimizer.step()
    hvd.shutdown()  # writes env.json on rank 0
    hvd.init()
    hvd.start_timeline(os.path.join(directory, f"started-by-rank-{r}.json"))
    hvd.broadcast(torch.ones(2), root_rank=1, name="weights")
    hvd.stop_timeline()


def test_the_timeline_is_one_chrome_trace_of_every_rank_written_by_rank_0(cluster, tmp_path):
    cluster.run(timelines, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.json", "started-by-rank-0.json"]
    trace = json.loads((tmp_path / "env.json").read_text())  # what Perfetto / chrome load
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == set(range(N))
    assert all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)
    for rank in range(N):
        mine = [e["name"] for e in spans if e["tid"] == rank]
        assert {"ALLREDUCE avg_loss", "ALLGATHER rows"} <= set(mine)
        assert mine.count("ALLREDUCE fused 4 tensors: 1.bias, 1.weight, 0.bias, 0.weight") == 1
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert rows == {f"rank {r}" for r in range(N)}
    assert min(e["ts"] for e in spans) == 0 and all(e["dur"] > 0 for e in spans)
    started = json.loads((tmp_path / "started-by-rank-0.json").read_text())
    assert {e["name"].removeprefix("QUEUE ") for e in started["traceEvents"]
            if e["ph"] == "X"} == {"BROADCAST weights"}  # from start_timeline to stop_timeline


def test_one_rank_steps_as_the_wrapped_optimizer_and_sends_nothing():
    hvd.shutdown()
    hvd.init()
    try:
        model = build(seed=0)
        plain = build(seed=0)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             compression=hvd.Compression.fp16)
        reference = torch.optim.SGD(plain.parameters(), lr=0.1)
        for step in range(2):
            for net, opt in ((model, optimizer), (plain, reference)):
                opt.zero_grad()
                x, y = batch(step, 8)
                torch.nn.functional.cross_entropy(forward(net, x), y).backward()
                opt.step()
        for name, value in params(model).items():
            assert torch.equal(value, params(plain)[name])
        with pytest.raises(ValueError, match="leaves out 8 of the optimizer's parameters"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=[])
        with pytest.raises(NotImplementedError, match="num_groups / groups"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), num_groups=2)
    finally:
        hvd.shutdown()
