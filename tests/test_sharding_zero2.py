"""ZeRO-2 (lib_dist.sharding.Zero2Optimizer) on 1-4 simulated ranks: the parameters of ZeRO-1
(module 7's ZeroOptimizer) and of an unsharded AdamW on the average gradient; gradients
reduce-scattered bucket by bucket during backward and freed, so a rank holds its shard of
them; the traffic of one all-reduce per step; a step's measured peak counts ZeRO-1's and
ZeRO-2's shards and their state as held before it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lib_dist.comm import SimulatedWorld
from lib_dist.mixed_precision import ZeroOptimizer, zero_traffic_per_rank
from lib_dist.sharding import Zero2Optimizer

F64 = torch.float64
ADAMW = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
BUCKET_BYTES = 40 * 8  # data parallel's buckets, from the last parameter: (3 + 6x3 + 6), (5x6)
SIZES = [27, 30]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).to(F64)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 5, generator=g, dtype=F64), torch.randn(8, 3, generator=g, dtype=F64)


def loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (net(x) - y).pow(2).mean()


def train(comm, base: nn.Module, steps: int, stage: int):
    net = copy.deepcopy(base)
    if stage == 2:
        opt = Zero2Optimizer(net.parameters(), comm, torch.optim.AdamW,
                             bucket_bytes=BUCKET_BYTES, **ADAMW)
    else:
        opt = ZeroOptimizer(net.parameters(), comm, torch.optim.AdamW, **ADAMW)
    held = []
    for step in range(steps):
        opt.zero_grad()
        loss(net, *batch(step, comm.rank)).backward()
        if stage == 2:
            held.append(opt.gradient_bytes())  # after backward, before step
        opt.step()
    return [p.detach().clone() for p in net.parameters()], held


def test_buckets_are_data_parallels_from_the_last_parameter():
    def layout(comm, bucket_bytes):
        opt = Zero2Optimizer(model().parameters(), comm, torch.optim.SGD,
                             bucket_bytes=bucket_bytes, lr=0.1)
        return [[p.numel() for p in b.params] for b in opt.buckets]

    assert SimulatedWorld(1).run(layout, BUCKET_BYTES) == [[[3, 18, 6], [30]]]
    assert SimulatedWorld(1).run(layout, 8) == [[[3], [18], [6], [30]]]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_zero2_trains_as_zero1(n):
    base = model()
    stage2 = SimulatedWorld(n).run(train, base, 4, 2)
    stage1 = SimulatedWorld(n).run(train, base, 4, 1)
    for (got, _), (want, _) in zip(stage2, stage1):
        for g, w in zip(got, want):
            # AdamW works element by element on the same averages; with 3 or more ranks an
            # element's sum starts at its owner, which differs between one flat vector and
            # buckets: the same terms in another order, float64, 4 steps of lr 1e-2
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    assert not torch.equal(stage2[0][0][0], base[0].weight)  # it trained


@pytest.mark.parametrize("n", [2, 4])
def test_a_rank_holds_only_its_shard_of_the_gradients_after_backward(n):
    base = model()
    results = SimulatedWorld(n).run(train, base, 2, 2)
    numel = sum(p.numel() for p in base.parameters())
    assert sum(SIZES) == numel
    shard = sum(-(-size // n) for size in SIZES)
    for _, held in results:
        assert held == [shard * 8] * 2, (held, numel * 8)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_bucket_is_one_reduce_scatter_during_backward_and_one_all_gather(n):
    base = model()
    world = SimulatedWorld(n)
    steps = 3
    world.run(train, base, steps, 2)
    padded = [-(-size // n) * n for size in SIZES]
    summary = world.trace.summary()
    for rank in range(n):
        collectives = [e.kind for e in world.trace.of_rank(rank)
                       if e.kind not in ("send", "recv", "compute")]
        assert collectives == (["reduce_scatter"] * 2 + ["all_gather"] * 2) * steps
        sent = summary[rank].sent_bytes
        assert sent == steps * 2 * (n - 1) * sum(padded) * 8 // n
        assert sent == pytest.approx(steps * zero_traffic_per_rank(2, n, gradient_bytes=8)
                                     * sum(padded))


def test_a_parameter_one_rank_did_not_use_counts_as_zeros_there():
    base = model()

    def body(comm):
        net = copy.deepcopy(base)
        opt = Zero2Optimizer(net.parameters(), comm, torch.optim.SGD, bucket_bytes=1 << 20,
                             lr=0.1)
        x, y = batch(0, comm.rank)
        if comm.rank == 0:
            loss(net, x, y).backward()
        else:  # rank 1 uses only the first layer
            net[0](x).pow(2).mean().backward()
        opt.step()
        return [p.detach().clone() for p in net.parameters()]

    got = SimulatedWorld(2).run(body)
    want = copy.deepcopy(base)
    x0, y0 = batch(0, 0)
    x1, _ = batch(0, 1)
    grads = []
    for fn in (lambda: loss(want, x0, y0), lambda: want[0](x1).pow(2).mean()):
        want.zero_grad()
        fn().backward()
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                      for p in want.parameters()])
    with torch.no_grad():
        for p, g0, g1 in zip(want.parameters(), *grads):
            p -= 0.1 * (g0 + g1) / 2
    for params in got:
        for g, w in zip(params, want.parameters()):
            torch.testing.assert_close(g, w.detach(), rtol=0, atol=1e-15)


def test_a_second_backward_before_step_is_refused_saying_why():
    def body(comm):
        net = copy.deepcopy(model())
        opt = Zero2Optimizer(net.parameters(), comm, torch.optim.SGD, lr=0.1)
        loss(net, *batch(0, 0)).backward()
        with pytest.raises(RuntimeError, match="second backward before step"):
            loss(net, *batch(1, 0)).backward()
        return True

    assert SimulatedWorld(1).run(body) == [True]


@pytest.mark.parametrize("stage", [1, 2])
def test_a_steps_peak_counts_the_shards_as_held_before_it(stage):
    # measure_peak_memory reads what the optimizer holds from its param_groups (the float64
    # shards it steps) and its state (their two AdamW moments and step counters). ZeRO-1 steps
    # a copy of its shard; ZeRO-2's shards are views of the parameters, counted once. One rank:
    # torch's profiler runs once at a time in a process, and the ranks here are threads
    from lib_dist.train import measure_peak_memory
    from lib_dist.train.memory import optimizer_state_bytes

    def held(comm):
        net = model()
        kind = Zero2Optimizer if stage == 2 else ZeroOptimizer
        opt = kind(net.parameters(), comm, torch.optim.AdamW, **ADAMW)
        x, y = batch(0, comm.rank)
        found = measure_peak_memory(net, opt, x, y, lambda out, t: (out - t).pow(2).mean())
        shards = sum(p.nbytes for g in opt.param_groups for p in g["params"])
        own = found.before - sum(p.nbytes for p in net.parameters()) - x.nbytes - y.nbytes
        return own, shards, optimizer_state_bytes(opt), optimizer_state_bytes(opt, False)

    for own, shards, state, moments in SimulatedWorld(1).run(held):
        assert moments == 2 * shards > 0 and own == (shards if stage == 1 else 0) + state


@pytest.mark.parametrize("n", [2, 3])
def test_in_the_parameters_dtype_the_shards_are_the_parameters_own_memory(n):
    # what the optimizer steps is a view of the parameters' bucket buffer: after a step every
    # rank's parameters are the gathered shards, and no rank holds a copy of its shard
    base = model()  # built once: the ranks are threads, and share torch's generator

    def body(comm):
        net = copy.deepcopy(base)
        opt = Zero2Optimizer(net.parameters(), comm, torch.optim.AdamW,
                             bucket_bytes=BUCKET_BYTES, **ADAMW)
        loss(net, *batch(0, comm.rank)).backward()
        opt.step()
        aliased = all(shard.untyped_storage().data_ptr()
                      == bucket.params[0].untyped_storage().data_ptr()
                      for bucket, shard in zip(opt.buckets, opt.shards))
        return aliased, [p.detach().clone() for p in net.parameters()]

    results = SimulatedWorld(n).run(body)
    assert all(aliased for aliased, _ in results)
    for _, params in results[1:]:  # every rank holds the same, whole parameters
        assert all(torch.equal(a, b) for a, b in zip(params, results[0][1]))
    expected, _ = SimulatedWorld(n).run(train, base, 1, 1)[0]
    torch.testing.assert_close(results[0][1], expected, rtol=0, atol=1e-15)  # ZeRO-1's


def test_in_bf16_each_rank_steps_a_float32_master_copy_of_its_shard():
    base = model().to(torch.bfloat16)

    def body(comm):
        net = copy.deepcopy(base)
        opt = Zero2Optimizer(net.parameters(), comm, torch.optim.SGD, lr=0.5)
        x, y = batch(0, comm.rank)
        loss(net, x.to(torch.bfloat16), y.to(torch.bfloat16)).backward()
        opt.step()
        master = torch.cat(comm.all_gather(opt.shards[0].detach()))
        flat = torch.cat([p.detach().reshape(-1) for p in opt.buckets[0].params])
        return opt.shards[0].dtype, flat.dtype, torch.equal(master[:flat.numel()].bfloat16(), flat)

    for shard_dtype, param_dtype, same in SimulatedWorld(2).run(body):
        assert (shard_dtype, param_dtype, same) == (torch.float32, torch.bfloat16, True)
