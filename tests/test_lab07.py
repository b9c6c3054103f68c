"""Lab 7's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: a scaler whose count of clean steps survives an overflow grows too
soon (its decisions and state dicts differ from GradScaler's, and the distributed scaler built
on it too), while master weights and ZeRO keep their points; a scaler that never skips steps
on an inf; master weights that step the fp16 parameters themselves stagnate; a distributed
scaler that does not ask the other ranks lets them part, and one that all-reduces the
gradients instead of a flag sends too much and loses each rank's own gradient; a ZeRO
optimizer that sums instead of averaging fails the values, and one that keeps the whole state
and all-reduces fails the memory and the traffic.

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it (`grader check` runs the whole notebook, its 4 engines too)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source, solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab07_mixed_precision"
CHECKS = ("check_decisions", "check_unscale", "check_errors", "check_small_updates",
          "check_fp32_is_the_inner_optimizer", "check_agreement", "check_values",
          "check_memory", "check_traffic", "STREAM", "LossScaler", "MasterWeights",
          "DistributedLossScaler", "ZeroOptimizer")


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_decisions.__globals__


def test_the_solution_passes_every_check():
    ns = lab_checks()
    stream = ns["STREAM"]
    ns["check_decisions"](stream, init_scale=1000.0, growth_factor=1.5, backoff_factor=0.75,
                          growth_interval=2)
    ns["check_unscale"](stream[:12], growth_interval=3)
    ns["check_errors"]()
    ns["check_small_updates"](20, accumulate=2)
    ns["check_fp32_is_the_inner_optimizer"]()
    ns["check_agreement"](3)
    ns["check_values"](3)
    ns["check_memory"](2)
    ns["check_traffic"](4)


def test_a_count_of_clean_steps_kept_through_an_overflow_costs_the_scalers_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q1-solution"
    ns = lab_checks()
    distributed = answer_source(LAB, "q3-solution")
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    exec(distributed, ns)  # noqa: S102 - built on the buggy LossScaler, as in the notebook
    ns["check_decisions"]([[1, 1, 1]] * 6, growth_interval=2)  # no overflow: no difference
    with pytest.raises(AssertionError, match="your scale is"):
        ns["check_decisions"](ns["STREAM"], growth_interval=3)
    with pytest.raises(AssertionError, match="your state_dict"):
        ns["check_unscale"](ns["STREAM"][:12], growth_interval=3)
    with pytest.raises(AssertionError, match="the scale is"):
        ns["check_agreement"](2)
    ns["check_small_updates"](20)
    ns["check_values"](2)


def test_a_scaler_that_never_skips_fails_the_decisions():
    ns = lab_checks()
    exec("class LossScaler(LossScaler):\n"  # noqa: S102
         "    def step(self, optimizer):\n"
         "        if id(optimizer) not in self._found:\n"
         "            self.unscale_(optimizer)\n"
         "        return optimizer.step()\n", ns)
    with pytest.raises(AssertionError, match=r"step 4 \(gradient \[inf, 1, 1\]\): yours "
                                             r"stepped, GradScaler skipped"):
        ns["check_decisions"](ns["STREAM"], growth_interval=3)


def test_master_weights_that_step_the_fp16_parameters_stagnate():
    ns = lab_checks()
    exec("class MasterWeights:\n"  # noqa: S102
         "    def __init__(self, params, optimizer_class, **hyperparameters):\n"
         "        self.optimizer = optimizer_class(params, **hyperparameters)\n"
         "        self.param_groups = self.optimizer.param_groups\n"
         "    def zero_grad(self):\n"
         "        self.optimizer.zero_grad()\n"
         "    def step(self):\n"
         "        self.optimizer.step()\n", ns)
    ns["check_fp32_is_the_inner_optimizer"]()  # in fp32 there is nothing to lose
    with pytest.raises(AssertionError, match="plain fp16 SGD stays at"):
        ns["check_small_updates"](20)


def test_a_distributed_scaler_that_does_not_ask_lets_the_ranks_part():
    ns = lab_checks()
    exec("class DistributedLossScaler(LossScaler):\n"  # noqa: S102
         "    def __init__(self, comm, **kwargs):\n"
         "        super().__init__(**kwargs)\n", ns)
    ns["check_agreement"](1)
    with pytest.raises(AssertionError, match=r"rank 0 at step 5 \(rank\(s\) \[1\] had an inf or "
                                             r"nan\): the scale is 1024.0, expected 256.0"):
        ns["check_agreement"](2)


def test_a_distributed_scaler_that_reduces_the_gradients_loses_them():
    ns = lab_checks()
    exec("class DistributedLossScaler(LossScaler):\n"  # noqa: S102
         "    def __init__(self, comm, **kwargs):\n"
         "        super().__init__(**kwargs)\n"
         "        self.comm = comm\n"
         "    def unscale_(self, optimizer):\n"
         "        for group in optimizer.param_groups:\n"
         "            for p in group['params']:\n"
         "                self.comm.all_reduce(p.grad, 'avg')\n"
         "        super().unscale_(optimizer)\n", ns)
    with pytest.raises(AssertionError, match="not this rank's own"):
        ns["check_agreement"](2)


def test_a_zero_optimizer_that_sums_fails_the_values():
    ns = lab_checks()
    exec("class ZeroOptimizer(ZeroOptimizer):\n"  # noqa: S102
         "    def reduce_gradients(self):\n"
         "        grads = [p.grad for p in self.params]\n"
         "        mine = self.comm.reduce_scatter(self._flat(grads), op='sum')\n"
         "        self.shard.grad = mine.to(self.shard.dtype)\n"
         "        self._reduced = True\n", ns)
    ns["check_values"](1)
    with pytest.raises(AssertionError, match="rank 0's 0.weight differs"):
        ns["check_values"](2)


def test_a_zero_optimizer_that_keeps_everything_fails_memory_and_traffic():
    ns = lab_checks()
    exec("class ZeroOptimizer:\n"  # noqa: S102
         "    def __init__(self, params, comm, optimizer_class, **hyperparameters):\n"
         "        self.params, self.comm = list(params), comm\n"
         "        self.optimizer = optimizer_class(self.params, **hyperparameters)\n"
         "    def zero_grad(self):\n"
         "        self.optimizer.zero_grad()\n"
         "    def step(self):\n"
         "        for p in self.params:\n"
         "            self.comm.all_reduce(p.grad, 'avg')\n"
         "        self.optimizer.step()\n", ns)
    ns["check_values"](2)  # plain data parallel: right values
    with pytest.raises(AssertionError, match="rank 0's optimizer state is .* bytes; 1/2 of"):
        ns["check_memory"](2)
    with pytest.raises(AssertionError, match="ZeRO-1 reduce-scatters the gradients"):
        ns["check_traffic"](2)
