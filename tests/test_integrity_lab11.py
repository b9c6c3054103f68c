"""Lab 11 (the capstone) cannot be passed with lib_dist's mesh and 3D parallelism: a submission
that imports lib_dist's answers (the mesh's coordinates and groups from `lib_dist.comm.mesh`,
the step, its share of the batch and the checkpoint's `latest` from `lib_dist.three_d`), and
one whose answers delegate to `lib_dist.three_d` inside functions of its own (its own mesh
kept), graded for real in the sandbox, score 0 on the questions they take that way and keep
the points of what they wrote, while the solution keeps full marks, the untouched release
scores 0 and the demo's typical bug loses its own point only (see tests/test_integrity.py for
labs 01-03). One module-scoped grading serves every test here (the lab's 8 engines make a
grading slower than other labs')."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from grader.typical_bugs import TYPICAL_BUGS
from integrity_grading import catalog, check_blank_release, check_catalog, check_cheat, graded_lab

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

LAB11 = "lab11_capstone"

Q1_TESTS = {"q1-test-coordinates", "q1-test-groups"}
STEP_TESTS = {"q2-test-values", "q2-test-parameters", "q2-test-traces", "q2-test-cluster",
              "q3-test-resume", "q3-test-reshard"}
# The solution's train kept (it calls the imported three_d_step and latest_complete).
Q3 = answer_source(LAB11, "q3-solution")
TRAIN = Q3[Q3.index("def train"):]

LAB11_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.comm.mesh import Mesh\n"
                       "from lib_dist.comm.mesh import coordinates\n\n\n"
                       "def coordinates_of(rank, layout):\n"
                       "    return coordinates(rank, (layout.dp, layout.pp, layout.tp))\n\n\n"
                       "def mesh_groups(comm, layout):\n"
                       "    shape = (layout.dp, layout.pp, layout.tp)\n"
                       "    return Mesh(comm, shape, ('dp', 'pp', 'tp')).groups\n",
        "q2-solution": "from lib_dist.three_d.step import global_loss, three_d_step\n"
                       "from lib_dist.three_d.step import replica_batch as replica_share\n",
        "q3-solution": "from lib_dist.three_d.checkpoint import latest as latest_complete\n\n\n"
                       + TRAIN},
        "all"),
    "delegates_to_three_d": ({  # its own mesh (Q1 keeps its points), Q2 and Q3 lib_dist's
        "q2-solution": "import lib_dist.three_d as three_d\n\n\n"
                       "def replica_share(inputs, targets, dp):\n"
                       "    class Replicas:\n"
                       "        mesh = {'dp': dp}\n"
                       "    return three_d.replica_batch(Replicas(), inputs, targets)\n\n\n"
                       "def three_d_step(piece, optimizer, inputs, targets, m):\n"
                       "    return three_d.three_d_step(piece, optimizer, inputs, targets, m)\n",
        "q3-solution": "from lib_dist.three_d import checkpoint\n\n\n"
                       "def latest_complete(run):\n"
                       "    return checkpoint.latest(run)\n\n\n" + TRAIN},
        {"q2-test-share", "q3-test-latest"} | STEP_TESTS),
    # not a cheat: the demo's carol, graded for real, loses latest_complete's point only
    "typical_bug": (dict([TYPICAL_BUGS[LAB11]]), {"q3-test-latest"}),
} | catalog(LAB11)


lab11 = graded_lab(LAB11, LAB11_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB11)))
def test_the_catalogs_cheats_score_zero(lab11, student):
    check_catalog(lab11, LAB11, student)


@pytest.mark.parametrize("student", sorted(set(LAB11_CHEATS) - set(catalog(LAB11))))
def test_lab11_cheats_score_zero(lab11, student):
    errors = check_cheat(lab11, LAB11, LAB11_CHEATS, student)
    this = "lab11_capstone asks you to write this yourself: "
    expected = {
        "imports_lib_dist": [  # the groups fail first: the step and the runs stop there
            f"{this}lib_dist.comm.mesh.coordinates is lib_dist's own version, switched off "
            "while the lab is graded",
            f"{this}lib_dist.comm.mesh.Mesh.__init__ is lib_dist's own version",
            f"{this}lib_dist.three_d.step.replica_batch is lib_dist's own version",
            f"{this}lib_dist.three_d.checkpoint.latest is lib_dist's own version"],
        "delegates_to_three_d": [
            f"{this}lib_dist.three_d.step.replica_batch is lib_dist's own version",
            f"{this}lib_dist.three_d.step.three_d_step is lib_dist's own version",
            f"{this}lib_dist.three_d.checkpoint.latest is lib_dist's own version"],
        "typical_bug": ["latest_complete with checkpoints [2, 9, 10] complete and [12] without "
                        "layout.json: returned"],
    }[student]
    for text in expected:
        assert text in errors, errors[-3000:]


def test_the_blank_release_scores_zero(lab11):
    check_blank_release(lab11)
