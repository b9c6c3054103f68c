"""Lab 4's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: summing instead of averaging fails the values but keeps the message
count; a DataParallel without the broadcast fails Q3 (and Q6, whose ranks are seeded
differently) but not Q4; hooks that wait for each bucket, a blocking all-reduce, or buckets
all started at the end keep the values and the bucket count and fail the overlap; a no_sync
that still sends keeps the values and fails Q5; zeros instead of None for a parameter no rank
used fail Q6 alone, and so does the converse, buckets without flags that take an average of
exactly zero for "unused" (None for a used parameter: AdamW skips its decay); a sampler with the
right shards in another order keeps the shard point. A DataParallel that communicates nothing
and passes the visible values by finding the seed of the whole batch its shard came from fails
the hidden checks, whose seeds are drawn at grading.

They run the lab's own test helpers, loaded from solutions/ with `definitions`, on the
instructor's solution and on variants of it; the 4-rank cluster test runs on simulated ranks
(`grader check` runs it on real engines)."""

from __future__ import annotations

import ast
import contextlib
import copy

import nbformat
import pytest
import torch
import torch.nn.functional as F

from lab_solutions import REPO, solution

from grader.demo import TYPICAL_BUGS
from lib_dist.comm import SimulatedWorld

pytestmark = pytest.mark.timeout(300)

LAB = "lab04_data_parallel"
CHECKS = ("check_sampler", "check_shards", "check_average", "check_average_messages",
          "check_broadcast", "check_equal", "check_buckets", "check_overlap", "check_no_sync",
          "check_toy", "check_zero_gradient", "check_cancelling", "ShardSampler",
          "average_gradients", "DataParallel")
ON_CLUSTER = ("check_average_on_cluster", "check_on_cluster")  # they use the notebook's cluster


class ThreadCluster:
    """The notebook's `cluster`, as 4 simulated ranks."""

    def __init__(self, n: int):
        self.n = n

    def run(self, fn, *args, timeout=None, **kwargs):
        return SimulatedWorld(self.n, timeout=20).run(fn, *args, **kwargs)


def lab_checks():
    """The lab's check functions, and its cluster checks running on simulated ranks."""
    c = solution(LAB, *CHECKS, "train_sharded", "sharded_oracle", "train_naive", "naive_oracle",
                 "adamw", "fresh_seed")
    namespace = c.check_equal.__globals__
    nb = nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)
    for cell in nb.cells:
        for node in ast.parse(cell.source).body if cell.cell_type == "code" else []:
            if isinstance(node, ast.FunctionDef) and node.name in ON_CLUSTER:
                source = ast.Module([node], [])
                exec(compile(source, LAB, "exec"), namespace)  # noqa: S102
    namespace["cluster"] = ThreadCluster(4)
    return c, namespace


def with_answer(name, make):
    """The lab's checks, with `make(solution's answer)` as the student's `name`."""
    c, namespace = lab_checks()
    namespace[name] = make(namespace[name])
    return namespace


def test_the_solution_passes_every_check():
    _, ns = lab_checks()
    for world in range(1, 6):
        for size in (1, 2 * world + 1, 17):
            ns["check_sampler"](size, world, drop_last=size % 2 == 0)
    ns["check_shards"](10, 4)
    ns["check_shards"](29, 5, drop_last=True)
    for n in range(1, 6):
        ns["check_average"](n)
        ns["check_broadcast"](n, root=n - 1)
        ns["check_equal"](n, 576)
        ns["check_buckets"](n, 700, layers=5)
        ns["check_overlap"](n, bucket_bytes=1, layers=3)
        ns["check_no_sync"](n, 3)
        ns["check_toy"](n, 200, make_optimizer=ns["adamw"])
        ns["check_zero_gradient"](n, 200)
    ns["check_cancelling"](2**20)
    ns["check_average_messages"](3)
    ns["check_average_on_cluster"]()
    ns["check_on_cluster"](200)


def test_summing_without_dividing_fails_the_values_and_keeps_the_message_point():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q2-solution"
    _, ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    with pytest.raises(AssertionError, match="differs from one process trained on the whole "
                                             "batch"):
        ns["check_average"](2)
    with pytest.raises(AssertionError, match="on the cluster"):
        ns["check_average_on_cluster"]()
    ns["check_average"](1)  # one rank: the sum is the average
    ns["check_average_messages"](2)


def subclass(**methods):
    return lambda base: type("DataParallel", (base,), methods)


def no_broadcast(self, root):
    pass


def test_no_broadcast_fails_q3_and_the_differently_seeded_q6_only():
    ns = with_answer("DataParallel", subclass(broadcast_parameters=no_broadcast))
    with pytest.raises(AssertionError, match="after wrapping, rank 1's body.weight should be "
                                             "rank 0's"):
        ns["check_broadcast"](2)
    with pytest.raises(AssertionError, match="differs from one process"):
        ns["check_toy"](2, 200)
    ns["check_equal"](2, 576)  # every rank builds Chain(1): nothing to broadcast
    ns["check_buckets"](2, 576)
    ns["check_overlap"](2)
    ns["check_no_sync"](2, 3)


def waits_at_once(self, k):
    type(self).__mro__[1].start_bucket(self, k)
    self.started[-1][1].wait()


def blocking(self, k):
    bucket = self.buckets[k]
    grads = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in bucket]
    flags = torch.tensor([float(p.grad is not None) for p in bucket], dtype=bucket[0].dtype)
    flat = self.comm.all_reduce(torch.cat(grads + [flags]), "avg")
    self.started.append((flat, type("Done", (), {"wait": lambda self: None})()))
    self.next_bucket = k + 1


def only_counts(self, p):
    if self.sync:
        self.waiting[self.bucket_of[id(p)]] -= 1  # finish() starts every bucket


@pytest.mark.parametrize("variant, message", [
    ({"start_bucket": waits_at_once}, "waited for before backward had computed every gradient"),
    ({"start_bucket": blocking}, "comm.all_reduce blocks until the sum is in"),
    ({"grad_ready": only_counts}, "bucket 0 \\(layers.3.bias, layers.3.weight\\) should start "
                                  "as soon as it and the buckets before it are full"),
], ids=["waits-in-the-hook", "blocking-all-reduce", "starts-everything-at-the-end"])
def test_no_overlap_keeps_the_values_and_buckets_and_fails_the_overlap(variant, message):
    ns = with_answer("DataParallel", subclass(**variant))
    ns["check_equal"](2, 576)
    ns["check_buckets"](2, 576)
    ns["check_toy"](2, 200)
    with pytest.raises(AssertionError, match=message):
        ns["check_overlap"](2)


def test_one_bucket_whatever_the_size_fails_the_bucket_count():
    def one_bucket(base):
        class DataParallel(base):
            def __init__(self, module, comm, *, bucket_bytes=25 * 2**20, broadcast_from=0):
                super().__init__(module, comm, bucket_bytes=2**30, broadcast_from=broadcast_from)
        return DataParallel

    ns = with_answer("DataParallel", one_bucket)
    ns["check_equal"](2, 576)
    with pytest.raises(AssertionError, match="plan_buckets makes 4 bucket\\(s\\) of \\[72, 72, "
                                             "72, 72\\] gradient elements"):
        ns["check_buckets"](2, 576)


def test_a_no_sync_that_still_sends_keeps_the_values_and_fails_q5():
    ns = with_answer("DataParallel", subclass(no_sync=lambda self: contextlib.nullcontext()))
    with pytest.raises(AssertionError, match="backward 1 ran inside no_sync\\(\\), yet the rank "
                                             "called \\[\\('all_reduce_async'"):
        ns["check_no_sync"](2, 3)
    ns["check_equal"](2, 576)


def finish_assigning(assign):
    """A `finish` that waits for every bucket's average and hands each parameter its part
    through `assign(p, part)`: the rule a wrong answer gets wrong."""
    def finish(self):
        if not self.sync:
            return
        while self.next_bucket < len(self.buckets):
            self.start_bucket(self.next_bucket)
        for bucket, (flat, handle) in zip(self.buckets, self.started):
            handle.wait()
            start = 0
            for p in bucket:
                assign(p, flat[start:start + p.numel()])
                start += p.numel()
        self.new_step()
    return finish


def zeros_everywhere(p, part):
    p.grad = part.view_as(p).clone()  # the flags ignored: zeros where no rank had a gradient


zeros_for_everyone = finish_assigning(zeros_everywhere)


def test_zeros_instead_of_none_for_an_unused_parameter_fail_q6_only():
    ns = with_answer("DataParallel", subclass(finish=zeros_for_everyone))
    with pytest.raises(AssertionError, match="never.weight should be None"):
        ns["check_toy"](2, 200)
    for check in ("check_equal", "check_buckets"):
        ns[check](2, 576)
    ns["check_overlap"](2)
    ns["check_no_sync"](2, 3)


def without_flags(self, k):
    bucket = self.buckets[k]
    flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel())
                      for p in bucket])
    self.started.append((flat, self.comm.all_reduce_async(flat, "avg")))
    self.next_bucket = k + 1


def zero_means_unused(drop):
    """A finish that takes an average of exactly zero for "no rank used it": it leaves the
    rank's own gradient there, or (`drop`) sets None."""
    def assign(p, part):
        if part.any():
            p.grad = part.view_as(p).clone()
        elif drop:
            p.grad = None
    return finish_assigning(assign)


@pytest.mark.parametrize("drop", [False, True], ids=["leaves-its-own", "sets-none"])
def test_an_average_of_zero_taken_for_unused_fails_q6_only(drop):
    ns = with_answer("DataParallel", subclass(start_bucket=without_flags,
                                              finish=zero_means_unused(drop)))
    cancelling = "gate should be a tensor" if drop else "gate differs from one process"
    with pytest.raises(AssertionError, match=f"on 2 simulated ranks, rank 0, the last step's "
                                             f"gradients: {cancelling}"):
        ns["check_cancelling"](2**20)
    if drop:
        with pytest.raises(AssertionError, match="inputs of zeros on 2 simulated ranks, rank 0 "
                                                 ".*: body.weight should be a tensor"):
            ns["check_zero_gradient"](2, 200)
    else:  # its own gradient of zeros is the right one there
        ns["check_zero_gradient"](2, 200)
    for check in ("check_equal", "check_buckets"):
        ns[check](2, 576)
    ns["check_overlap"](2)
    ns["check_no_sync"](2, 3)
    ns["check_toy"](2, 200)
    ns["check_toy"](3, 200, make_optimizer=ns["adamw"])
    ns["check_on_cluster"](200)


def in_blocks(self):
    """The right ordering, padding and lengths, but rank r takes the r-th contiguous block."""
    if self.shuffle:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.dataset_size, generator=generator).tolist()
    else:
        order = list(range(self.dataset_size))
    n = len(self)
    order = [order[i % len(order)] for i in range(n * self.num_replicas)]
    return iter(order[self.rank * n:(self.rank + 1) * n])


def test_a_sampler_in_blocks_keeps_the_shard_point_and_fails_torchs_order():
    ns = with_answer("ShardSampler", subclass(__iter__=in_blocks))
    with pytest.raises(AssertionError, match="DistributedSampler gives"):
        ns["check_sampler"](12, 4, shuffle=False)
    ns["check_shards"](12, 4)
    ns["check_shards"](10, 4)
    ns["check_shards"](10, 4, drop_last=True)


def test_a_sampler_that_ignores_the_epoch_fails_both():
    ns = with_answer("ShardSampler", subclass(set_epoch=lambda self, epoch: None))
    with pytest.raises(AssertionError, match="epoch 1 gives"):
        ns["check_sampler"](12, 4)
    with pytest.raises(AssertionError, match="epochs 0 and 1 give the same order"):
        ns["check_shards"](12, 4)


def seed_searching(ns, seeds=64):
    """A DataParallel that averages nothing: in forward it looks for the whole batch its shard
    came from among chain_batches' first `seeds` seeds (the visible checks use 11 to 14), and
    gives each parameter that batch's gradient, computed alone; where none matches, its own."""
    def make(base):
        class DataParallel(base):
            def forward(self, x):
                self.found, world = None, self.comm.world_size
                for seed in range(seeds):
                    for whole in ns["chain_batches"](4, world, len(x), seed):
                        if torch.equal(ns["shard"](whole, self.comm.rank, world)[0], x):
                            alone = copy.deepcopy(self.module)
                            loss = F.cross_entropy(alone(whole[0]), whole[1])
                            self.found = torch.autograd.grad(loss, list(alone.parameters()))
                return self.module(x)

            def grad_ready(self, p):
                pass

            def finish(self):
                if self.sync and self.found is not None:
                    for p, grad in zip(self.module.parameters(), self.found):
                        p.grad = grad.clone()
        return DataParallel
    return make


def test_finding_the_visible_batches_seed_passes_them_and_fails_the_hidden_checks():
    _, ns = lab_checks()
    ns["DataParallel"] = seed_searching(ns)(ns["DataParallel"])
    ns["check_equal"](1, 576)
    ns["check_equal"](2, 576)
    ns["check_equal"](3, 576)  # seed 13, a fixed hidden seed of old: found too
    while (seed := ns["fresh_seed"]()) < 64:
        pass
    with pytest.raises(AssertionError, match=f"batches of seed {seed} on 3 simulated ranks, "
                                             f"rank 0, the last step's gradients: .* differs "
                                             f"from one process"):
        ns["check_equal"](3, 576, seed=seed)
