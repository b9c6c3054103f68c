"""Lab 10's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: ring attention whose next block is received only after the step's
compute (the demo's typical bug) loses the overlap (the traffic test); a fold that forgets to
rescale by the running maximum gets the values and gradients wrong; a log-sum-exp that is the
running maximum alone leaves the output right and the gradients wrong; a contiguous split where
the zig-zag is asked for loses the layout's point only. An all-to-all by hand-written messages
gives the right values and no all_to_all in the trace; an Exchange whose backward does not
swap the splits fails the exchange and the layer. Sequence parallelism that all-reduces and
slices where it should reduce-scatter sends an all-reduce's bytes through the wrong
collective (traffic only); an exchange that saves its input for backward keeps more than
module 6 (memory only); replicated gradients not summed are wrong (values only); a
reduce-scatter of the (B, T, C) tensor as it lies mixes the batch's rows (values only).

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it, on simulated ranks (`grader check` runs the whole notebook,
its 4 engines and the checks against scaled_dot_product_attention and all_to_all_single
too)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_variant, solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab10_long_sequences"
# Not the *_on_cluster checks: they run on the notebook's `cluster`, which loading them would
# start.
CHECKS = ("check_layout", "check_ring", "check_ring_traffic", "check_exchange", "check_moe",
          "check_moe_traffic", "check_sp", "check_sp_traffic", "check_sp_memory",
          "random_sizes", "zigzag_positions", "RingAttention", "ring_attention", "fold",
          "ring_forward", "exchange_rows", "Exchange",
          "ExpertParallelMoE", "all_gather_sequence", "reduce_scatter_sequence",
          "GatherSequence", "ScatterSequence", "SequenceParallelBlock")


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_ring.__globals__


def variant(grade_id: str, *changes: tuple[str, str]):
    """The checks' namespace with the solution's answer in `grade_id` changed by `changes`."""
    return answer_variant(LAB, lab_checks(), grade_id, *changes)


def q1_passes(ns, but=()):
    checks = {"layout": lambda: ns["check_layout"](13, 3),
              "values": lambda: ns["check_ring"](3, 13),
              "gradients": lambda: ns["check_ring"](3, 13, grads=True),
              "traffic": lambda: ns["check_ring_traffic"](3, 13)}
    for name, check in checks.items():
        if name not in but:
            check()


def q2_passes(ns, but=()):
    checks = {"exchange": lambda: ns["check_exchange"](3, ns["random_sizes"](3, 1)),
              "values": lambda: ns["check_moe"](2, k=2, factor=0.75),
              "traffic": lambda: ns["check_moe_traffic"](2, k=2, factor=0.75, skew=3.0)}
    for name, check in checks.items():
        if name not in but:
            check()


def q3_passes(ns, but=()):
    checks = {"values": lambda: ns["check_sp"](2), "traffic": lambda: ns["check_sp_traffic"](2),
              "memory": lambda: ns["check_sp_memory"](2)}
    for name, check in checks.items():
        if name not in but:
            check()


def test_the_solution_passes_every_check():
    ns = lab_checks()
    for seq_len, n in ((8, 1), (10, 5), (40, 8)):
        ns["check_layout"](seq_len, n)
    ns["check_ring"](5, 23, batch=1, heads=2, d=6, seed=4)
    ns["check_ring"](4, 8, grads=True, seed=2)  # chunks of one token
    ns["check_ring_traffic"](5, 17, seed=3)
    ns["check_exchange"](5, ns["random_sizes"](5, 2))
    ns["check_exchange"](2, [[0, 0], [0, 3]])  # nothing sent, nothing to itself
    for n in (1, 3, 4):
        ns["check_moe"](n, experts=2 * n, k=2, factor=1.0, seed=n, skew=4.0)
    ns["check_moe_traffic"](4, experts=8, k=1, factor=1.25, skew=5.0, batch=3)
    for n in (1, 3, 4):
        ns["check_sp"](n, seq_len=2 * n, n_head=n, head_size=3, batch=3, seed=n)
    ns["check_sp_traffic"](3, seq_len=6, n_head=3)
    ns["check_sp_memory"](4, seq_len=16, n_head=8, head_size=2)


def test_the_typical_bug_receives_after_the_compute_and_costs_the_overlap_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q1-solution-ring"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    with pytest.raises(AssertionError, match=r"ring attention's forward on 2 ranks, 8 tokens, "
                                             r"\(B, heads, head size\) = \(2, 3, 4\), seed 0: "
                                             r"rank 0, step 0: the next block's receive was "
                                             r"posted after the step's compute"):
        ns["check_ring_traffic"](2, 8)
    ns["check_ring_traffic"](1, 8)  # one rank: nothing to receive
    q1_passes(ns, but=("traffic",))
    q2_passes(ns)


def test_a_fold_that_forgets_the_running_maximum_gets_the_values_wrong():
    ns = variant("q1-solution-ring", ("total * rescale + p.sum", "total + p.sum"),
                 ("acc * rescale + p @ v", "acc + p @ v"))
    ns["check_ring"](1, 8)  # one rank, one run of positions: each row folded once
    with pytest.raises(AssertionError, match=r"ring attention on 3 ranks, 13 tokens, .*seed 0: "
                                             r"the output \(against one process's causal "
                                             r"attention\) differs"):
        ns["check_ring"](3, 13)
    with pytest.raises(AssertionError, match=r"the gradient of q"):
        ns["check_ring"](3, 13, grads=True)
    q1_passes(ns, but=("values", "gradients"))


def test_a_log_sum_exp_without_the_log_of_the_sum_spoils_the_gradients_only():
    ns = variant("q1-solution-ring", ("return acc / total, m + total.log()",
                                      "return acc / total, m"))
    with pytest.raises(AssertionError, match=r"ring attention on 3 ranks, 13 tokens, .*: the "
                                             r"gradient of q \(is the log-sum-exp m \+ "
                                             r"log\(total\)\?\) differs"):
        ns["check_ring"](3, 13, grads=True)
    q1_passes(ns, but=("gradients",))


def test_a_contiguous_split_loses_the_layouts_point_only():
    ns = variant("q1-solution-layout", (
        "    chunks = torch.arange(seq_len).tensor_split(2 * world_size)\n"
        "    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]])\n",
        "    return torch.arange(seq_len).tensor_split(world_size)[rank]\n"))
    with pytest.raises(AssertionError, match=r"zigzag_positions\(13, 3, rank\): rank 0 holds "
                                             r"\[0, 1, 2, 3, 4\]; it should hold chunks 0 and 5 "
                                             r"of the 6"):
        ns["check_layout"](13, 3)
    q1_passes(ns, but=("layout",))


def test_an_all_to_all_by_hand_written_messages_shows_no_all_to_all():
    ns = variant("q2-solution", ("    return torch.cat(comm.all_to_all(inputs, outputs))\n", (
        "    handles = [comm.isend(inputs[d], d) for d in range(comm.world_size)\n"
        "               if d != comm.rank]\n"
        "    handles += [comm.irecv(outputs[s], s) for s in range(comm.world_size)\n"
        "                if s != comm.rank]\n"
        "    outputs[comm.rank].copy_(inputs[comm.rank])\n"
        "    for h in handles:\n"
        "        h.wait()\n"
        "    return torch.cat(outputs)\n")))
    with pytest.raises(AssertionError, match=r"ExpertParallelMoE on 2 ranks, .*: rank 0: forward "
                                             r"called \['all_gather'\]; the skeleton's "
                                             r"all_gather of the counts, then one all_to_all"):
        ns["check_moe_traffic"](2)
    q2_passes(ns, but=("traffic",))
    q3_passes(ns)


def test_an_exchange_whose_backward_keeps_the_splits_fails_the_exchange_and_the_layer():
    ns = variant("q2-solution", ("ctx.comm, ctx.recv, ctx.send)", "ctx.comm, ctx.send, ctx.recv)"))
    ns["check_moe"](1)  # one rank: nothing to swap
    with pytest.raises(AssertionError, match=r"Exchange on 2 ranks, rows sent \(row: from rank, "
                                             r"column: to rank\) \[\[1, 2\], \[3, 0\]\], seed 0 "
                                             r"on 2 simulated ranks failed"):
        ns["check_exchange"](2, [[1, 2], [3, 0]])
    with pytest.raises(AssertionError, match=r"ExpertParallelMoE on 2 ranks, 4 experts, k=2"):
        ns["check_moe"](2, k=2, factor=0.75)
    q1_passes(ns)


def test_sequence_parallelism_that_all_reduces_and_slices_fails_the_traffic_only():
    ns = variant("q3-solution", (
        '    return comm.reduce_scatter(by_rank, op="sum").view(B, T // t, C)\n',
        '    return comm.all_reduce(x.clone()).chunk(t, dim=1)[comm.rank]\n'))
    with pytest.raises(AssertionError, match=r"SequenceParallelBlock on 2 ranks, n_embd 8, 4 "
                                             r"heads, 2x12 tokens, seed 0: rank 0: forward "
                                             r"called \['all_gather', 'all_reduce', "):
        ns["check_sp_traffic"](2)
    q3_passes(ns, but=("traffic",))


def test_an_exchange_that_saves_its_input_keeps_more_than_module_6():
    ns = variant("q3-solution", ("        ctx.comm = comm\n        return all_gather_sequence",
                                 "        ctx.comm = comm\n        ctx.save_for_backward(x)\n"
                                 "        return all_gather_sequence"))
    with pytest.raises(AssertionError, match=r"SequenceParallelBlock on 4 ranks, n_embd 16, 4 "
                                             r"heads, 2x24 tokens, seed 0: rank 0: autograd saved "
                                             r"\d+ bytes for backward; module 6's block saves "):
        ns["check_sp_memory"](4)
    q3_passes(ns, but=("memory",))


def test_replicated_gradients_not_summed_are_wrong():
    ns = variant("q3-solution", ('                self.comm.all_reduce(p.grad, "sum")\n',
                                 '                pass\n'))
    ns["check_sp"](1)
    with pytest.raises(AssertionError, match=r"SequenceParallelBlock on 2 ranks, .*: rank 0's "
                                             r"gradient of ln1.weight \(against module 6's "
                                             r"block on the same ranks\) differs"):
        ns["check_sp"](2)
    q3_passes(ns, but=("values",))


def test_a_reduce_scatter_of_the_tensor_as_it_lies_mixes_the_batch():
    ns = variant("q3-solution", (
        "    by_rank = x.reshape(B, t, T // t, C).transpose(0, 1).contiguous()",
        "    by_rank = x.contiguous()"))
    ns["check_sp"](2, batch=1)  # one sequence: its rows are the ranks' tokens in order
    with pytest.raises(AssertionError, match=r"SequenceParallelBlock on 2 ranks, .*: rank 0's "
                                             r"output \(its tokens\) differs"):
        ns["check_sp"](2)
    q3_passes(ns, but=("values",))
