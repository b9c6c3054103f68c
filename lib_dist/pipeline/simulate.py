"""Run a schedule on paper: every step's virtual start and end, without any tensor.

`simulate(schedule, costs)` starts each rank's next step as soon as the rank is free and the
steps it depends on are done (plus a message's cost when they ran on another rank):

- F of micro-batch j on stage s needs F of j on stage s - 1;
- B (or I) of j on stage s needs F of j on stage s, and B (or I) of j on stage s + 1;
- W of j on stage s needs I of j on stage s.

It returns a `Trace` of "compute" events with virtual times, the very form a run on a
`SimulatedWorld` with a clock records, so the same measures (`lib_dist.pipeline.metrics`)
and the same drawing (`lib_dist.comm.plot_trace`) apply to both. A schedule whose ranks all
wait for each other raises `ScheduleDeadlock`, naming what each rank waits for.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..comm.trace import Event, Trace
from .schedules import Schedule, Step, stages_of

DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


class ScheduleDeadlock(ValueError):
    """Every rank's next step waits for a step that cannot run first."""


def dependencies(step: Step, stages: int, present: set[Step]) -> list[Step]:
    """The steps `step` must wait for (see the module docstring); `present`: the schedule's
    steps, which say whether the next stage splits this micro-batch's backward."""
    j, s = step.micro_batch, step.stage
    if step.kind == "F":
        return [Step("F", j, s - 1)] if s > 0 else []
    if step.kind in ("B", "I"):
        after = Step("I", j, s + 1) if Step("I", j, s + 1) in present else Step("B", j, s + 1)
        return [Step("F", j, s)] + ([after] if s < stages - 1 else [])
    return [Step("I", j, s)]  # W


def simulate(schedule: Schedule, costs: Mapping[str, float] | None = None,
             message: float = 0.0) -> Trace:
    """The virtual timeline of `schedule`: one compute event per step, labelled "F3" (with
    ".stage" where a rank runs several stages). `costs`: units per step kind (forward 1,
    backward 2 by default); `message`: the units between a step and one on another rank that
    waits for it."""
    prices = {**DEFAULT_COSTS, **(costs or {})}
    owner = stages_of(schedule)
    stages = max(owner) + 1 if owner else 0
    _check_complete(schedule, stages)
    several = any(len({s.stage for s in steps}) > 1 for steps in schedule)
    present = {s for steps in schedule for s in steps}
    done: dict[Step, float] = {}
    free = [0.0] * len(schedule)
    nxt = [0] * len(schedule)
    trace = Trace()
    while any(n < len(steps) for n, steps in zip(nxt, schedule)):
        progressed = False
        for rank, steps in enumerate(schedule):
            while nxt[rank] < len(steps):
                step = steps[nxt[rank]]
                deps = dependencies(step, stages, present)
                if any(d not in done for d in deps):
                    break
                start = max([free[rank]] + [done[d] + (message if owner[d.stage] != rank else 0.0)
                                            for d in deps])
                end = start + prices[step.kind]
                done[step], free[rank] = end, end
                trace.record(Event(rank, "compute", -1, 0, start, end, seq=nxt[rank],
                                   after=nxt[rank], label=step.label(several),
                                   vstart=start, vend=end))
                nxt[rank] += 1
                progressed = True
        if not progressed:
            raise ScheduleDeadlock(_describe_wait(schedule, nxt, done, stages, present))
    return trace


def _check_complete(schedule: Schedule, stages: int) -> None:
    """Every step at most once, and a backward for every forward."""
    seen: set[Step] = set()
    for rank, steps in enumerate(schedule):
        for step in steps:
            if step in seen:
                raise ValueError(f"rank {rank} runs {step} twice")
            seen.add(step)
    for step in seen:
        j, s = step.micro_batch, step.stage
        if step.kind == "F" and not {Step("B", j, s), Step("I", j, s)} & seen:
            raise ValueError(f"{step} has no backward in the schedule")
        if step.kind == "I" and Step("W", j, s) not in seen:
            raise ValueError(f"{step} has no weight-gradient step W in the schedule")


def _describe_wait(schedule: Schedule, nxt: list[int], done: dict[Step, float],
                   stages: int, present: set[Step]) -> str:
    owner = stages_of(schedule)
    lines = []
    for rank, steps in enumerate(schedule):
        if nxt[rank] < len(steps):
            step = steps[nxt[rank]]
            missing = [f"{d.label()} of stage {d.stage}"
                       + (f" (rank {owner[d.stage]})" if d.stage in owner else " (on no rank)")
                       for d in dependencies(step, stages, present) if d not in done]
            lines.append(f"  rank {rank}: {step.label()} of stage {step.stage} waits for "
                         f"{', '.join(missing)}")
    return "the schedule deadlocks; every rank waits:\n" + "\n".join(lines)
