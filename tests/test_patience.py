"""`lib_dist.patience`: waits for processes stretch with the machine's load, go on while what
they wait for is still arriving, and say, when they run out, what they waited for, how long, and
the load they saw."""

from __future__ import annotations

import os

import pytest

from lib_dist.patience import CAP, load_factor, stretched, wait_for_count


def test_the_load_factor_is_the_load_per_core_between_one_and_the_cap():
    def per_core() -> float:
        return min(max(os.getloadavg()[0] / os.cpu_count(), 1.0), CAP)

    before, factor, after = per_core(), load_factor(), per_core()
    assert min(before, after) <= factor <= max(before, after)  # the kernel may update it
    assert 1.0 <= factor <= CAP
    assert 10.0 <= stretched(10.0) <= 10.0 * CAP


def test_a_count_still_growing_is_waited_for_past_the_wait():
    calls = []

    def one_more_each_call() -> int:
        calls.append(None)
        return len(calls)

    # a 2 s wait, but the count grows at every poll: 59 polls 0.05 s apart take it past 2 s
    # (and within its cap of 10 s, however busy the machine)
    waited = wait_for_count(one_more_each_call, 60, 2.0, "things", poll=0.05)
    assert len(calls) == 60
    assert waited > 2.0


def test_a_stuck_count_fails_saying_what_how_long_and_the_load():
    with pytest.raises(TimeoutError) as info:
        wait_for_count(lambda: 2, 4, 0.1, "engines registered", lambda: "engine output: none")
    text = str(info.value)
    assert text.startswith("only 2 of 4 engines registered within ")
    assert "the wait: 0.1 s, counted again from each arrival" in text
    assert f"on {os.cpu_count()} cores, the wait stretched x" in text
    assert text.endswith("\nengine output: none")
