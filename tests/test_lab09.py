"""Lab 9's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: recomputation without the random state replayed draws another dropout
mask (the gradients), one that replays it but leaves the generator there moves later draws (the
generator check), one that saves the block's output too keeps more than the input (the saved
bytes); a ZeRO-2 optimizer that reduce-scatters sums steps on N times the gradient, one that
reduces everything in `step` has no reduce-scatter during backward and holds every full
gradient, one that never frees the full gradients holds them (memory only); an FSDP that
keeps each gathered unit after its forward holds it (memory only), one that gathers again for
each saved tensor calls too many all-gathers in backward (traffic only), and one whose
gradient reduce-scatter sums gets every gradient N times too large; a prefetch that, in
backward, fetches the units in forward's order gathers each of them twice (traffic and order
only), and a prefetcher that gathers at once posts nothing ahead (the order only).

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it, on simulated ranks (`grader check` runs the whole notebook,
its 4 engines and `check_on_cluster` against FSDP2 too)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_variant, solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab09_fitting_the_model"
# Not check_on_cluster: it runs on the notebook's `cluster`, which loading it would start.
CHECKS = ("check_gradients", "check_two_inputs", "check_saved", "check_runs", "check_zero2",
          "check_overlap", "check_zero2_memory", "check_fsdp", "check_fsdp_traffic",
          "check_fsdp_memory", "check_prefetch_order", "Recompute", "checkpoint",
          "Checkpointed", "Zero2Optimizer", "Gathered", "Unit", "shard_module", "FSDP",
          "Prefetcher", "next_unit")


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_gradients.__globals__


def variant(grade_id: str, *changes: tuple[str, str]):
    """The checks' namespace with the solution's answer in `grade_id` changed by `changes`."""
    return answer_variant(LAB, lab_checks(), grade_id, *changes)


def q1_passes(ns):
    ns["check_gradients"]()
    ns["check_two_inputs"]()
    ns["check_saved"]()
    ns["check_runs"]()


def q2_passes(ns, but=()):
    for check in ("check_zero2", "check_overlap", "check_zero2_memory"):
        if check not in but:
            ns[check](2) if check != "check_zero2_memory" else ns[check](4)


def q3_passes(ns, but=()):
    for check in ("check_fsdp", "check_fsdp_traffic", "check_fsdp_memory"):
        if check not in but:
            ns[check](3)


def q4_passes(ns):
    ns["check_fsdp"](3, prefetch=True)
    ns["check_prefetch_order"](2)


def test_the_solution_passes_every_check():
    ns = lab_checks()
    q1_passes(ns)
    ns["check_gradients"](width=3, hidden=2, depth=4, dropout=0.8, seed=7)
    ns["check_saved"](width=8, hidden=64, rows=40, seed=3)
    for n in (1, 2, 3, 4):
        ns["check_zero2"](n, sizes=(4, 9, 9, 2), bucket_bytes=100, seed=n)
        ns["check_fsdp"](n, depth=2, tied=(0, 1), seed=n)
    ns["check_zero2"](4, sizes=(3, 1), steps=2)  # 4 numbers: one each
    ns["check_overlap"](4, bucket_bytes=64, seed=2)
    ns["check_zero2_memory"](3, sizes=(20, 10, 5), seed=4)
    ns["check_fsdp"](4, n_in=1, width=1, hidden=1, depth=1, n_out=1, tied=())  # tiny units
    ns["check_fsdp_traffic"](4, depth=4, tied=(0, 3), seed=1)
    ns["check_fsdp_memory"](2, depth=4, width=8, hidden=11, seed=5)
    for n, depth in ((1, 2), (2, 1), (4, 3)):
        ns["check_fsdp"](n, depth=depth, seed=n, prefetch=True)
        ns["check_prefetch_order"](n, depth=depth, tied=(), seed=n)


def test_the_typical_bug_draws_another_dropout_mask_and_costs_the_gradients_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q1-solution"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    with pytest.raises(AssertionError, match=r"3 checkpointed blocks 6->12->6, dropout 0.3, seed "
                                             r"0 \(was the dropout mask replayed\?\): the input's "
                                             r"gradient differs from the expected one"):
        ns["check_gradients"]()
    ns["check_gradients"](dropout=0.0, depth=1, seed=1)  # no dropout: nothing to replay
    ns["check_two_inputs"]()
    ns["check_saved"]()
    ns["check_runs"]()
    q2_passes(ns)


def test_a_generator_left_at_the_replayed_state_moves_later_draws():
    ns = variant("q1-solution", ("        with torch.random.fork_rng(devices=[]), "
                                 "torch.enable_grad():\n",
                                 "        with torch.enable_grad():\n"))
    with pytest.raises(AssertionError, match=r"dropout 0.3, seed 0: after backward the random "
                                             r"generator is not where the plain run left it"):
        ns["check_gradients"]()
    ns["check_saved"]()
    ns["check_runs"]()


def test_saving_the_output_too_keeps_more_than_the_input():
    ns = variant("q1-solution", ("        ctx.save_for_backward(*inputs)\n"
                                 "        with torch.no_grad():\n"
                                 "            return fn(*inputs)\n",
                                 "        with torch.no_grad():\n            out = fn(*inputs)\n"
                                 "        ctx.save_for_backward(*inputs, out)\n"
                                 "        return out\n"),
                 ("for x in ctx.saved_tensors]", "for x in ctx.saved_tensors[:-1]]"))
    ns["check_gradients"]()
    with pytest.raises(AssertionError, match=r"Checkpointed\(a block 6->48->6\), a batch of 32, "
                                             r"seed 0: autograd saved 3072 bytes for the "
                                             r"checkpointed block \(the plain block saves 38400\); "
                                             r"only its input, 1536 bytes, should be kept"):
        ns["check_saved"]()
    ns["check_runs"]()


def test_a_zero2_reduce_scatter_that_sums_steps_on_n_times_the_gradient():
    ns = variant("q2-solution", ('self.comm.reduce_scatter(flat, op="avg")',
                                 'self.comm.reduce_scatter(flat, op="sum")'))
    ns["check_zero2"](1)  # one rank: the sum is the mean
    with pytest.raises(AssertionError, match=r"Zero2Optimizer\(AdamW, bucket_bytes=200\) on 2 "
                                             r"ranks, layers \(5, 7, 3\) \(66 numbers\), 3 steps, "
                                             r"seed 0: rank 0's 0.weight after 3 steps differs"):
        ns["check_zero2"](2)
    q1_passes(ns)
    q3_passes(ns)


def test_a_zero2_that_reduces_everything_in_step_has_no_overlap():
    ns = variant("q2-solution", ("        while self.next < len(self.buckets) and \\\n",
                                 "        while False and \\\n"))
    ns["check_zero2"](3)  # the values are right
    with pytest.raises(AssertionError, match=r"on 2 ranks, .*step 0, rank 0: during backward it "
                                             r"called \[\]; ZeRO-2 reduce-scatters each of its 3 "
                                             r"buckets once"):
        ns["check_overlap"](2)
    with pytest.raises(AssertionError, match=r"after backward 0, rank 0 still holds 14800 bytes "
                                             r"of full gradients"):
        ns["check_zero2_memory"](4)
    q1_passes(ns)


def test_a_zero2_that_keeps_the_full_gradients_fails_the_memory_only():
    ns = variant("q2-solution", ("        for p in bucket:\n            p.grad = None\n", ""))
    ns["check_zero2"](2)
    ns["check_overlap"](2)
    with pytest.raises(AssertionError, match=r"after backward 0, rank 0 still holds 14800 bytes "
                                             r"of full gradients \(p.grad\)"):
        ns["check_zero2_memory"](4)
    q3_passes(ns)


def test_an_fsdp_that_keeps_each_gathered_unit_fails_the_memory_only():
    ns = variant("q3-solution", ("        unit.unbind()\n        unit.gathered = None\n",
                                 "        unit.unbind()\n"))
    ns["check_fsdp"](3)
    ns["check_fsdp_traffic"](3)
    with pytest.raises(AssertionError, match=r"FSDP on 3 ranks, Net\(\) \(299 numbers, 4 units\), "
                                             r"seed 0: rank 0 holds \d+ bytes of parameters after "
                                             r"a block's forward; its shards are 808 bytes, the "
                                             r"gathered root 456: free each unit's"):
        ns["check_fsdp_memory"](3)
    q2_passes(ns)


def test_an_fsdp_that_gathers_again_for_every_saved_tensor_fails_the_traffic_only():
    ns = variant("q3-solution", ("        if self.regathered is None:\n", "        if True:\n"))
    ns["check_fsdp"](3)
    with pytest.raises(AssertionError, match=r"FSDP on 2 ranks, .*step 0, rank 0: backward called "
                                             r"\{.*'all_gather': 7.*\}; it should "
                                             r"all-gather each of the 4 units once more"):
        ns["check_fsdp_traffic"](2)
    ns["check_fsdp_memory"](3)
    q1_passes(ns)


def test_an_fsdp_whose_gradient_reduce_scatter_sums_is_n_times_too_large():
    ns = variant("q3-solution", ('reduce_scatter(grad_full.contiguous(), op="avg")',
                                 'reduce_scatter(grad_full.contiguous(), op="sum")'))
    ns["check_fsdp"](1)
    with pytest.raises(AssertionError, match=r"FSDP on 2 ranks, Net\(\) \(299 numbers, 4 units\), "
                                             r"seed 0: the averaged gradient of .* \(from the "
                                             r"shards\) differs from the expected one"):
        ns["check_fsdp"](2)
    q2_passes(ns)


def test_a_prefetch_in_forwards_order_during_backward_fails_the_order_only():
    ns = variant("q4-solution", ("    order += list(reversed(fsdp.inner)) if backward else "
                                 "list(fsdp.inner)\n", "    order += list(fsdp.inner)\n"))
    ns["check_fsdp"](3, prefetch=True)  # the values are right: the unit is gathered anyway
    with pytest.raises(AssertionError, match=r"FSDP\(prefetch=True\) on 2 ranks, .*step 0, rank "
                                             r"0: backward called \{.*'all_gather': 7.*\}"):
        ns["check_prefetch_order"](2)
    q3_passes(ns)


def test_a_prefetcher_that_gathers_at_once_posts_nothing_ahead():
    ns = variant("q4-solution", ("        self.handle = unit.comm.all_gather_async(unit.shard.detach()"
                                 ".contiguous())\n",
                                 "        self.flat = torch.cat(unit.comm.all_gather(unit.shard."
                                 "detach().contiguous()))\n"))
    ns["check_fsdp"](3, prefetch=True)
    with pytest.raises(AssertionError, match=r"FSDP\(prefetch=True\) on 2 ranks, Net\(\), seed 0: "
                                             r"rank 0: all-gathers posted before each block's "
                                             r"forward computed: \[0, 0, 0\]; expected \[2, 3, 3\]"):
        ns["check_prefetch_order"](2)
    q3_passes(ns)
