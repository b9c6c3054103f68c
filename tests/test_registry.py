"""lib_dist.registry: a student's answers, loaded from their lab
notebooks (here the instructor's solutions, as a student who solved the labs holds them), become
what lib_dist runs on: lab03's ring as `comm.all_reduce(..., algorithm="mine")`, lab04's
ShardSampler and DataParallel as `lib_dist.data_parallel`'s. The ring is proved to have run by
its trace: 2(N-1) messages per rank, each to the right neighbour, none through rank 0.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

import lib_dist.data_parallel
from lib_dist import registry
from lib_dist.comm import SimulatedWorld
from lib_dist.comm.algorithms import ALGORITHMS
from lib_dist.extend import LABS
from lib_dist.registry import MissingAnswer, forget, implementation, register, use_my_answers

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS, RELEASE = REPO / "solutions", REPO / "labs"
N = 4


@pytest.fixture(autouse=True)
def clean_registry():
    forget()
    yield
    forget()


def sends_by_rank(comm_trace, world_size):
    return {r: [e.peer for e in comm_trace.events if e.rank == r and e.kind == "send"]
            for r in range(world_size)}


def reduced(comm, algorithm, op="sum"):
    t = torch.arange(10, dtype=torch.float64) * (comm.rank + 1)
    comm.all_reduce(t, op, algorithm=algorithm)
    return t


def test_the_students_ring_is_an_algorithm_of_all_reduce(tmp_path):
    loaded = use_my_answers(SOLUTIONS, "ring_all_reduce")
    assert loaded["ring_all_reduce"].__module__.startswith("notebook_")  # theirs, not lib_dist's
    world = SimulatedWorld(N)
    got = world.run(reduced, "mine", "avg")
    want = torch.arange(10, dtype=torch.float64) * sum(range(1, N + 1)) / N
    assert all(torch.allclose(t, want) for t in got)
    sends = sends_by_rank(world.trace, N)
    assert sends == {r: [(r + 1) % N] * 2 * (N - 1) for r in range(N)}  # a ring's messages
    assert [e.kind for e in world.trace.events if e.rank == 0][-1] == "all_reduce"
    # by its other name, and by default once preferred
    world = SimulatedWorld(3)
    world.run(reduced, "ring_all_reduce")
    assert sends_by_rank(world.trace, 3) == {r: [(r + 1) % 3] * 4 for r in range(3)}
    registry.prefer_all_reduce("mine")
    world = SimulatedWorld(3)
    world.run(reduced, None)
    assert sends_by_rank(world.trace, 3) == {r: [(r + 1) % 3] * 4 for r in range(3)}


def test_lib_dists_named_algorithms_and_an_unknown_one():
    for name in ALGORITHMS:
        world = SimulatedWorld(N)
        got = world.run(reduced, name)
        assert all(torch.equal(t, got[0]) for t in got), name
        assert torch.allclose(got[0], torch.arange(10, dtype=torch.float64) * 10), name
    world = SimulatedWorld(N)
    world.run(reduced, "ring")
    assert sends_by_rank(world.trace, N) == {r: [(r + 1) % N] * 2 * (N - 1) for r in range(N)}
    default = SimulatedWorld(N)
    default.run(reduced, None)  # gather-broadcast: everything through rank 0
    assert sends_by_rank(default.trace, N)[0] == [1, 2, 3]
    with pytest.raises(Exception) as failed:
        SimulatedWorld(2).run(reduced, "ringg")
    message = str(failed.value)
    assert "unknown all-reduce algorithm 'ringg'" in message
    assert all(name in message for name in ALGORITHMS)
    assert "'mine' once lib_dist.registry.use_my_answers" in message
    with pytest.raises(ValueError, match="one of lib_dist's own"):
        registry.register_all_reduce("ring", lambda comm, t, op: t)


def test_the_students_sampler_and_data_parallel_replace_lib_dists():
    reference = lib_dist.data_parallel.DataParallel
    use_my_answers([SOLUTIONS / "lab04_data_parallel" / "lab04_data_parallel.ipynb"],
                   "ShardSampler", "DataParallel")
    from lib_dist.data_parallel import DataParallel, ShardSampler  # as modules 07 and 09 do

    assert DataParallel is implementation("DataParallel") is not reference
    assert ShardSampler.__module__.startswith("notebook_")
    assert [list(ShardSampler(10, 2, r, seed=1)) for r in (0, 1)] == [
        list(torch.utils.data.DistributedSampler(range(10), 2, r, seed=1)) for r in (0, 1)]
    base = torch.nn.Linear(3, 2).double()

    def step(comm):
        model = DataParallel(copy.deepcopy(base), comm)
        x = torch.full((2, 3), float(comm.rank + 1), dtype=torch.float64)
        model(x).sum().backward()
        return model.module.weight.grad

    grads = SimulatedWorld(2).run(step)
    assert torch.allclose(grads[0], grads[1]) and torch.allclose(grads[0], torch.full(
        (2, 3), 3.0, dtype=torch.float64))  # the mean of 2*1 and 2*2
    forget()
    assert lib_dist.data_parallel.DataParallel is reference
    assert implementation("DataParallel") is reference


def test_a_missing_answer_names_the_lab_and_notebook_that_writes_it(tmp_path):
    with pytest.raises(MissingAnswer, match=r"ring_all_reduce is written in lab03_collectives "
                                            r"\(lab03_collectives/lab03_collectives.ipynb\)"):
        use_my_answers(tmp_path)
    released = tmp_path / "labs"
    shutil.copytree(RELEASE / "lab03_collectives", released / "lab03_collectives")
    with pytest.raises(MissingAnswer) as unanswered:
        use_my_answers(released, "ring_all_reduce")
    assert "lab03_collectives" in str(unanswered.value)
    assert "does not answer it yet" in str(unanswered.value)
    # lab03 answered, lab04 not: nothing is registered, lib_dist is as it was
    shutil.copytree(SOLUTIONS / "lab03_collectives", tmp_path / "mine" / "lab03_collectives")
    with pytest.raises(MissingAnswer, match="ShardSampler, DataParallel are written in lab04_data"):
        use_my_answers(tmp_path / "mine")
    assert registry.registered_all_reduces() == []
    with pytest.raises(MissingAnswer, match="no implementation of 'zigzag'"):
        implementation("zigzag")


def test_register_one_answer_and_the_labs_that_use_earlier_answers():
    register("ShardSampler", dict)
    assert implementation("ShardSampler") is dict
    assert registry.lab_of("ring_all_reduce") == "lab03_collectives"
    for lab, spec in LABS.items():
        for name in spec.uses:
            assert registry.lab_of(name) < lab, (lab, name)  # an earlier lab's answer
    assert LABS["lab04_data_parallel"].uses == ("ring_all_reduce",)


STUDENT_RUN = """
import sys
import torch
from lib_dist.comm import SimulatedWorld
from lib_dist.registry import use_my_answers

def total(comm):
    return comm.all_reduce(torch.ones(3))

world = SimulatedWorld(3)  # lib_dist's own all-reduce is lab03's: a stand-in runs instead
print("stand-in:", [t.tolist() for t in world.run(total)],
      [e.peer for e in world.trace.events if e.rank == 0 and e.kind == "send"])
try:
    SimulatedWorld(2).run(lambda comm: comm.all_reduce(torch.ones(3), algorithm="ring"))
except Exception as e:
    print("stub:", "lab03_collectives asks you to write this yourself" in str(e))
use_my_answers(sys.argv[1], "ring_all_reduce", default_all_reduce=True)
world = SimulatedWorld(3)
print("sums:", [t.tolist() for t in world.run(total)])
print("sends:", [e.peer for e in world.trace.events if e.rank == 0 and e.kind == "send"])
"""


@pytest.fixture(scope="module")
def student_home(tmp_path_factory):
    from grader.edition import student_edition

    return student_edition(tmp_path_factory.mktemp("editions") / "student_edition")


def in_student_edition(home, script, *args):
    """`script` run by a Python whose lib_dist is the student edition `home`: its output."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=home.parent,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(home)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_in_the_student_edition_the_students_ring_is_comms_all_reduce(student_home):
    """There lib_dist's own ring is a stub naming lab03, and `comm.all_reduce` runs a stand-in
    (Bruck's rounds, `lib_dist.comm.stand_ins`) until the student's registered ring is
    preferred; then it runs theirs."""
    out = in_student_edition(student_home, STUDENT_RUN, SOLUTIONS)
    # the stand-in on 3 ranks: Bruck's reduce-scatter (rank 0 sends to 0 + 2, then 0 + 1),
    # then his all-gather (to 0 - 1 = 2, then 0 - 2 = 1); the ring sends to rank 1 only
    assert out.stdout.splitlines() == [f"stand-in: {[[3.0] * 3] * 3} [2, 1, 2, 1]", "stub: True",
                                       f"sums: {[[3.0] * 3] * 3}", "sends: [1, 1, 1, 1]"], out.stdout


def test_a_later_lab_takes_lib_dists_own_earlier_answers_unless_the_students_are_registered(
        tmp_path):
    """Here, with the references (the instructor's edition, and a graded lab's by default),
    `earlier_answers` never reads the folder; the judge's `--own-answers` registers the
    student's, which it then takes."""
    from lib_dist.pipeline import split_model
    from lib_dist.tensor_parallel import ParallelAttention

    assert registry.earlier_answers(tmp_path, "ParallelAttention", "split_model") == (
        ParallelAttention, split_model)
    register("ParallelAttention", dict)
    assert registry.earlier_answers(tmp_path, "ParallelAttention") == (dict,)


STUDENT_BLOCKS = """
import sys
import torch
from lib_dist.comm import SimulatedWorld
from lib_dist.models.gpt import Block, GPTConfig
from lib_dist.registry import MissingAnswer, earlier_answers
from lib_dist.tensor_parallel import ParallelBlock
from lib_dist.three_d.checkpoint import split_of

block = Block(GPTConfig(vocab_size=1, block_size=4, n_layer=1, n_head=4, n_embd=8)).double()
x = torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
try:
    SimulatedWorld(2).run(lambda comm: ParallelBlock(block, comm))
except Exception as e:
    print("stub:", "lab06_tensor_parallel asks you to write this yourself" in str(e))
try:
    earlier_answers(sys.argv[2], "ParallelAttention", "ParallelMLP")
except MissingAnswer as e:
    print("missing:", str(e).split(" (")[0])
attention, mlp = earlier_answers(sys.argv[1], "ParallelAttention", "ParallelMLP")
print("theirs:", attention.__module__, mlp.__module__)

def run(comm):
    mine = ParallelBlock(block, comm)
    return mine(x).detach(), split_of(mine)

outs = SimulatedWorld(2).run(run)
want = block(x).detach()
# two partial products summed per output: float64 round-off of the block's 4 * 8-term sums
tol = 4 * 8 * torch.finfo(torch.float64).eps * want.abs().max().item()
print("equal:", all((out - want).abs().max().item() <= tol for out, _ in outs))
splits = outs[0][1]
print("splits:", splits["attn.qkv.weight"], splits["attn.proj.weight"], splits["mlp.fc.bias"],
      splits["mlp.proj.bias"])
print("lab05:", *(f.__module__ for f in earlier_answers(sys.argv[1], "split_model",
                                                           "one_f_one_b_step")))
"""


def test_in_the_student_edition_module_6s_block_is_built_of_the_students_lab06(student_home,
                                                                               tmp_path):
    """Labs 10 and 11 build on lab06's attention and MLP (inside `ParallelBlock`) and lab05's
    split and 1F1B step. The student edition has none of them: `earlier_answers` loads the
    student's own from their notebooks (here the solutions), and `ParallelBlock` runs them,
    equal to the unsplit block; a lab not done yet is named."""
    out = in_student_edition(student_home, STUDENT_BLOCKS, SOLUTIONS, tmp_path)
    assert out.stdout.splitlines() == [
        "stub: True", "missing: ParallelAttention, ParallelMLP are written in lab06_tensor_parallel",
        "theirs: notebook_lab06_tensor_parallel notebook_lab06_tensor_parallel", "equal: True",
        "splits: (0, 3) (1, 1) (0, 1) None",
        "lab05: notebook_lab05_pipeline notebook_lab05_pipeline"], out.stdout


STUDENT_CAPSTONE = """
import os
import sys
os.chdir(sys.argv[1])  # the lab's folder: ".." holds the student's lab05 and lab06 notebooks
from lib_dist.definitions import definitions
from lib_dist.three_d import Layout

checks = definitions("lab11_capstone.ipynb", "check_losses", "check_parameters")
ns = checks.check_losses.__globals__
checks.check_losses(Layout(2, 2, 2))
checks.check_parameters(Layout(2, 2, 2))
print("theirs:", *(ns[name].__module__ for name in ("split_model", "one_f_one_b_step",
                                                     "ParallelAttention", "ParallelMLP")))
"""


def test_in_the_student_edition_the_capstone_trains_on_the_students_lab05_and_lab06(
        student_home):
    """Lab11's own checks of its 3D step (losses and parameters equal to one process's, float64,
    8 simulated ranks) pass in the student edition, on the lab05 and lab06 answers beside it."""
    out = in_student_edition(student_home, STUDENT_CAPSTONE, SOLUTIONS / "lab11_capstone")
    assert out.stdout.splitlines()[-1] == (
        "theirs: notebook_lab05_pipeline notebook_lab05_pipeline notebook_lab06_tensor_parallel "
        "notebook_lab06_tensor_parallel"), out.stdout
