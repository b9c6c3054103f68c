"""Lab 11's (the capstone's) tests catch what they promise, and each typical mistake costs the
points of what it gets wrong and no others: checkpoints sorted by name, where step10 comes
before step9 (the demo's typical bug), lose `latest_complete`'s point only; a grid numbered dp
fastest gets the coordinates and the groups wrong, yet its groups are still a grid, so the 3D
step on them is right; a loss summed over the replicas rather than averaged gets the loss curve
wrong and leaves the parameters and the traces right; gradients averaged over the whole world
rather than the dp group meet other stages' gradients of other shapes, and the step's runs
fail naming the mismatch (Q2's values, parameters and traces; Q1 and Q3's checkpoints pass);
a run that starts again from the beginning, ignoring its checkpoint, recomputes the steps it
had done.

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it, on simulated ranks (`grader check` runs the whole notebook,
its 8 engines too; tests/test_integrity_lab11.py grades it)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_variant, solution

from grader.demo import TYPICAL_BUGS
from lib_dist.three_d import Layout

pytestmark = pytest.mark.timeout(600)

LAB = "lab11_capstone"
# Not check_on_cluster: it runs on the notebook's `cluster`, which loading it would start.
CHECKS = ("check_coordinates", "check_groups", "check_share", "check_losses",
          "check_parameters", "check_traces", "check_latest", "check_resume", "coordinates_of",
          "mesh_groups", "replica_share", "average_over_replicas", "global_loss",
          "three_d_step", "latest_complete", "train", "Piece", "Groups")
L222 = Layout(2, 2, 2)


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see (a fresh one: the
    training runs it keeps are the answers')."""
    return solution(LAB, *CHECKS).check_groups.__globals__


def variant(grade_id: str, *changes: tuple[str, str]):
    """The checks' namespace with the solution's answer in `grade_id` changed by `changes`."""
    return answer_variant(LAB, lab_checks(), grade_id, *changes)


def test_the_solution_passes_every_check():
    ns = lab_checks()
    for shape in ((1, 1, 1), (2, 3, 4), (5, 1, 2)):
        ns["check_coordinates"](Layout(*shape))
    for shape in ((3, 2, 2), (1, 3, 1)):
        ns["check_groups"](Layout(*shape))
    ns["check_share"](6, batch=12)
    for shape in ((2, 4, 1), (3, 1, 2)):
        layout = Layout(*shape)
        ns["check_losses"](layout)
        ns["check_parameters"](layout)
        ns["check_traces"](layout)
    ns["check_latest"]([1, 100, 11], [101])
    ns["check_resume"](Layout(1, 2, 4))


def test_the_typical_bug_sorts_checkpoints_by_name_and_loses_latests_point_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q3-solution"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    ns["check_latest"]([2, 4], [6])  # one digit: names sort as numbers do
    with pytest.raises(AssertionError, match=r"latest_complete with checkpoints \[2, 9, 10\] "
                                             r"complete and \[12\] without layout.json: "
                                             r"returned '\S*step9'; expected '\S*step10'"):
        ns["check_latest"]([2, 9, 10], [12])
    ns["check_resume"](L222)


def test_a_grid_numbered_dp_fastest_loses_q1_only():
    ns = variant("q1-solution", ("    rest, t = divmod(rank, layout.tp)\n"
                                 "    d, p = divmod(rest, layout.pp)\n",
                                 "    rest, d = divmod(rank, layout.dp)\n"
                                 "    t, p = divmod(rest, layout.pp)\n"))
    with pytest.raises(AssertionError, match=r"coordinates_of\(rank, \(dp=2, pp=2, tp=2\)\): "
                                             r"rank 1 is at \(1, 0, 0\); expected \(d, p, t\) "
                                             r"= \(0, 0, 1\)"):
        ns["check_coordinates"](L222)
    with pytest.raises(AssertionError, match=r"mesh_groups on 8 ranks, \(dp=2, pp=2, tp=2\): "
                                             r"rank 0 \(d, p, t\) = \(0, 0, 0\): its dp group "
                                             r"holds world ranks \[0, 1\]; expected \[0, 4\]"):
        ns["check_groups"](L222)
    ns["check_losses"](L222)  # still a grid: the step on its groups is right
    ns["check_parameters"](L222)
    ns["check_traces"](L222)


def test_a_loss_summed_over_the_replicas_gets_the_loss_curve_wrong_only():
    ns = variant("q2-solution", ('    dp.all_reduce(loss, op="avg")\n',
                                 '    dp.all_reduce(loss)\n'))
    with pytest.raises(AssertionError, match=r"three_d_step on 8 ranks, \(dp=2, pp=2, tp=2\), "
                                             r"m=2: rank 0's losses \[4\.80"):
        ns["check_losses"](L222)
    ns["check_losses"](Layout(1, 2, 4))  # one replica: nothing to sum
    ns["check_parameters"](L222)
    ns["check_traces"](L222)


def test_gradients_averaged_over_the_world_fail_the_steps_runs_naming_the_mismatch():
    ns = variant("q2-solution", ("    average_over_replicas(piece.parameters(), dp)\n",
                                 "    average_over_replicas(piece.parameters(), piece.mesh.comm)\n"))
    # the stages' parameters differ: rank 0's first gradient meets rank 2's, of another shape
    with pytest.raises(AssertionError, match=r"three_d_step on 8 ranks, \(dp=2, pp=2, tp=2\), "
                                             r"m=2 on 8 simulated ranks failed: rank 0: "
                                             r"MismatchError: recv from rank 2: rank 2 sent "
                                             r"shape"):
        ns["check_parameters"](L222)
    ns["check_share"](2)
    ns["check_groups"](L222)
    ns["check_latest"]([2, 9, 10], [12])


def test_a_run_that_ignores_its_checkpoint_recomputes_its_steps():
    ns = variant("q3-solution", ("    start = load(piece, optimizer, last) if last is not None "
                                 "else 0\n", "    start = 0\n"))
    with pytest.raises(AssertionError, match=r"train started again at \(dp=2, pp=2, tp=2\) "
                                             r"after train at \(dp=2, pp=2, tp=2\), rank 5 "
                                             r"killed before step 5: rank 0 computed steps "
                                             r"\[0, 1, 2, 3, 4, 5\]; expected 4 and 5 only"):
        ns["check_resume"](L222)
    ns["check_latest"]([2, 9, 10], [12])


FLATTENED = '''    grads = []
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = dp.all_reduce(torch.cat([g.reshape(-1) for g in grads]), op="avg")
    for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(mean.view_as(g))
'''
PER_PARAMETER = '''    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dp.all_reduce(p.grad, op="avg")
'''


def test_gradients_flattened_into_one_all_reduce_pass_the_traces_too():
    """One all-reduce of every gradient flattened (fewer messages, module 4's buckets) is as
    right as one per parameter: the trace test counts the bytes, each gradient once."""
    ns = variant("q2-solution", (PER_PARAMETER, FLATTENED))
    layout = Layout(2, 1, 2)
    ns["check_parameters"](layout)
    ns["check_traces"](layout)


def test_gradients_averaged_twice_fail_the_traces():
    """Flattened and averaged twice: the values stay right (a mean of equal tensors), the
    bytes say each gradient went over the dp group twice."""
    ns = variant("q2-solution", (PER_PARAMETER, FLATTENED + FLATTENED))
    with pytest.raises(AssertionError, match=r"the dp group's all-reduces carried \d+ bytes "
                                             r"in 4 steps; each step averages each gradient "
                                             r"once"):
        ns["check_traces"](Layout(2, 1, 2))
