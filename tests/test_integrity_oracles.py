"""The oracle guard itself (`lib_dist.integrity.oracles`), without the grader: inside an answer
(a function wrapped as the guard wraps the student's), building or calling what the tests
compare with raises `UsesOracle`, however the answer reaches it; outside, and on other threads
meanwhile, the oracles work as before, and an oracle the tests made and hand to an answer still
works in it. (tests/test_integrity*.py grade real cheats; this runs in a second or two.)

It runs in a fresh interpreter graded as lab 4, as an engine of a graded kernel is: guarding
changes torch's classes for good, which this test session's other tests should not see.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import copy, contextlib, threading
    import torch
    from torch.utils.data import DistributedSampler
    from lib_dist.integrity.answers import checked
    from lib_dist.integrity.oracles import UsesOracle, guard_oracles
    from lib_dist.integrity.stubs import AskedToWrite, switch_off_references

    guard_oracles("lab02_training")  # lab 4's are guarded on import (LIB_DIST_GRADED_LAB)

    def refused(fn, *args):
        try:
            fn(*args)
        except UsesOracle as e:
            return str(e)
        raise AssertionError(f"{fn.__name__} was not refused")

    def answer(fn, name="ShardSampler.__iter__"):  # as the guard wraps a student's method
        return checked(fn, name, guard=0)

    # built inside an answer: refused, naming the answer and the oracle
    message = refused(answer(lambda: list(DistributedSampler(range(8), 2, 0))))
    assert message == ("lab04_data_parallel asks you to write ShardSampler yourself: "
                       "torch.utils.data.DistributedSampler is what the tests compare with, so "
                       "your code may not use it"), message
    # built by a test: works; and that object, handed to an answer, works in it
    theirs = DistributedSampler(range(8), 2, 0)
    assert answer(lambda s: list(s))(theirs) == list(theirs)

    # every way in from an answer
    class Mine:
        __iter__ = DistributedSampler.__iter__  # borrowed
    mine = Mine()
    mine.__dict__.update(vars(theirs))
    class Sub(DistributedSampler):
        def __init__(self):  # skips the guarded __init__; __new__ is guarded too
            self.__dict__.update(vars(theirs))
    def generator():
        yield from DistributedSampler(range(8), 2, 0)
    @contextlib.contextmanager
    def context():
        DistributedSampler(range(8), 2, 0)
        yield
    def with_context():
        with answer(context)():
            pass
    for way in [answer(lambda: DistributedSampler.__iter__(mine)),
                answer(lambda: Sub()), answer(lambda: copy.copy(theirs)),
                answer(lambda: object.__new__(DistributedSampler).__init__(range(8), 2, 0)),
                lambda: list(answer(Mine.__iter__)(mine)),
                lambda: list(answer(generator)()),  # the generator runs after the answer returned
                with_context]:
        refused(way)
    assert list(Sub()) == list(theirs) and list(generator()) == list(theirs)  # outside: fine

    # one thread inside an answer, another (a test on a simulated rank) building the oracle
    inside, done = threading.Event(), threading.Event()
    def waits():
        inside.set()
        done.wait(10)
        DistributedSampler(range(8), 2, 0)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(refused(answer(waits))))
    thread.start()
    inside.wait(10)
    DistributedSampler(range(8), 2, 1)  # this thread runs no answer
    done.set()
    thread.join()
    assert errors and "DistributedSampler" in errors[0]

    # lab 2: an SGD of its own inside update is refused; the test's optimizer still steps
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    def update():
        torch.optim.SGD([p], lr=0.1).step()
    assert "torch.optim.SGD is what the tests" in refused(answer(update, "SGD.update"))
    class CountingSGD(torch.optim.SGD):
        pass
    for optimizer in (torch.optim.SGD([p], lr=0.5), CountingSGD([p], lr=0.5),
                      torch.optim.AdamW([p], lr=0.5)):
        answer(lambda: optimizer.step(), "accumulated_step")()
    assert "SGD" in refused(answer(lambda: torch.optim.SGD.step(optimizer), "SGD.step"))  # AdamW

    # a function oracle (a later lab's, say): rebound where it is defined
    import lib_dist.losses
    from lib_dist.extend import LABS, Lab
    LABS["lab99_fake"] = Lab(("loss",), oracles=("lib_dist.losses:cross_entropy",))
    guard_oracles("lab99_fake")
    z, y = torch.zeros(2, 3), torch.tensor([0, 1])
    assert abs(float(lib_dist.losses.cross_entropy(z, y)) - 1.0986) < 1e-4
    assert "lib_dist.losses.cross_entropy is what" in refused(
        answer(lambda: lib_dist.losses.cross_entropy(z, y), "loss"))

    # horovod's broadcast of parameters is switched off; the second switching-off (when the
    # guard arms) goes through the oracles' wrappers to lib_dist's own functions
    import lib_dist.horovod as hvd
    from lib_dist.data_parallel import DataParallel
    switch_off_references("lab04_data_parallel")
    for call in (lambda: hvd.broadcast_parameters([p], 0),
                 lambda: DataParallel(torch.nn.Linear(2, 2), None)):
        try:
            call()
            raise AssertionError("not switched off")
        except AskedToWrite as e:
            assert "switched off while the lab is graded" in str(e), e
    assert "lib_dist.data_parallel.DataParallel is what" in refused(
        answer(lambda: DataParallel(torch.nn.Linear(2, 2), None), "DataParallel.__init__"))

    # the guard's snapshot watches the oracles: undoing the guard is tampering
    from lib_dist.integrity.guard import Guard
    guard = Guard("lab04_data_parallel", {})
    torch.optim.SGD([p], lr=0.1).step()  # torch's lazy patching was done before the snapshot
    assert guard.changes() == [], guard.changes()
    hvd.init()  # lib_dist.horovod's own state, which a student may set up: not tampering
    assert guard.changes() == [], guard.changes()
    DistributedSampler.__new__ = object.__new__
    assert "torch.utils.data.distributed.DistributedSampler.__new__" in guard.changes()
    print("all good")
''')


def test_oracles_refuse_answers_only():
    env = {**os.environ, "LIB_DIST_GRADED_LAB": "lab04_data_parallel"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "all good" in out.stdout
