"""Grading several submissions at once: a class graded in about half the time on two cores.

One submission leaves much of a machine idle: its engines wait on each other's messages, its
kernel waits on its engines, and a one-process lab trains on one torch thread (what the sandbox
sets, as torchrun does for each rank). `grade_at_once` keeps `jobs` submissions in flight, each
in a worker process of its own that grades exactly as `autograde` does one at a time: the same
sandbox, the same limits, the same sweep of strays (each worker is its own subreaper).

Two submissions of the same student never run at once: the sandbox shows a submission that
student's other graded labs, which a concurrent regrade of one of them would be rewriting.
Students are entered into the gradebook before any worker starts, so no two workers race to
create the same one; everything else a worker writes there is one short transaction.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from nbgrader.api import Gradebook

from .processes import become_subreaper
from .submission import Outcome, Submission

if TYPE_CHECKING:
    from .course import Course
    from .sandbox import Limits


def default_jobs(limits: Limits) -> int:
    """Submissions to grade at once: one per core, as many as the machine's memory holds at
    each sandbox's limit. On a 2-core machine 2 at a time grade lab00 in 0.6-0.8 of the time
    one at a time does (benchmarks/grading_throughput.py); 3 at a time gain no more than
    noise over 2 (6 submissions each, 2 rounds: lab00 2.14 s against 2.19 s, lab04 4.56 s
    against 4.69 s per submission)."""
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    return max(1, min(os.cpu_count() or 1, memory_mb // limits.total_memory_mb))


def grade_at_once(course: Course, submissions: list[Submission], jobs: int,
                  grade: Callable[[Course, Submission], Outcome],
                  done: Callable[[Submission], None]) -> list[Outcome]:
    """Grade `submissions` with at most `jobs` in flight, each by `grade(course, submission)`
    in a worker (`grading.grade_one`); their outcomes, in the same order. `done` is called as
    each one finishes (the progress bar)."""
    enter_students(course, {s.student for s in submissions})
    portable = dataclasses.replace(course, _api=None)  # nbgrader's API stays in its process
    pending = by_turns(submissions)
    running: dict[Future, int] = {}
    outcomes: dict[int, Outcome] = {}
    # forked, not spawned: a spawned worker would run the caller's script (`python -m grader`)
    # again, and import nbgrader and torch again
    fork = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=fork, initializer=become_subreaper) as pool:
        while pending or running:
            for i in next_to_start(submissions, pending, running, jobs):
                pending.remove(i)
                running[start(pool, grade, portable, submissions[i])] = i
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                i = running.pop(future)
                outcomes[i] = outcome_of(future, submissions[i])
                done(submissions[i])
    return [outcomes[i] for i in range(len(submissions))]


def by_turns(submissions: list[Submission]) -> list[int]:
    """Their indices, one submission of each student in turn: no student's labs are left to
    be graded one at a time at the end, while others' could have run beside them."""
    turns: Counter[str] = Counter()
    keyed = []
    for i, sub in enumerate(submissions):
        keyed.append((turns[sub.student], i))
        turns[sub.student] += 1
    return [i for _, i in sorted(keyed)]


def next_to_start(submissions: list[Submission], pending: list[int],
                  running: dict[Future, int], jobs: int) -> list[int]:
    """The pending submissions to start now, in order, skipping students already in flight."""
    busy = {submissions[i].student for i in running.values()}
    chosen: list[int] = []
    for i in pending:
        if len(running) + len(chosen) == jobs:
            break
        if submissions[i].student not in busy:
            busy.add(submissions[i].student)
            chosen.append(i)
    return chosen


def start(pool: ProcessPoolExecutor, grade: Callable, *args) -> Future:
    """`grade(*args)` in a worker; a pool that a dead worker broke fails it like the others."""
    try:
        return pool.submit(grade, *args)
    except BrokenProcessPool as error:
        failed: Future = Future()
        failed.set_exception(error)
        return failed


def outcome_of(future: Future, sub: Submission) -> Outcome:
    """The worker's outcome; a worker that died grading it fails this submission, saying so."""
    try:
        return future.result()
    except Exception as error:  # noqa: BLE001 - reported as this submission's failure
        return Outcome(sub, None, None, 0.0, 0, f"the grader's worker process failed "
                       f"({type(error).__name__}: {error}); grade it again on its own")


def enter_students(course: Course, students: set[str]) -> None:
    """Into the course's gradebook, which `autograde` has made by now."""
    with Gradebook(course.db_url, course.course_id) as gradebook:
        for student in sorted(students):
            gradebook.update_or_create_student(student)
