"""Lab 5 cannot be passed with lib_dist's pipeline: submissions that import its steps, follow
its schedule (`one_f_one_b`; `torch_schedule`'s are switched off alike) with a loop of
their own, or hand the step to its `run_schedule`, graded for real in the sandbox, score 0 on the
questions they take that way and keep the points of what they wrote, while the solution keeps
full marks (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               graded_lab)

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB05 = "lab05_pipeline"
ONE_F_ONE_B = {"q4-test-gradients", "q4-test-clock", "q4-test-messages", "q5-test-cluster"}
STEPS = ONE_F_ONE_B | {"q3-test-gradients", "q3-test-clock", "q3-test-messages", "look"}

LAB05_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.pipeline import split_model\n",
        "q2-solution": "from lib_dist.pipeline import (recv_backward, recv_forward, "
                       "send_backward,\n    send_forward)\n",
        "q3-solution": "from lib_dist.pipeline import gpipe_step\n",
        "q4-solution": "from lib_dist.pipeline import one_f_one_b_step\n"}, "all"),
    "follows_lib_dists_schedule": ({"q4-solution": code("""
        from lib_dist.pipeline import one_f_one_b

        def one_f_one_b_step(comm, stage, inputs, targets, m):
            xs, ys = cut(inputs, m), cut(targets, m)
            sends, losses = [], []
            for step in one_f_one_b(stage.num_stages, m)[stage.index]:  # the order, taken
                if step.kind == "F":
                    forward_step(comm, stage, step.micro_batch, xs, ys, sends, losses)
                else:
                    backward_step(comm, stage, step.micro_batch, m, len(ys[0]), sends)
            return finish(sends, losses, stage, m)
        """)}, ONE_F_ONE_B),
    "hands_the_step_to_run_schedule": ({"q3-solution": code("""
        from lib_dist.pipeline import Step, run_schedule

        def gpipe_step(comm, stage, inputs, targets, m):
            order = ([Step("F", j, stage.index) for j in range(m)]
                     + [Step("B", j, stage.index) for j in range(m)])
            return run_schedule(comm, stage, order, inputs, targets, m)
        """)}, STEPS),  # 1F1B reuses Q3's helpers, which the cheat replaced
} | catalog(LAB05)


lab05 = graded_lab(LAB05, LAB05_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB05)))
def test_the_catalogs_cheats_score_zero(lab05, student):
    check_catalog(lab05, LAB05, student)


@pytest.mark.parametrize("student", sorted(set(LAB05_CHEATS) - set(catalog(LAB05))))
def test_lab05_cheats_score_zero(lab05, student):
    errors = check_cheat(lab05, LAB05, LAB05_CHEATS, student)
    off = "is lib_dist's own version, switched off while the lab is graded"
    expected = {
        "imports_lib_dist": [f"lib_dist.pipeline.{name} {off}" for name in (
            "split_model", "gpipe_step")],  # the tests of the others stop earlier
        "follows_lib_dists_schedule": [f"lib_dist.pipeline.one_f_one_b {off}"],
        "hands_the_step_to_run_schedule": [f"lib_dist.pipeline.run_schedule {off}"],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab05):
    check_blank_release(lab05)
