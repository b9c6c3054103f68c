"""DataParallel on 4 real ranks (ipyparallel engines, a gloo group): every rank ends with the
parameters of one process trained on the whole batch, and with those of torch's own
DistributedDataParallel; the buckets' all-reduces start during backward and run inside the
intervals the timeline gives them (the communicator's trace says when they really ran)."""

from __future__ import annotations

import cloudpickle
import pytest
import torch

import data_parallel_models as dpm

from lib_dist.cluster import Cluster
from lib_dist.data_parallel import DataParallel

cloudpickle.register_pickle_by_value(dpm)  # the engines cannot import it from tests/
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

WORLD, PER_RANK, STEPS, BUCKET_BYTES = 4, 3, 3, 200


def train_both_ways(comm, opt_name, data):
    from torch.nn.parallel import DistributedDataParallel

    mine = [dpm.shard(b, comm.rank, comm.world_size) for b in data]
    model = dpm.Toy(seed=100 + comm.rank)
    ours = DataParallel(model, comm, bucket_bytes=BUCKET_BYTES)
    dpm.train(ours, dpm.optimizer(opt_name, ours), mine)
    reference = dpm.Toy(seed=100 + comm.rank)
    theirs = DistributedDataParallel(reference, find_unused_parameters=True,
                                     bucket_cap_mb=BUCKET_BYTES / 2**20)
    dpm.train(theirs, dpm.optimizer(opt_name, theirs), mine)
    return (dpm.params(model), dpm.grads(model), dpm.params(reference),
            list(ours.timeline.finished), len(ours.buckets.layout()))


@pytest.fixture(scope="module")
def cluster():
    with Cluster(WORLD, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def trained(cluster):
    data = dpm.batches(STEPS, WORLD, PER_RANK, seed=11, trigger_rank=WORLD - 1)
    results = cluster.run(train_both_ways, "adamw", data)
    return data, results, cluster.trace


def test_every_rank_equals_one_process_and_torchs_ddp(trained):
    data, results, _ = trained
    want = dpm.params(dpm.oracle(100, "adamw", data))
    for ours, grads, ddp, _, _ in results:
        dpm.assert_same_params(ours, want)
        dpm.assert_same_params(ours, ddp)
        assert grads["never.weight"] is None and grads["frozen.weight"] is None


def test_buckets_start_during_backward_and_the_trace_shows_when_they_ran(trained):
    _, results, trace = trained
    for rank, (_, _, _, logs, n_buckets) in enumerate(results):
        assert n_buckets > 2 and len(logs) == STEPS
        reduces = [e for e in trace.of_rank(rank) if e.kind == "all_reduce"]
        assert len(reduces) == STEPS * n_buckets  # one all-reduce per bucket and step
        done = [m for log in logs for m in log.of("bucket_done")]
        started = [m for log in logs for m in log.of("bucket_start")]
        for mark, start, event in zip(done, started, sorted(reduces, key=lambda e: e.start)):
            assert event.nbytes == start.nbytes
            assert mark.ran is not None
            assert start.time <= mark.ran[0] <= event.start <= event.end <= mark.ran[1]
        for log in logs:
            assert log.buckets_started() == list(range(n_buckets))  # the same order everywhere
            assert 0 in log.started_during_backward()  # overlapped with backward


def test_the_trace_exports_a_timeline_per_rank(trained):
    _, _, trace = trained
    rows = trace.to_chrome_trace()["traceEvents"]
    assert {r["tid"] for r in rows if r.get("name") == "all_reduce"} == set(range(WORLD))
    spans = trained[1][0][3][-1].spans()
    assert [s.name for s in spans][:2] == ["forward", "backward"]
    assert any(s.kind == "communication" for s in spans)
    assert all(s.end >= s.start for s in spans)


GPT_CONFIG = dict(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)


def wrap_gpt(comm):
    from lib_dist.models.gpt import GPT, GPTConfig

    torch.manual_seed(comm.rank)
    model = DataParallel(GPT(GPTConfig(**GPT_CONFIG)), comm)
    tensors = list(model.parameters()) + list(model.buffers())  # the buffer is a bool mask
    return [t.detach().clone() for t in tensors]


def test_a_gpt_seeded_differently_per_rank_starts_from_rank_0s_parameters(cluster):
    from lib_dist.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    rank_0s = GPT(GPTConfig(**GPT_CONFIG))
    want = list(rank_0s.parameters()) + list(rank_0s.buffers())
    assert want[-1].dtype == torch.bool  # the causal mask
    for tensors in cluster.run(wrap_gpt):
        assert len(tensors) == len(want)
        assert all(torch.equal(a, b) for a, b in zip(tensors, want))
