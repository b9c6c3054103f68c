"""What the grader grades and what it learns: a `Submission` and its `Outcome`.

Types of their own, shared by `grading` (one at a time) and `pool` (several at once), so that
neither imports the other for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str
    path: Path


@dataclass(frozen=True)
class Outcome:
    submission: Submission
    score: float | None
    max_score: float | None
    seconds: float
    strays: int  # processes the submission left behind, ended by the grader
    error: str = ""
    started: float = 0.0  # time.time() when its grading began
