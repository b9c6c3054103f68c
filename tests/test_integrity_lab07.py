"""Lab 7 cannot be passed with lib_dist's mixed precision or torch's: a submission that imports
lib_dist's answers, and one whose scaler is torch's `GradScaler` and whose ZeRO optimizer is
torch's `ZeroRedundancyOptimizer`, graded for real in the sandbox, score 0 on the questions
they take that way and keep the points of what they wrote, while the solution keeps full marks
and the untouched release scores 0 (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from integrity_grading import check_blank_release, check_cheat, code, graded_lab

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB07 = "lab07_mixed_precision"

GRAD_SCALER = code("""
    class LossScaler:  # torch's scaler does the work
        def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=2000):
            self.inner = torch.amp.GradScaler("cpu", init_scale=init_scale,
                                              growth_factor=growth_factor,
                                              backoff_factor=backoff_factor,
                                              growth_interval=growth_interval)

        def scale(self, loss):
            return self.inner.scale(loss)

        def unscale_(self, optimizer):
            self.inner.unscale_(optimizer)

        def step(self, optimizer):
            return self.inner.step(optimizer)

        def update(self):
            self.inner.update()

        def get_scale(self):
            return self.inner.get_scale()

        def state_dict(self):
            return self.inner.state_dict()

        def _any_rank(self, found):
            return found
    """)

TORCH_ZERO = code("""
    class ZeroOptimizer:  # torch's ZeRO does the work
        def __init__(self, params, comm, optimizer_class, **hyperparameters):
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.params, self.comm = list(params), comm
            self.optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class=optimizer_class,
                                                     **hyperparameters)
            self.param_groups = self.optimizer.param_groups

        def reduce_gradients(self):
            for p in self.params:
                self.comm.all_reduce(p.grad, "avg")

        def step(self):
            self.optimizer.step()

        def zero_grad(self):
            self.optimizer.zero_grad()
    """)

LAB07_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.mixed_precision import LossScaler\n",
        "q2-solution": "from lib_dist.mixed_precision import MasterWeights\n",
        "q3-solution": "from lib_dist.mixed_precision import DistributedLossScaler\n",
        "q4-solution": "from lib_dist.mixed_precision import ZeroOptimizer\n"},
        "all"),
    # the solution's MasterWeights kept: its updates test keeps its points
    "wraps_torch": ({"q1-solution": GRAD_SCALER, "q4-solution": TORCH_ZERO},
                    {"q1-test-decisions", "q1-test-unscale", "q2-test-training",
                     "q3-test-agreement", "q4-test-values", "q4-test-memory",
                     "q4-test-traffic", "q5-test-cluster"}),
}


lab07 = graded_lab(LAB07, LAB07_CHEATS)


@pytest.mark.parametrize("student", sorted(LAB07_CHEATS))
def test_lab07_cheats_score_zero(lab07, student):
    errors = check_cheat(lab07, LAB07, LAB07_CHEATS, student)
    expected = {
        "imports_lib_dist": [
            "lab07_mixed_precision asks you to write LossScaler yourself: yours is "
            "lib_dist.mixed_precision.scaler.LossScaler, lib_dist's own",
            "asks you to write ZeroOptimizer yourself: yours is "
            "lib_dist.mixed_precision.zero.ZeroOptimizer, lib_dist's own"],
        "wraps_torch": ["torch.amp.grad_scaler.GradScaler is what the tests compare with",
                        "ZeroRedundancyOptimizer is what the tests compare with"],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab07):
    check_blank_release(lab07)
