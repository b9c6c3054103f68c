"""Pipeline schedules as data: which step each rank runs, in which order, and nothing else.

A schedule is a list, one entry per rank, of `Step`s: the forward ("F") or backward ("B") of
one micro-batch through one stage (zero-bubble schedules split a backward into "I", the
gradient of the stage's input, which the previous stage waits for, and "W", the gradient of
its weights, which nobody waits for). Keeping the schedule apart from its execution lets a
schedule be checked, simulated and drawn on its own (`simulate`), and run for real by
`lib_dist.pipeline.execute.run_schedule`, which follows the list.

    gpipe(p, m)        every forward, then every backward: m live activations per stage
    one_f_one_b(p, m)  p - 1 - r warm-up forwards on rank r, then alternate: at most p - r
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True)
class Step:
    """The forward or backward of micro-batch `micro_batch` through stage `stage`."""

    kind: str
    micro_batch: int
    stage: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a step's kind is one of {KINDS}, got {self.kind!r}")

    def label(self, with_stage: bool = False) -> str:
        """"F3" (with the stage: "F3.1"), as timelines show it."""
        return f"{self.kind}{self.micro_batch}" + (f".{self.stage}" if with_stage else "")


Schedule = list[list[Step]]  # by rank


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: rank r runs the forwards of micro-batches 0..m-1 through stage r, then their
    backwards in the same order."""
    _check(p, m)
    return [[Step("F", j, r) for j in range(m)] + [Step("B", j, r) for j in range(m)]
            for r in range(p)]


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: rank r runs min(p - 1 - r, m) warm-up forwards, then one forward and one
    backward in turn, then the backwards left. A backward frees its micro-batch's
    activations, so rank r never holds more than min(p - r, m)."""
    _check(p, m)
    schedule = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        steps = [Step("F", j, r) for j in range(warmup)]
        for j in range(m - warmup):
            steps += [Step("F", warmup + j, r), Step("B", j, r)]
        steps += [Step("B", j, r) for j in range(m - warmup, m)]
        schedule.append(steps)
    return schedule


def naive(p: int) -> Schedule:
    """The whole batch as one micro-batch: a forward through every stage, then a backward."""
    return gpipe(p, 1)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def stages_of(schedule: Schedule) -> dict[int, int]:
    """Which rank runs each stage (stage -> rank), checking that each stage has one rank."""
    owner: dict[int, int] = {}
    for rank, steps in enumerate(schedule):
        for step in steps:
            if owner.setdefault(step.stage, rank) != rank:
                raise ValueError(f"stage {step.stage} has steps on ranks {owner[step.stage]} "
                                 f"and {rank}; a stage lives on one rank")
    return owner


def _check(p: int, m: int) -> None:
    for name, value in (("p (stages)", p), ("m (micro-batches)", m)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
