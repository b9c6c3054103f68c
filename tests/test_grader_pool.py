"""grader.pool's scheduling, without grading anything: which submissions start together, and
what a dead worker leaves in the outcomes. (Grading two at a time for real is in
test_grader.py, whose thirteen hostile lab00 submissions are graded that way.)"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from grader.grading import Submission, autograde
from grader.pool import by_turns, default_jobs, next_to_start, outcome_of
from grader.sandbox import Limits


def subs(*students: str) -> list[Submission]:
    return [Submission(s, f"lab{i:02d}", Path(f"{s}.ipynb")) for i, s in enumerate(students)]


def running(*indices: int) -> dict[Future, int]:
    return {Future(): i for i in indices}


def test_the_first_pending_submissions_start_up_to_jobs():
    s = subs("ann", "bo", "cy", "di")
    assert next_to_start(s, [0, 1, 2, 3], running(), jobs=2) == [0, 1]
    assert next_to_start(s, [2, 3], running(1), jobs=2) == [2]
    assert next_to_start(s, [2, 3], running(0, 1), jobs=2) == []


def test_a_student_already_in_flight_waits_and_others_go_first():
    s = subs("ann", "ann", "ann", "bo")
    assert next_to_start(s, [0, 1, 2, 3], running(), jobs=2) == [0, 3]
    assert next_to_start(s, [1, 2], running(3), jobs=2) == [1]
    assert next_to_start(s, [1, 2, 3], running(0), jobs=3) == [3]


def test_students_take_turns_so_no_one_is_left_alone_at_the_end():
    s = subs("ann", "ann", "ann", "bo", "bo", "cy")
    assert by_turns(s) == [0, 3, 5, 1, 4, 2]


def test_a_dead_worker_fails_its_submission_and_says_what_to_do():
    sub = subs("ann")[0]
    future: Future = Future()
    future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
    outcome = outcome_of(future, sub)
    assert outcome.submission == sub and outcome.score is None
    assert "worker process failed" in outcome.error and "grade it again" in outcome.error


def test_jobs_follow_cores_and_memory():
    assert default_jobs(Limits()) >= 1
    assert default_jobs(Limits(total_memory_mb=10**9)) == 1  # no room for two


def test_jobs_below_one_are_refused(tmp_path):
    from grader.course import Course

    with pytest.raises(ValueError, match="jobs must be at least 1"):
        autograde(Course(tmp_path, sandbox=False), [], jobs=0)
