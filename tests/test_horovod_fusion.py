"""hvd.DistributedOptimizer's Tensor Fusion and the timeline on 4 real ranks (one cluster for
the module):

- HOROVOD_FUSION_THRESHOLD sets how many fused all-reduces a step makes, counted in the trace;
- HOROVOD_TIMELINE and start_timeline write one Chrome trace, on rank 0, of every rank;
- on one rank the optimizer steps as the one it wraps and sends nothing.
"""

from __future__ import annotations

import json

import cloudpickle
import pytest
import torch

import lib_dist.horovod as hvd
from lib_dist.cluster import Cluster

import hvd_models
from hvd_models import N, all_reduces, batch, build, forward, params

cloudpickle.register_pickle_by_value(hvd_models)  # the engines cannot import it from tests/
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=30) as c:
        yield c


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
