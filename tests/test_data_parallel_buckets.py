"""`Buckets` on its own, as `lib_dist.horovod` uses it: mark_ready / finish by hand, "sum" and
"avg", pre- and post-scaling, a compression hook around the all-reduce, gradients missing on
some ranks or on all, and misuse."""

from __future__ import annotations

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.data_parallel import Buckets, Timeline

WORLD = 3


def leaves() -> list[torch.Tensor]:
    """Three parameters of 5, 3 and 2 floats; with 24-byte buckets: [[c, b], [a]]."""
    return [torch.zeros(n, requires_grad=True) for n in (5, 3, 2)]


def set_grads(rank: int, params: list[torch.Tensor]) -> None:
    """a: rank + 1 everywhere; b: missing on rank 0, else (rank + 1) * [0, 1, 2]; c: nowhere."""
    a, b, c = params
    a.grad = torch.full((5,), rank + 1.0)
    b.grad = None if rank == 0 else torch.arange(3.0) * (rank + 1)


def reduce_by_hand(comm, op, prescale=1.0, postscale=1.0, compression=None):
    params = leaves()
    timeline = Timeline()
    buckets = Buckets(params, comm, 24, op, names=["a", "b", "c"], prescale=prescale,
                      postscale=postscale, compression=compression, timeline=timeline)
    set_grads(comm.rank, params)
    buckets.mark_ready(params[0])  # a's bucket is the last: nothing may start yet
    started_early = timeline.current.buckets_started()
    if params[1].grad is not None:
        buckets.mark_ready(params[1])
    buckets.finish()
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    return buckets.layout(), started_early, grads, timeline.current


def test_average_with_a_gradient_missing_on_one_rank_and_one_missing_everywhere():
    for layout, started_early, (a, b, c), _ in SimulatedWorld(WORLD).run(reduce_by_hand, "avg"):
        assert layout == [["c", "b"], ["a"]]
        assert started_early == []  # bucket 1 (a) is ready, but bucket 0 waits for c
        torch.testing.assert_close(a, torch.full((5,), 2.0))  # (1 + 2 + 3) / 3
        torch.testing.assert_close(b, torch.arange(3.0) * 5 / 3)  # (0 + 2 + 3) / 3
        assert c is None


def test_sum_with_prescale_and_postscale():
    results = SimulatedWorld(WORLD).run(reduce_by_hand, "sum", prescale=0.5, postscale=4.0)
    for _, _, (a, b, c), _ in results:
        torch.testing.assert_close(a, torch.full((5,), 12.0))  # (1 + 2 + 3) * 0.5 * 4
        torch.testing.assert_close(b, torch.arange(3.0) * 10)  # (2 + 3) * 0.5 * 4
        assert c is None


class Half:
    """fp16 on the wire, as Horovod's Compression.fp16; counts what it compressed."""

    def __init__(self):
        self.compressed: list[torch.dtype] = []

    def compress(self, tensor):
        self.compressed.append(tensor.dtype)
        return tensor.half(), tensor.dtype

    def decompress(self, tensor, dtype):
        return tensor.to(dtype)


def compressed(comm):
    half = Half()
    _, _, grads, log = reduce_by_hand(comm, "avg", compression=half)
    return half.compressed, grads, [m.nbytes for m in log.of("bucket_start")]


def test_a_compression_hook_wraps_each_bucket():
    for seen, (a, b, c), nbytes in SimulatedWorld(WORLD).run(compressed):
        assert seen == [torch.float32, torch.float32]  # once per bucket
        assert nbytes == [(2 + 3 + 2) * 2, (5 + 1) * 2]  # gradients and flags, in fp16
        # small integers travel exactly in fp16; the mean 5 / 3 rounds once to fp16's 11 bits
        # (half an fp16 eps, relative), the expected value to fp32's: within one fp16 eps
        fp16 = torch.finfo(torch.float16).eps
        torch.testing.assert_close(a, torch.full((5,), 2.0), atol=0, rtol=fp16)
        torch.testing.assert_close(b, torch.arange(3.0) * 5 / 3, atol=0, rtol=fp16)
        assert c is None  # the used-flags survive the compression


def test_frozen_and_repeated_parameters_are_left_out():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2)
    comm = SimulatedWorld(1).communicators()[0]
    buckets = Buckets([a, b, a], comm, 1 << 20, names=["a", "b", "a again"])
    assert buckets.layout() == [["a"]]
    assert a in buckets and b not in buckets


def test_misuse_is_named():
    comm = SimulatedWorld(1).communicators()[0]
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    buckets = Buckets([a], comm, 8, names=["a"])
    a.grad = torch.ones(2)
    buckets.mark_ready(a)
    with pytest.raises(RuntimeError, match="gradient of a was marked ready twice"):
        buckets.mark_ready(a)
    with pytest.raises(ValueError, match="not in these buckets"):
        buckets.mark_ready(b)
    buckets.finish()
    assert not buckets.in_progress
    buckets.mark_ready(a)  # a new step
    buckets.finish()
    with pytest.raises(ValueError, match="op must be 'sum' or 'avg'"):
        Buckets([a], comm, 8, "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 names for 1 parameters"):
        Buckets([a], comm, 8, names=["a", "b"])
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        Buckets([a], comm, 0)


def started_my_way(comm):
    params, calls = leaves(), []

    def start(tensor, op):
        calls.append((tensor.numel(), op))
        return comm.all_reduce_async(tensor, op)

    buckets = Buckets(params, comm, 24, "sum", start=start)
    set_grads(comm.rank, params)
    buckets.finish()  # no gradient marked ready: every bucket starts here, in order
    return calls, params[0].grad


def test_a_start_function_replaces_all_reduce_async():
    for calls, a in SimulatedWorld(WORLD).run(started_my_way):
        assert calls == [(2 + 3 + 2, "sum"), (5 + 1, "sum")]
        torch.testing.assert_close(a, torch.full((5,), 6.0))
