"""The data-parallel helpers course/04 narrates with: ShardedBatches (N ranks' k-th batches are
one process's k-th batch of N * B), the timeline drawing and its Chrome trace, and the
compute-against-communication estimate."""

from __future__ import annotations

import json

import matplotlib
import pytest
import torch

from lib_dist.comm import AlphaBeta
from lib_dist.comm.algorithms import RING
from lib_dist.data_parallel import ShardSampler
from lib_dist.data_parallel.batches import ShardedBatches
from lib_dist.data_parallel.cost import estimate_step, gradient_all_reduce_time, gpt2_params
from lib_dist.data_parallel.plots import chrome_trace, plot_timeline
from lib_dist.data_parallel.timeline import Mark, StepLog

matplotlib.use("Agg")


def stream(n: int, world: int, rank: int, batch: int, **options) -> ShardedBatches:
    ids = torch.arange(n)
    return ShardedBatches(ids, ids * 10, batch, ShardSampler(n, world, rank, **options))


@pytest.mark.parametrize("n, world, batch", [(103, 4, 5), (64, 2, 8), (30, 3, 2)])
def test_the_ranks_kth_batches_are_one_process_kth_batch(n, world, batch):
    ranks = [stream(n, world, r, batch, seed=3) for r in range(world)]
    single = stream(n, 1, 0, world * batch, seed=3)
    steps = min(s.batches_per_epoch for s in ranks + [single])
    for _ in range(2 * steps):  # two epochs: both reshuffle alike
        xs, ys = zip(*(next(s) for s in ranks))
        x, y = next(single)
        assert sorted(torch.cat(xs).tolist()) == sorted(x.tolist())
        assert torch.equal(torch.cat(ys), torch.cat(xs) * 10)
        if single.position == single.batches_per_epoch:  # keep the streams in step
            for s in ranks:
                s.position = s.batches_per_epoch


def test_epochs_reshuffle_drop_the_incomplete_batch_and_resume():
    s = stream(10, 2, 1, 2, seed=0)  # a shard of 5: two batches per epoch, one index dropped
    assert s.batches_per_epoch == 2
    epoch0 = [next(s)[0].tolist() for _ in range(2)]
    epoch1 = [next(s)[0].tolist() for _ in range(2)]
    assert epoch0 != epoch1 and s.epoch == 1
    shard = ShardSampler(10, 2, 1, seed=0)
    assert sum(epoch0, []) == list(shard)[:4]
    state = s.state_dict()
    after = [next(s)[0].tolist() for _ in range(3)]
    resumed = stream(10, 2, 1, 2, seed=0)
    resumed.load_state_dict(state)
    assert [next(resumed)[0].tolist() for _ in range(3)] == after


def test_sharded_batches_reject_mismatches():
    ids = torch.arange(8)
    with pytest.raises(ValueError, match="rows"):
        ShardedBatches(ids, ids[:7], 2, ShardSampler(8, 2, 0))
    with pytest.raises(ValueError, match="shards 9"):
        ShardedBatches(ids, ids, 2, ShardSampler(9, 2, 0))
    with pytest.raises(ValueError, match="batch_size"):
        ShardedBatches(ids, ids, 5, ShardSampler(8, 2, 0))


def step_log(shift: float, buckets: int) -> StepLog:
    marks = [Mark("forward_start", shift), Mark("forward_end", shift + 1.0),
             Mark("backward_start", shift + 1.5)]
    marks += [Mark("bucket_start", shift + 2.0 + b, bucket=b, nbytes=100) for b in range(buckets)]
    marks.append(Mark("backward_end", shift + 2.5 + buckets))
    marks += [Mark("bucket_done", shift + 3.0 + buckets, bucket=b,
                   ran=(shift + 2.1 + b, shift + 2.9 + b)) for b in range(buckets)]
    return StepLog(marks)


def test_the_timeline_draws_every_span_of_every_rank():
    logs = [step_log(0.5 * r, 3) for r in range(4)]
    ax = plot_timeline(logs)
    assert len(ax.collections) == 4 * (2 + 3)  # forward, backward and 3 all-reduces per rank
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 3", "rank 2", "rank 1",
                                                            "rank 0"]
    starts = [line for line in ax.lines if line.get_marker() == "v"]
    assert sum(len(line.get_xdata()) for line in starts) == 4 * 3
    assert min(x for line in starts for x in line.get_xdata()) == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="no marks"):
        plot_timeline([StepLog()])


def test_the_chrome_trace_has_a_process_per_rank_and_writes_its_file(tmp_path):
    logs = [step_log(10.0 + r, 2) for r in range(3)]
    path = tmp_path / "deeper" / "step.json"
    doc = chrome_trace(logs, path)
    assert json.loads(path.read_text()) == doc
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 3 * (2 + 2)
    assert {e["pid"] for e in spans} == {0, 1, 2}
    assert {e["tid"] for e in spans if e["cat"] == "communication"} == {1}
    first = min(spans, key=lambda e: e["ts"])
    assert first["ts"] == 0 and first["name"] == "forward" and first["dur"] == pytest.approx(1e6)
    assert len([e for e in doc["traceEvents"] if e["ph"] == "i"]) == 3 * 2
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"rank 0", "rank 1", "rank 2", "compute", "communication"}


def test_the_estimate_is_the_ring_formula_and_six_flops_per_parameter_and_token():
    net = AlphaBeta(alpha=10e-6, beta=12.5e9)
    e = estimate_step(1000, 8, 50, net, flops=1e9, bucket_bytes=1500)
    assert e.buckets == 3  # 4000 bytes: 1500, 1500, 1000
    assert e.communication == pytest.approx(2 * RING.cost(8, 1500, net) + RING.cost(8, 1000, net))
    assert e.communication == pytest.approx(2 * 7 * 3 * net.alpha + 2 * 7 / 8 * 4000 / net.beta)
    assert e.compute == pytest.approx(6 * 1000 * 50 / 1e9)
    assert e.forward == pytest.approx(e.compute / 3)
    assert e.without_overlap == pytest.approx(e.compute + e.communication)
    assert e.with_overlap == pytest.approx(e.forward + max(e.backward, e.communication))
    assert gradient_all_reduce_time(1, 4000, net, 1500) == (0.0, 3)
    with pytest.raises(ValueError):
        estimate_step(0, 8, 50, net, 1e9)


def test_gpt2_sizes_have_their_usual_parameter_counts():
    counts = gpt2_params()
    assert counts["gpt2"] == 124_439_808  # the 124M model, head tied to the embedding
    assert [round(c / 1e6) for c in counts.values()] == [124, 355, 774, 1558]
