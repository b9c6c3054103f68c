"""Lab 7 cannot be passed with lib_dist's mixed precision or torch's: a submission that imports
lib_dist's answers, and one whose scaler is torch's `GradScaler` and whose ZeRO optimizer is
torch's `ZeroRedundancyOptimizer`, graded for real in the sandbox, score 0 on the questions
they take that way and keep the points of what they wrote, while the solution keeps full marks
and the untouched release scores 0 (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import re

import pytest

from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               graded_lab)

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

# Row 4 of the catalog: a LossScaler whose unscaling and update are GradScaler's own kernels,
# reached around their guards: through inspect.unwrap of the guards, or through torch.ops.aten's
# aliases of the same kernels, which the guard meets in torch's dispatcher (KERNEL stands for
# the route).
GRAD_SCALERS_KERNELS = code("""
    import inspect

    class LossScaler:
        def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=2000):
            self._scale = torch.tensor(float(init_scale), dtype=torch.float32)
            self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
            self.growth_interval = growth_interval
            self._tracker = torch.zeros((), dtype=torch.int32)
            self._found, self._stepped = {}, set()

        def scale(self, loss):
            return loss * self._scale.to(loss.device)

        def unscale_(self, optimizer):
            if id(optimizer) in self._found:
                raise RuntimeError("unscale_() has already been called on this optimizer "
                                   "since the last update()")
            found = torch.zeros(())
            grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                     if p.grad is not None]
            KERNEL(_amp_foreach_non_finite_check_and_unscale_)(
                grads, found, self._scale.double().reciprocal().float())
            self._found[id(optimizer)] = self._any_rank(bool(found))

        def _any_rank(self, found):
            return found

        def step(self, optimizer, *args, **kwargs):
            if id(optimizer) in self._stepped:
                raise RuntimeError("step() has already been called since the last update()")
            if id(optimizer) not in self._found:
                self.unscale_(optimizer)
            self._stepped.add(id(optimizer))
            return None if self._found[id(optimizer)] else optimizer.step(*args, **kwargs)

        def update(self):
            found = torch.tensor(float(any(self._found.values())))
            KERNEL(_amp_update_scale_)(self._scale, self._tracker, found,
                                       self.growth_factor, self.backoff_factor,
                                       self.growth_interval)
            self._found.clear()
            self._stepped.clear()

        def get_scale(self):
            return float(self._scale)

        def state_dict(self):
            return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                    "backoff_factor": self.backoff_factor,
                    "growth_interval": self.growth_interval,
                    "_growth_tracker": int(self._tracker)}
    """)
LOSS_SCALER = {"q1-test-decisions", "q1-test-unscale", "q2-test-training", "q3-test-agreement",
               "q5-test-cluster"}

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
    "oracle_unwrapped": ({"q1-solution": re.sub(r"KERNEL\((\w+)\)", r"inspect.unwrap(torch.\1)",
                                                GRAD_SCALERS_KERNELS)}, LOSS_SCALER),
    "kernels_through_aten": ({"q1-solution": re.sub(r"KERNEL\((\w+)\)", r"torch.ops.aten.\1",
                                                    GRAD_SCALERS_KERNELS)}, LOSS_SCALER),
} | catalog(LAB07)


lab07 = graded_lab(LAB07, LAB07_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB07)))
def test_the_catalogs_cheats_score_zero(lab07, student):
    check_catalog(lab07, LAB07, student)


@pytest.mark.parametrize("student", sorted(set(LAB07_CHEATS) - set(catalog(LAB07))))
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
        "oracle_unwrapped": ["torch._amp_foreach_non_finite_check_and_unscale_ is what the "
                             "tests compare with"],
        "kernels_through_aten": ["torch._amp_foreach_non_finite_check_and_unscale_ is what the "
                                 "tests compare with"],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab07):
    check_blank_release(lab07)
