"""torch_schedule: torch.distributed.pipelining's schedules as our Step lists, simulated."""

from __future__ import annotations

import pytest

from lib_dist.pipeline import (Step, bubble_fraction, formula_bubble,
                               formula_makespan, gpipe, makespan, one_f_one_b, peak_live,
                               simulate, torch_schedule)
from lib_dist.pipeline.schedules import stages_of
from lib_dist.pipeline.torch_schedules import NAMES, from_pipeline_order

pytestmark = pytest.mark.timeout(60)

MULTI = {"Interleaved1F1B": 2, "LoopedBFS": 2, "InterleavedZeroBubble": 2,
         "ZBVZeroBubble": 2, "DualPipeV": 2}


def per_virtual_stage(v: int) -> dict[str, float]:
    """Step costs when a rank's layers are cut into v stages: a stage is 1/v of the work."""
    return {"F": 1 / v, "B": 2 / v, "I": 1 / v, "W": 1 / v}


@pytest.mark.parametrize("p, m", [(4, 8), (2, 5), (3, 3), (1, 2)])
def test_gpipe_and_1f1b_are_ours_step_for_step(p, m):
    assert torch_schedule("GPipe", p, m) == gpipe(p, m)
    assert torch_schedule("1F1B", p, m) == one_f_one_b(p, m)


def test_gpipe_and_1f1b_simulate_as_ours():
    p, m = 4, 8
    for name, ours in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
        theirs, mine = simulate(torch_schedule(name, p, m)), simulate(ours(p, m))
        assert makespan(theirs) == makespan(mine) == formula_makespan(p, m)
        assert bubble_fraction(theirs) == pytest.approx(formula_bubble(p, m))
        assert [peak_live(theirs, r) for r in range(p)] == [peak_live(mine, r)
                                                           for r in range(p)]
    assert [peak_live(simulate(torch_schedule("1F1B", p, m)), r) for r in range(p)] == \
        [4, 3, 2, 1]


@pytest.mark.parametrize("name", NAMES)
def test_every_step_once_on_one_rank(name):
    p, m, v = 4, 8, MULTI.get(name, 1)
    schedule = torch_schedule(name, p, m, v)
    assert len(schedule) == p
    steps = [s for rank in schedule for s in rank]
    assert len(steps) == len(set(steps))
    owner = stages_of(schedule)
    assert sorted(owner) == list(range(p * v))
    assert all(sorted(s for s in owner if owner[s] == r) ==
               ([r, 2 * p - 1 - r] if name in ("ZBVZeroBubble", "DualPipeV")
                else [r + k * p for k in range(v)]) for r in range(p))
    for stage in range(p * v):
        for j in range(m):
            assert Step("F", j, stage) in steps
            backward = {Step(k, j, stage) for k in "BIW"} & set(steps)
            assert backward in ({Step("B", j, stage)}, {Step("I", j, stage), Step("W", j, stage)})
            kinds = [s.kind for s in schedule[owner[stage]] if s.micro_batch == j and
                     s.stage == stage]
            assert kinds in (["F", "B"], ["F", "I", "W"])  # in this order on the rank


def test_interleaving_shrinks_the_bubble_and_zero_bubble_more():
    p, m = 4, 8
    plain = bubble_fraction(simulate(torch_schedule("1F1B", p, m)))
    interleaved = bubble_fraction(simulate(torch_schedule("Interleaved1F1B", p, m, 2),
                                           per_virtual_stage(2)))
    zero = bubble_fraction(simulate(torch_schedule("InterleavedZeroBubble", p, m, 2),
                                    per_virtual_stage(2)))
    zbv = bubble_fraction(simulate(torch_schedule("ZBVZeroBubble", p, m, 2),
                                   per_virtual_stage(2)))
    assert plain == pytest.approx(3 / 11)
    assert interleaved == pytest.approx((p - 1) / (2 * m + p - 1))  # Megatron's: (p-1)/(vm+p-1)
    assert zero < interleaved < plain and zbv < interleaved
    # the same work either way: p * m * (f + b) units
    for name in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"):
        trace = simulate(torch_schedule(name, p, m, 2), per_virtual_stage(2))
        assert makespan(trace) * p * (1 - bubble_fraction(trace)) == pytest.approx(p * m * 3)


def test_more_stages_per_rank_shrink_the_bubble_further():
    p, m = 4, 8
    bubbles = [bubble_fraction(simulate(torch_schedule("Interleaved1F1B", p, m, v),
                                        per_virtual_stage(v))) for v in (1, 2, 4)]
    assert bubbles[0] > bubbles[1] > bubbles[2]


def test_names_and_what_torch_refuses():
    assert torch_schedule("schedulegpipe", 2, 2) == torch_schedule("GPipe", 2, 2)
    assert torch_schedule("ScheduleInterleaved1F1B", 2, 4, 2) == \
        torch_schedule("interleaved1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match="unknown torch schedule.*GPipe"):
        torch_schedule("PipeDream", 4, 8)
    with pytest.raises(ValueError, match="stages_per_rank=2"):
        torch_schedule("ZBVZeroBubble", 4, 8)
    with pytest.raises(ValueError, match="one stage per rank"):
        torch_schedule("1F1B", 4, 8, 2)
    with pytest.raises(ValueError, match="greater"):
        torch_schedule("1F1B", 4, 2)  # torch's 1F1B wants m >= p
    with pytest.raises(ValueError, match="integer >= 1"):
        torch_schedule("GPipe", 0, 8)


def test_from_pipeline_order_keeps_compute_only():
    from torch.distributed.pipelining.schedules import _Action

    order = {0: [_Action.from_str("0F0"), None, _Action.from_str("0SEND_F0"),
                 _Action.from_str("(1F1;0B0)OVERLAP_F_B"), _Action.from_str("0REDUCE_GRAD")],
             1: [_Action.from_str("1RECV_F0"), _Action.from_str("1I0"), _Action.from_str("1W0")]}
    assert from_pipeline_order(order) == [
        [Step("F", 0, 0), Step("F", 1, 1), Step("B", 0, 0)],
        [Step("I", 0, 1), Step("W", 0, 1)],
    ]


def test_dual_pipe_v_mixes_full_and_split_backwards_and_shrinks_the_bubble():
    schedule = torch_schedule("DualPipeV", 4, 8, 2)
    kinds = {step.kind for steps in schedule for step in steps}
    assert {"B", "I", "W"} <= kinds
    trace = simulate(schedule, per_virtual_stage(2))
    assert bubble_fraction(trace) < bubble_fraction(simulate(one_f_one_b(4, 8))) / 2
