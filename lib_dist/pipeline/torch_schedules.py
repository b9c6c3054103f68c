"""`torch.distributed.pipelining`'s schedules as our `Step` lists, without a process group.

    trace = simulate(torch_schedule("Interleaved1F1B", p=4, m=8, stages_per_rank=2))

torch's schedules that run several stages per rank (Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) compute, when built, their whole plan for
every rank, `pipeline_order` (rank -> actions: "2F0", stage 2's forward of micro-batch 0;
"2I0"/"2W0", its backward split into input and weight gradients; "2B0", the whole backward;
None, a slot the rank waits in), and then run that plan. Building one reads only a few
attributes of the stages it is given (how many stages and ranks, which rank is this), so
stand-in objects are enough: no process group, no model. The single-stage ones (GPipe, 1F1B)
run hand-written loops instead; `torch_schedule` runs that very loop on a stand-in stage that
records each forward and backward it is asked for.

Only the compute actions are kept: messages, gradient reductions and idle slots are dropped,
as `simulate` derives the waits from the dependencies. DualPipeV's overlapped pairs (a forward
and a backward run together) become their two steps. With v stages per rank, stage s lives on
rank s % p, except in the V-shaped schedules, where rank r holds stages r and 2p - 1 - r.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from .schedules import Schedule, Step

SINGLE = ("GPipe", "1F1B")  # one stage per rank
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")  # exactly two stages per rank, in a V
NAMES = (*SINGLE, "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", *V_SHAPED)

KEPT = ("F", "B", "I", "W")  # torch's compute actions, named as ours


def torch_schedule(name: str, p: int, m: int, stages_per_rank: int = 1) -> Schedule:
    """The per-rank step order of torch's schedule `name` (one of `NAMES`, any case, with or
    without torch's "Schedule" prefix) for p ranks and m micro-batches, each rank running
    `stages_per_rank` stages (1 for GPipe and 1F1B, 2 for the V-shaped ones). Raises
    ValueError for what torch refuses (e.g. 1F1B with m < p)."""
    canonical = _canonical(name)
    for what, value in (("p (ranks)", p), ("m (micro-batches)", m),
                        ("stages_per_rank", stages_per_rank)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    if canonical in SINGLE and stages_per_rank != 1:
        raise ValueError(f"{canonical} runs one stage per rank: use stages_per_rank=1, or "
                         f"Interleaved1F1B for several")
    if canonical in V_SHAPED and stages_per_rank != 2:
        raise ValueError(f"{canonical} runs exactly two stages per rank, in a V: pass "
                         f"stages_per_rank=2")
    from torch.distributed.pipelining.schedules import get_schedule_class

    cls = get_schedule_class(canonical)
    try:
        if canonical in SINGLE:
            return [_record_run(cls, p, m, rank) for rank in range(p)]
        stages = _stand_in_stages(p, stages_per_rank, rank=0, v_shaped=canonical in V_SHAPED)
        order = cls(stages, m).pipeline_order
    except (RuntimeError, AssertionError) as err:  # torch states its limits in these too
        raise ValueError(f"torch's {canonical} refuses p={p}, m={m}, "
                         f"stages_per_rank={stages_per_rank}: {err}") from err
    return from_pipeline_order(order, p)


def from_pipeline_order(order: Mapping[int, Sequence[Any]], p: int | None = None) -> Schedule:
    """A torch `pipeline_order` (rank -> actions, as every torch schedule object has one)
    as our schedule: its F, B, I and W actions as `Step`s, rank by rank, in order."""
    ranks = range(p if p is not None else len(order))
    return [[step for action in order.get(rank, ()) for step in _steps(action)]
            for rank in ranks]


def _steps(action: Any) -> list[Step]:
    """Our steps for one torch action: none for an idle slot or a non-compute action, the
    sub-actions' for a composite (DualPipeV's overlapped F and B)."""
    if action is None:
        return []
    if getattr(action, "sub_actions", None):
        return [step for sub in action.sub_actions for step in _steps(sub)]
    kind = getattr(action.computation_type, "value", str(action.computation_type))
    if kind not in KEPT:
        return []
    return [Step(kind, int(action.microbatch_index), int(action.stage_index))]


def _record_run(cls: Any, p: int, m: int, rank: int) -> list[Step]:
    """The steps torch's single-stage schedule `cls` runs on `rank`: its own `step` code,
    run on a stage that records each forward and backward it is asked for and has nothing to
    send or receive. (Their published `pipeline_order` is a separate, hand-written copy of the
    plan, and 1F1B's is wrong on the last rank in torch 2.13: its forwards are numbered 1..m.)"""
    stage = _Recorder(p, rank)
    plan = cls(stage, m, loss_fn=lambda output, target: None)
    plan._stage_forward_initialized = plan._stage_backward_initialized = True  # no shapes
    plan._step_microbatches(None, None, [None] * m, None)
    return stage.steps


class _Recorder(SimpleNamespace):
    """A stand-in for torch's `PipelineStage` that records what the schedule runs."""

    def __init__(self, p: int, rank: int):
        super().__init__(stage_index=rank, num_stages=p, group_size=p, group_rank=rank,
                         is_first=rank == 0, is_last=rank == p - 1, submod=None)
        self.steps: list[Step] = []

    def forward_one_chunk(self, micro_batch: int, *args: Any, **kwargs: Any) -> None:
        self.steps.append(Step("F", micro_batch, self.stage_index))

    def backward_one_chunk(self, micro_batch: int, *args: Any, **kwargs: Any) -> None:
        self.steps.append(Step("B", micro_batch, self.stage_index))

    def no_messages(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    get_fwd_recv_ops = get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = no_messages

    def clear_runtime_states(self, *args: Any, **kwargs: Any) -> None:
        pass

    perform_reduce_grad = clear_runtime_states


def _canonical(name: str) -> str:
    key = name.lower().removeprefix("schedule")
    for known in NAMES:
        if known.lower() == key:
            return known
    raise ValueError(f"unknown torch schedule {name!r}: pick one of {', '.join(NAMES)}")


def _stand_in_stages(p: int, v: int, rank: int, v_shaped: bool) -> list[SimpleNamespace]:
    """What torch's schedules read of the stages they are built from, for `rank`'s stages:
    no module, no process group."""
    indices = [rank, 2 * p - 1 - rank] if v_shaped else [rank + k * p for k in range(v)]
    total = p * v
    return [SimpleNamespace(stage_index=i, num_stages=total, group_size=p, group_rank=rank,
                            is_first=i == 0, is_last=i == total - 1, submod=None)
            for i in indices]
