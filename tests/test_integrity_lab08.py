"""Lab 8 cannot be passed with lib_dist's parameter server or its oracle: a submission that
imports lib_dist's answers, and one whose asynchronous server lets `replay_async` (what the
tests compare an asynchronous server with) compute its parameters, graded for real in the
sandbox, score 0 on the questions they take that way and keep the points of what they wrote,
while the solution keeps full marks and the untouched release scores 0 (see
tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               graded_lab)

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB08 = "lab08_parameter_server"

# The solution's worker and synchronous server, kept; the asynchronous server (by schedule and
# first come) receives every gradient but asks the replay for the parameters after it: the test
# model's seed found from the shard it started with, it would pass every test if it could.
START = "    version, pulled, sends, applied = 0, dict.fromkeys(workers, 0), [], []\n"
APPLY = "        shard -= rate(tau) * grad\n"
Q1 = answer_source(LAB08, "q1-solution")
assert Q1.count(START) == Q1.count(APPLY) == 2, "q1-solution's asynchronous server changed"
REPLAYS_THE_ORACLE = code("""
    import lib_dist.parameter_server


    @torch.enable_grad()  # serve runs without: the replay takes gradients
    def replayed_shard(comm, workers, start, order, rate):  # the oracle does the arithmetic
        lo, hi = shard_of(flat(small_model()).numel(), min(workers))[comm.rank]
        seed = next(s for s in range(100) if torch.equal(flat(small_model(s))[lo:hi], start))
        params = lib_dist.parameter_server.replay_async(small_model(seed), order, rate(0),
                                                        batch_of, mse, rate).parameters
        return params[lo:hi]
    """) + "\n\n" + Q1.replace(START, START + "    start = shard.clone()\n").replace(
    APPLY, "        order = [v for v, _ in applied] + [w]\n"
           "        shard.copy_(replayed_shard(comm, workers, start, order, rate))\n")

LAB08_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.parameter_server import serve, work\n",
        "q3-solution": "from lib_dist.parameter_server import local_sgd\n",
        "q4-solution": "from lib_dist.parameter_server import gossip_step\n",
        "q5-solution": "from lib_dist.parameter_server import TopK\n"},
        "all"),
    # the synchronous server is the solution's: Q1 keeps its points
    "replays_the_oracle": ({"q1-solution": REPLAYS_THE_ORACLE},
                           {"q2-test-schedule", "q2-test-cluster"}),
    # row 4 of the catalog: the same, the oracle reached around its guard (inspect.unwrap)
    "oracle_unwrapped": ({"q1-solution": "import inspect\n" + REPLAYS_THE_ORACLE.replace(
        "lib_dist.parameter_server.replay_async(",
        "inspect.unwrap(lib_dist.parameter_server.replay_async)(")},
        {"q2-test-schedule", "q2-test-cluster"}),
} | catalog(LAB08)


lab08 = graded_lab(LAB08, LAB08_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB08)))
def test_the_catalogs_cheats_score_zero(lab08, student):
    check_catalog(lab08, LAB08, student)


@pytest.mark.parametrize("student", sorted(set(LAB08_CHEATS) - set(catalog(LAB08))))
def test_lab08_cheats_score_zero(lab08, student):
    errors = check_cheat(lab08, LAB08, LAB08_CHEATS, student)
    off = "is lib_dist's own version, switched off while the lab is graded"
    refused = ("lab08_parameter_server asks you to write serve yourself: "
               "lib_dist.parameter_server.replay_async is what the tests compare with")
    expected = {
        "imports_lib_dist": [
            "lab08_parameter_server asks you to write this yourself: "
            f"lib_dist.parameter_server.serve {off}",
            f"lib_dist.parameter_server.work {off}",
            f"lib_dist.parameter_server.local_sgd {off}",
            f"lib_dist.parameter_server.gossip_step {off}",
            "lab08_parameter_server asks you to write TopK yourself: yours is "
            "lib_dist.parameter_server.compression.TopK, lib_dist's own"],
        # on simulated ranks, by schedule; and on an engine of the cluster, first come
        "replays_the_oracle": [f"rank 0: UsesOracle: {refused}, so your code may not use it",
                               f"lib_dist.integrity.oracles.UsesOracle: {refused}"],
        "oracle_unwrapped": [refused],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab08):
    check_blank_release(lab08)
