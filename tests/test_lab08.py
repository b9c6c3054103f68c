"""Lab 8's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: a synchronous server that applies the sum of the gradients instead of
their mean drifts from SGD on the mean gradient; a worker that pulls once at the start only
leaves the server's sends waiting forever; an asynchronous server that counts staleness after
its update records one too many, and one that takes the workers in turn whatever the schedule
records (and applies) another order; local SGD that averages without the weights misses
FedAvg's; a gossip step that sends to the right neighbour only and counts its own tensor twice
is not the ring's mixing matrix; a top-k that never keeps its residual loses what it did not
send, and one that picks the largest values instead of magnitudes picks the wrong entries.

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it, on simulated ranks (`grader check` runs the whole notebook, its
4 engines and `check_first_come` too)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_variant, solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab08_parameter_server"
# Not check_first_come: it runs on the notebook's `cluster`, which loading it would start.
CHECKS = ("check_sync", "check_sync_traffic", "check_async", "replayed", "check_local_sgd",
          "check_local_sgd_messages", "check_gossip", "check_gossip_rate", "check_feedback",
          "check_training", "serve", "work", "local_sgd", "gossip_step", "TopK")

UNEVEN = dict(durations=[1.0, 2.5, 1.5], steps=4)  # its schedule is not round robin


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_sync.__globals__


def variant(grade_id: str, *changes: tuple[str, str]):
    """The checks' namespace with the solution's answer in `grade_id` changed by `changes`."""
    return answer_variant(LAB, lab_checks(), grade_id, *changes)


def test_the_solution_passes_every_check():
    ns = lab_checks()
    for servers, workers in ((1, 1), (1, 3), (2, 3), (3, 2)):
        ns["check_sync"](servers, workers)
    ns["check_sync"](2, 4, steps=4, lr=0.3, seed=1)
    ns["check_sync"](3, 1, steps=2, lr=0.05, seed=2)
    ns["check_sync_traffic"](1, 3)
    ns["check_sync_traffic"](2, 2)
    ns["check_sync_traffic"](3, 2, steps=2)
    ns["check_async"](1, [1.0])
    ns["check_async"](1, [1.0, 1.0, 1.0])
    ns["check_async"](1, **UNEVEN)
    ns["check_async"](2, [1.0, 1.7], steps=3)
    ns["check_async"](1, [1.0, 2.0], steps=4, lr_for_staleness=lambda tau: 0.1 / max(tau, 1))
    ns["check_async"](3, [1.0, 3.0, 1.2], steps=3, lr=0.2, seed=1)
    ns["check_local_sgd"](3, 4, 1)
    ns["check_local_sgd"](4, 7, 3, weights=[1.0, 2.0, 3.0, 6.0], momentum=0.9)
    ns["check_local_sgd"](2, 5, 2, weights=[120.0, 30.0], seed=1)
    ns["check_local_sgd_messages"]()
    ns["check_local_sgd_messages"](n=2, steps=4, every=4)
    for n in (1, 2, 3, 5, 8):
        ns["check_gossip"](n)
    ns["check_gossip_rate"](6, 60)
    ns["check_feedback"](0.1)
    ns["check_feedback"](1.0)
    ns["check_feedback"](0.5, numel=7, steps=5, seed=2)
    ns["check_training"]()


def test_the_replay_of_a_staleness_free_order_is_plain_sgd():
    ns = lab_checks()
    model = ns["small_model"]()
    ns["close"](ns["replayed"](model, [1, 1, 1], 0.1),
                ns["mean_gradient_sgd"](model, [1], 3, 0.1), "the replay", "one worker")


def test_the_typical_bug_picks_top_k_by_value_and_costs_q5_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q5-solution"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    ns["check_feedback"](1.0)  # every entry sent: no choice to get wrong
    with pytest.raises(AssertionError, match=r"TopK\(0.1\) on 6 gradients of 40 numbers, step 0: "
                                             r"the indices \[.*\] are not the 4 largest "
                                             r"magnitudes"):
        ns["check_feedback"](0.1)
    with pytest.raises(AssertionError, match=r"TopK\(0.05\) gradients, 40 steps: with error "
                                             r"feedback the loss went from 1.4108 to 0.25"):
        ns["check_training"]()  # the largest values alone drive the weights one way
    ns["check_sync"](1, 3)
    ns["check_async"](1, **UNEVEN)
    ns["check_local_sgd"](4, 7, 3, weights=[1.0, 2.0, 3.0, 6.0], momentum=0.9)
    ns["check_gossip"](3)


def test_a_synchronous_server_that_applies_the_sum_fails_the_values():
    ns = variant("q1-solution", ("torch.stack(grads).sum(0) / len(workers)",
                                 "torch.stack(grads).sum(0)"))
    ns["check_sync"](1, 1)
    with pytest.raises(AssertionError, match=r"synchronous: 1 server\(s\) and 3 worker\(s\), 3 "
                                             r"steps, lr 0.1: server 0's shard differs from the "
                                             r"expected one by up to 0.197"):
        ns["check_sync"](1, 3)
    with pytest.raises(AssertionError, match=r"3 server\(s\) and 2 worker\(s\).*server 0's shard"):
        ns["check_sync"](3, 2)
    ns["check_async"](1, **UNEVEN)  # the asynchronous server applies one gradient at a time
    ns["check_local_sgd"](3, 4, 1)
    ns["check_gossip"](3)


def test_a_worker_that_pulls_once_at_the_start_leaves_the_server_waiting():
    ns = variant("q1-solution", ("    for step in range(steps):\n        pull()\n",
                                 "    pull()\n    for step in range(steps):\n"))
    # every later shard the server sends is never taken: a blocking send waits forever
    for check in ("check_sync", "check_sync_traffic"):
        with pytest.raises(AssertionError, match=r"1 server\(s\) and 3 worker\(s\).* on 4 "
                                                 r"simulated ranks failed: rank 0: DeadlockError: "
                                                 r"send to rank 1 can never complete: deadlock"):
            ns[check](1, 3)
    with pytest.raises(AssertionError, match="PeerFailed: send to rank 1 can never complete: "
                                             "rank 1 returned without taking part"):
        ns["check_async"](1, **UNEVEN)
    ns["check_local_sgd_messages"]()
    ns["check_feedback"](0.1)


def test_staleness_counted_after_the_update_is_one_too_many():
    ns = variant("q1-solution", (
        "        tau = version - pulled[w]\n        shard -= rate(tau) * grad\n"
        "        version += 1\n",
        "        version += 1\n        tau = version - pulled[w]\n"
        "        shard -= rate(tau) * grad\n"))
    with pytest.raises(AssertionError, match=r"server 0 recorded \[\(1, 1\), \(1, 1\), \(1, 1\)\]; "
                                             r"the schedule's \(worker, staleness\) are "
                                             r"\[\(1, 0\), \(1, 0\), \(1, 0\)\]"):
        ns["check_async"](1, [1.0])
    with pytest.raises(AssertionError, match=r"server 0 recorded \[\(1, 1\), \(3, 2\), "):
        ns["check_async"](1, **UNEVEN)
    ns["check_sync"](2, 3)
    ns["check_sync_traffic"](1, 3)
    ns["check_local_sgd"](3, 4, 1)


def test_an_asynchronous_server_that_ignores_the_schedule_fails_an_uneven_one():
    ns = variant("q1-solution", ("    for w in schedule:\n",
                                 "    for w in round_robin(workers, steps):\n"))
    ns["check_async"](1, [1.0])
    ns["check_async"](1, [1.0, 1.0, 1.0])  # equally fast workers: the schedule is round robin
    with pytest.raises(AssertionError, match=r"schedule \[1, 3, 1, 2, 1, 3, 1, 3, 2, 3, 2, 2\]: "
                                             r"server 0 recorded \[\(1, 0\), \(2, 1\), \(3, 2\),"):
        ns["check_async"](1, **UNEVEN)
    with pytest.raises(AssertionError, match=r"2 server\(s\).*server 0 recorded"):
        ns["check_async"](2, [1.0, 1.7], steps=3)
    ns["check_sync"](2, 3)
    ns["check_gossip"](5)


def test_local_sgd_without_the_weights_fails_fedavg():
    ns = variant("q3-solution", ("p.mul_(weight / float(total))", "p.mul_(1 / comm.world_size)"))
    ns["check_local_sgd"](3, 4, 1)  # equal weights: no difference
    ns["check_local_sgd_messages"]()
    with pytest.raises(AssertionError, match=r"local_sgd on 4 ranks, 7 steps, every=3, weights "
                                             r"\[1.0, 2.0, 3.0, 6.0\], momentum 0.9: rank 0's "
                                             r"parameters differs from the expected one"):
        ns["check_local_sgd"](4, 7, 3, weights=[1.0, 2.0, 3.0, 6.0], momentum=0.9)
    with pytest.raises(AssertionError, match=r"weights \[120.0, 30.0\]"):
        ns["check_local_sgd"](2, 5, 2, weights=[120.0, 30.0], seed=1)
    ns["check_sync"](1, 3)
    ns["check_feedback"](0.1)


def test_a_one_sided_gossip_step_is_not_the_mixing_matrix():
    ns = variant("q4-solution", (
        "    handles = [comm.isend(mine, right), comm.isend(mine, left),\n"
        "               comm.irecv(from_left, left), comm.irecv(from_right, right)]\n",
        "    handles = [comm.isend(mine, right), comm.irecv(from_left, left)]\n"),
        ("(from_left + mine + from_right) / 3", "(from_left + mine + mine) / 3"))
    ns["check_gossip"](1)
    for n in (2, 3, 5):  # the mean is kept: only the step against W x tells
        with pytest.raises(AssertionError, match=f"gossip_step on {n} ranks: the ranks' tensors "
                                                 "after step 1 differs from the expected one"):
            ns["check_gossip"](n)
    with pytest.raises(AssertionError, match="gossip_step on 6 ranks, 60 steps, seed 2: the ranks' "
                                             "tensors"):
        ns["check_gossip_rate"](6, 60)
    ns["check_sync"](1, 3)
    ns["check_local_sgd"](3, 4, 1)
    ns["check_feedback"](0.1)


def test_a_top_k_that_never_keeps_its_residual_fails_the_feedback():
    ns = variant("q5-solution", ("            self.residual = acc\n", "            pass\n"))
    ns["check_sync"](1, 3)
    ns["check_gossip"](3)
    with pytest.raises(AssertionError, match=r"TopK\(0.1\) on 6 gradients of 40 numbers, step 0: "
                                             r"with error feedback, compress keeps what it did "
                                             r"not send in self.residual, which is still None"):
        ns["check_feedback"](0.1)
    with pytest.raises(AssertionError, match=r"TopK\(0.05\) gradients, 40 steps: with error "
                                             r"feedback the loss went from 1.4108 to 0.2138; the "
                                             r"dense gradient reaches 0.0763"):
        ns["check_training"]()  # what was not sent is lost: the run without error feedback's


def test_a_top_k_whose_residual_keeps_the_sent_entries_counts_them_twice():
    ns = variant("q5-solution", ("            acc[indices] = 0\n", ""))
    with pytest.raises(AssertionError, match=r"TopK\(0.1\) on 6 gradients of 40 numbers, step 0: "
                                             r"sent \+ residual != gradient \+ previous residual"):
        ns["check_feedback"](0.1)
    ns["check_local_sgd"](3, 4, 1)


def test_a_top_k_by_value_picks_the_wrong_entries():
    ns = variant("q5-solution", ("acc.abs().topk(", "acc.topk("))
    ns["check_feedback"](1.0)  # every entry sent: no choice to get wrong
    with pytest.raises(AssertionError, match=r"TopK\(0.1\) on 6 gradients of 40 numbers, step 0: "
                                             r"the indices \[.*\] are not the 4 largest "
                                             r"magnitudes of gradient \+ residual"):
        ns["check_feedback"](0.1)
    with pytest.raises(AssertionError, match=r"TopK\(0.03\) .* not the 3 largest magnitudes"):
        ns["check_feedback"](0.03, numel=100, steps=10, seed=1)
    ns["check_sync"](1, 3)
    ns["check_async"](1, **UNEVEN)
    ns["check_gossip"](3)
