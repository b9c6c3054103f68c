"""lib_dist.data_parallel on the simulated world (ranks as threads): N ranks of batch B end
with the parameters of one process trained on batch N * B (DataParallel and the naive
average_gradients, SGD and AdamW, world sizes 1-4, ranks seeded differently, frozen, tied and
unused parameters, the module-02 GPT in the module-02 training loop); buckets, overlap and
no_sync checked from the step timeline and the message trace, never from wall time."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import data_parallel_models as dpm

from lib_dist.comm import SimulatedWorld
from lib_dist.data_parallel import (
    DataParallel, average_gradients, broadcast_parameters, plan_buckets,
)
from lib_dist.errors import RankFailure
from lib_dist.models.gpt import GPT, GPTConfig
from lib_dist.train import train

pytestmark = pytest.mark.timeout(120)

PER_RANK, STEPS = 3, 3
SMALL_BUCKETS = 200  # bytes: several buckets for the toy model (its tensors are 24-288 bytes)


# -- the oracle: N ranks of batch B are one process of batch N * B --------------------------


def data_parallel_run(comm, opt_name, data, bucket_bytes):
    model = dpm.Toy(seed=100 + comm.rank)  # every rank starts different...
    differs = comm.rank > 0 and not torch.equal(model.body.weight, dpm.Toy(100).body.weight)
    dp = DataParallel(model, comm, bucket_bytes=bucket_bytes)  # ...until the broadcast
    data = [dpm.shard(b, comm.rank, comm.world_size) for b in data]
    dpm.train(dp, dpm.optimizer(opt_name, dp), data)
    return differs, dpm.params(model), dpm.grads(model), model.enc.weight is model.dec.weight


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_data_parallel_equals_one_process_on_the_whole_batch(world, opt_name):
    data = dpm.batches(STEPS, world, PER_RANK, seed=world, trigger_rank=world - 1)
    want = dpm.oracle(100, opt_name, data)
    results = SimulatedWorld(world).run(data_parallel_run, opt_name, data, SMALL_BUCKETS)
    for rank, (differed, params, grads, still_tied) in enumerate(results):
        assert differed == (rank > 0)
        dpm.assert_same_params(params, dpm.params(want))
        assert still_tied
        assert grads["never.weight"] is None and grads["never.bias"] is None  # as in `want`
        assert grads["frozen.weight"] is None
        assert grads["sometimes.weight"] is not None  # used on the last rank only
    assert want.never.weight.grad is None
    torch.testing.assert_close(results[0][1]["never.weight"], dpm.Toy(100).never.weight)


def naive_run(comm, opt_name, data):
    model = dpm.Toy(seed=100 + comm.rank)
    broadcast_parameters(comm, model)
    data = [dpm.shard(b, comm.rank, comm.world_size) for b in data]
    dpm.train(model, dpm.optimizer(opt_name, model), data,
              after_backward=partial(average_gradients, comm, model))
    return dpm.params(model)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_average_gradients_equals_one_process_on_the_whole_batch(world):
    data = dpm.batches(STEPS, world, PER_RANK, seed=world)  # `sometimes` unused everywhere
    want = dpm.params(dpm.oracle(100, "adamw", data))
    for params in SimulatedWorld(world).run(naive_run, "adamw", data):
        dpm.assert_same_params(params, want)


def gpt_run(comm, models, batches, steps):
    model = DataParallel(models[comm.rank], comm, bucket_bytes=4096)
    mine = iter([dpm.shard(b, comm.rank, comm.world_size) for b in batches])
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), mine, lm_loss, steps,
          progress=False)
    return dpm.params(model.module), len(model.buckets.layout())


def lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def test_gpt_with_tied_weights_in_the_module_02_training_loop():
    world, steps, config = 3, 3, GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2,
                                           n_embd=8)
    models = []
    for rank in range(world):
        torch.manual_seed(rank)
        models.append(GPT(config).double())
    assert models[0].head.weight is models[0].tok_emb.weight
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(11, (world * 2, 8), generator=generator),
                torch.randint(11, (world * 2, 8), generator=generator)) for _ in range(steps)]
    torch.manual_seed(0)
    single = GPT(config).double()
    train(single, torch.optim.AdamW(single.parameters(), lr=1e-2), iter(batches), lm_loss, steps,
          progress=False)
    for params, n_buckets in SimulatedWorld(world).run(gpt_run, models, batches, steps):
        dpm.assert_same_params(params, dpm.params(single))
        assert n_buckets > 1


# -- buckets -------------------------------------------------------------------------------


def mlp() -> nn.Sequential:
    """float32 tensors of 128, 32, 256, 32, 64 and 8 bytes, in registration order."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


MLP_LAYOUT_100 = [["4.bias", "4.weight"], ["2.bias"], ["2.weight"], ["0.bias"], ["0.weight"]]


def test_buckets_fill_in_reverse_registration_order_up_to_the_byte_limit():
    params = list(mlp().parameters())
    assert plan_buckets(params, 100) == [[5, 4], [3], [2], [1], [0]]  # 2.weight: 256 > 100
    assert plan_buckets(params, 10**6) == [[5, 4, 3, 2, 1, 0]]
    assert plan_buckets(params, 1) == [[5], [4], [3], [2], [1], [0]]
    mixed = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2, dtype=torch.float64)),
             nn.Parameter(torch.zeros(2, dtype=torch.float64))]
    assert plan_buckets(mixed, 10**6) == [[2, 1], [0]]  # one dtype per flat buffer


def one_step(comm, bucket_bytes, unused_first=False):
    model = DataParallel(mlp(), comm, bucket_bytes=bucket_bytes)
    start = len(comm.trace.of_rank(comm.rank))  # leave out the broadcast
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(comm.rank))
    if unused_first:  # the last layer's bias gets no gradient on rank 0: bucket 0 waits
        model.module[4].bias.requires_grad_(comm.rank != 0)
    model(x).square().mean().backward()
    sent = [e.nbytes for e in comm.trace.of_rank(comm.rank)[start:] if e.kind == "send"]
    return model.buckets.layout(), model.timeline.last, sent


def test_bucket_count_and_contents_show_in_the_trace():
    layout, log, sent = SimulatedWorld(2).run(one_step, 100)[1]
    assert layout == MLP_LAYOUT_100
    # rank 1 sends each bucket once (to rank 0, which sends back the sum): gradients + flags
    assert sent == [(2 + 16 + 2) * 4, (8 + 1) * 4, (64 + 1) * 4, (8 + 1) * 4, (32 + 1) * 4]
    assert log.buckets_started() == [0, 1, 2, 3, 4]
    assert [m.nbytes for m in log.of("bucket_start")] == sent


def test_all_reduces_start_during_backward_as_gradients_arrive():
    for layout, log, _ in SimulatedWorld(2).run(one_step, 100):
        assert log.hook_order() == ["4.bias", "4.weight", "2.bias", "2.weight", "0.bias",
                                    "0.weight"]  # backward goes from the last layer back
        assert log.position("bucket_start", 0) < log.position("backward_end")
        assert log.started_during_backward() == [0, 1, 2, 3, 4]
        # bucket 0 starts as soon as its second gradient is in, before the third arrives
        assert log.position("bucket_start", 0) < log.position("grad_ready") + 3
        done = log.of("bucket_done")
        assert [m.bucket for m in done] == [0, 1, 2, 3, 4]
        assert all(m.ran is not None and m.ran[0] <= m.ran[1] for m in done)
        assert [s.kind for s in log.spans()].count("communication") == 5


def test_buckets_start_in_order_even_when_an_earlier_one_waits_for_an_unused_gradient():
    logs = [log for _, log, _ in SimulatedWorld(2).run(one_step, 100, unused_first=True)]
    assert logs[0].started_during_backward() == []  # bucket 0 waits for 4.bias until the end
    assert logs[0].buckets_started() == [0, 1, 2, 3, 4]
    assert logs[1].started_during_backward() == [0, 1, 2, 3, 4]


# -- no_sync: gradient accumulation ---------------------------------------------------------


def accumulate(comm, data, micro):
    model = dpm.Toy(seed=100 + comm.rank)
    dp = DataParallel(model, comm, bucket_bytes=SMALL_BUCKETS)
    opt = dpm.optimizer("adamw", dp)
    events_before = []
    for batch in data:
        x, y = dpm.shard(batch, comm.rank, comm.world_size)
        opt.zero_grad(set_to_none=True)
        events_before.append(len(comm.trace.of_rank(comm.rank)))
        for i, (xs, ys) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            last = i == micro - 1
            if last:
                events_before.append(len(comm.trace.of_rank(comm.rank)))
            with nullcontext() if last else dp.no_sync():
                (F.cross_entropy(dp(xs), ys) / micro).backward()
        opt.step()
    return dpm.params(model), events_before, list(dp.timeline.finished)


def test_no_sync_sends_nothing_until_the_last_micro_batch_and_then_the_sum():
    world, micro = 2, 3
    data = dpm.batches(STEPS, world, PER_RANK * micro, seed=5, trigger_rank=world - 1)
    want = dpm.params(dpm.oracle(100, "adamw", data))
    for params, events, logs in SimulatedWorld(world).run(accumulate, data, micro):
        dpm.assert_same_params(params, want)
        assert events[0::2] == events[1::2]  # no message during the first micro-batches
        assert len(logs) == STEPS  # one synchronization per step, not per micro-batch
        for log in logs:
            assert len(log.of("forward_start")) == len(log.of("backward_end")) == micro
            last_forward = max(i for i, m in enumerate(log.marks) if m.what == "forward_start")
            first_start = min(i for i, m in enumerate(log.marks) if m.what == "bucket_start")
            assert first_start > last_forward


def test_a_gradient_from_an_earlier_micro_batch_only_is_still_sent():
    world, micro = 2, 3
    data = dpm.batches(1, world, PER_RANK * micro, seed=6, trigger_rank=world - 1)
    # the trigger row is the first of the last rank's shard: in its first micro-batch only
    want = dpm.params(dpm.oracle(100, "adamw", data))
    for params, _, _ in SimulatedWorld(world).run(accumulate, data, micro):
        dpm.assert_same_params(params, want)
        assert not torch.equal(params["sometimes.weight"], dpm.Toy(100).sometimes.weight)


# -- bad input ------------------------------------------------------------------------------


def wrap_different_models(comm, grow_rank, change):
    model = dpm.Toy(seed=0)
    if comm.rank == grow_rank:
        if change == "count":
            model.extra = nn.Linear(2, 2).double()
        else:
            model.head = nn.Linear(dpm.WIDTH, dpm.CLASSES + 1).double()
    DataParallel(model, comm)


@pytest.mark.parametrize("change, words", [("count", "rank 2: 13 parameters"),
                                           ("shape", "rank 2: 11 parameters (220 elements)")])
def test_different_models_on_different_ranks_are_refused_on_every_rank(change, words):
    with pytest.raises(RankFailure) as failure:
        SimulatedWorld(3).run(wrap_different_models, 2, change)
    assert sorted(failure.value.exceptions) == [0, 1, 2]
    for e in failure.value.exceptions.values():
        assert isinstance(e, ValueError)
        assert "same model on every rank" in str(e) and words in str(e)


@pytest.mark.parametrize("bucket_bytes, error", [(0, ValueError), (-5, ValueError),
                                                 (1.5, TypeError), (True, TypeError)])
def test_bucket_bytes_must_be_a_positive_integer(bucket_bytes, error):
    comm = SimulatedWorld(1).communicators()[0]
    with pytest.raises(error, match="bucket_bytes"):
        DataParallel(mlp(), comm, bucket_bytes=bucket_bytes)


def test_wrapping_a_module_again_unhooks_the_first_wrapper():
    def run(comm):
        module = mlp()
        first = DataParallel(module, comm, bucket_bytes=100)
        second = DataParallel(module, comm, bucket_bytes=100)
        second(torch.ones(1, 4)).sum().backward()
        return first.timeline.current.marks, second.timeline.last.buckets_started()

    for first_marks, started in SimulatedWorld(2).run(run):
        assert first_marks == [] and started == [0, 1, 2, 3, 4]
