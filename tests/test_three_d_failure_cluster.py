"""Surviving a failure on real ranks (lib_dist.three_d.resume, on a Cluster of 8 engines in one
gloo group). First, on the fresh engines, the (2, 2, 2) mesh itself: each rank's dp, pp and tp
groups hold the ranks that differ from it along that dimension only, and an all-reduce in each
group sums those ranks' values and no others. Then module 02's tiny GPT trained at
(dp=2, pp=2, tp=2) checkpoints every EVERY steps
with torch.distributed.checkpoint, each rank its own shards; one engine's process is killed
mid-run (SIGKILL, as a crash); the controller gets a RankFailure naming that rank, not a hang;
the cluster's engines are replaced (`Cluster.restart`, what `run` does after a broken group)
and the run resumes from the last complete checkpoint, on the same layout and on another one
(resharded), with the loss curve of a run that never failed, in float64. Pipeline messages
go over sub-groups: a send to a dead rank there is refused as a communication error (CommError),
whether gloo refuses it as it is posted or as it is waited on, so that only the dead rank is
named as the cause.

Printed, as this run's measurements (never asserted): how long the controller took to report
the dead rank after the kill, how long the restart took, each rank's checkpoint bytes and its
save and load times."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from conftest import alive
from lib_dist.cluster import Cluster, RankFailure
from lib_dist.cluster.streaming import run_streaming
from lib_dist.comm import CommError
from lib_dist.comm.mesh import coordinates
from lib_dist.three_d import Layout
from lib_dist.three_d.checkpoint import latest
from lib_dist.three_d.model import NAMES
from lib_dist.three_d.resume import crashed_at, train

from test_three_d import BATCH, CONFIG, batches, one_process
from tolerances import gpt_terms, rounding

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster]

N, BEFORE = 8, Layout(2, 2, 2)
SHAPE = (BEFORE.dp, BEFORE.pp, BEFORE.tp)  # BEFORE as a mesh of NAMES
AFTER = [Layout(2, 2, 2), Layout(4, 1, 2)]  # the same layout, and pp=2 -> 1, dp=2 -> 4
STEPS, CYCLE, EVERY = 4, 3, 2
VICTIM, DIES_AT = 3, 3  # rank 3 (dp 0, pp 1, tp 1: a writer of shards) dies before step 3
# Every loss comes out of a forward pass on parameters that carry the earlier steps' rounding:
# the chains of additions behind it add up to at most STEPS forward and backward passes of the
# whole GPT on the global batch (tolerances.gpt_terms), each with the N ranks' parts added.
TERMS = STEPS * (gpt_terms(CONFIG, BATCH * CONFIG.block_size) + N)


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=60) as c:
        yield c


def ignore(rank: int, stream: str, text: str) -> None:
    """The ranks print nothing worth showing."""


def mesh_groups(comm):
    """This rank's place in the (2, 2, 2) mesh and, per dimension, its group's world ranks,
    its rank and size in the group, and the group's all-reduce of 2**rank (a sum that says
    exactly which ranks it added)."""
    from lib_dist.comm.mesh import Mesh
    from lib_dist.three_d.plots import members

    mesh = Mesh(comm, SHAPE, NAMES)
    out = {}
    for name in NAMES:
        group = mesh[name]
        total = group.all_reduce(torch.tensor([2.0 ** comm.rank], dtype=torch.float64))
        out[name] = (members(group), group.rank, group.world_size, int(total.item()))
    return mesh.coords, out


def test_a_mesh_on_8_real_ranks_gives_each_rank_its_dp_pp_and_tp_groups(cluster):
    results = cluster.run(mesh_groups)
    for rank, (coords, out) in enumerate(results):
        assert coords == coordinates(rank, SHAPE)
        for d, name in enumerate(NAMES):
            want = [r for r in range(N) if all(
                c == coords[i] for i, c in enumerate(coordinates(r, SHAPE)) if i != d)]
            assert out[name] == (want, want.index(rank), 2, sum(2**r for r in want)), (
                rank, name, out[name])
    # rank 0's groups: tp its neighbour, pp two apart, dp four apart
    assert [results[0][1][n][0] for n in NAMES] == [[0, 4], [0, 2], [0, 1]]


def test_a_rank_killed_mid_run_is_named_and_the_run_resumes_on_any_layout(cluster, tmp_path):
    data = [batches(step, CYCLE) for step in range(STEPS)]
    want = one_process(STEPS, CYCLE)
    run = tmp_path / "run"
    victim = cluster.ranks[VICTIM]["pid"]
    with pytest.raises(RankFailure) as failed:  # not RankTimeout: nobody waits for it
        run_streaming(cluster, train, BEFORE, CONFIG, data, run, every=EVERY,
                      crash=(VICTIM, DIES_AT), on_output=ignore, restart=False)
    reported = time.time()
    assert failed.value.ranks == [VICTIM], failed.value  # the rank that died, named
    assert "the engine process died" in failed.value.failures[VICTIM]
    assert alive([victim]) == []
    killed = crashed_at(run)
    assert killed is not None
    assert latest(run) == run / "step2"  # the checkpoint before the crash
    began = time.perf_counter()
    cluster.restart()
    restarted = time.perf_counter() - began
    assert victim not in {info["pid"] for info in cluster.ranks}
    print(f"\n{N} engines, {BEFORE}: rank {VICTIM} killed before step {DIES_AT}; "
          f"reported {reported - killed:.2f} s after the kill; engines replaced and group "
          f"rebuilt in {restarted:.2f} s (this run's)")
    on_disk = {d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
               for d in sorted((run / "step2").iterdir()) if d.is_dir()}
    print(f"checkpoint after step 2, bytes per writing rank's shards: {on_disk}")
    for i, layout in enumerate(AFTER):
        again = shutil.copytree(run, tmp_path / f"resumed{i}")  # each from step 2
        resumed = cluster.run(train, layout, CONFIG, data, again, every=EVERY, resume=True)
        for rank, progress in enumerate(resumed):
            assert progress.start == 2 and sorted(progress.losses) == [2, 3], progress
            for step, loss in progress.losses.items():
                assert abs(loss - want[step]) <= rounding(want[step], TERMS), (
                    layout, rank, step, loss, want[step])
        assert latest(again) == again / "step4"
        print(f"resumed at {layout}: load s by rank "
              f"{[round(p.load_seconds, 3) for p in resumed]}, save s "
              f"{[round(p.save_seconds[-1], 3) for p in resumed]}, bytes written "
              f"{[p.checkpoint_bytes for p in resumed]} (this run's)")


def send_to_a_dead_rank(comm):
    """Rank 1 dies; rank 0 sends to it in the sub-group of ranks 0 and 1 until gloo has
    refused twice (the first refusal may come as a send is waited on; once the connection is
    known closed, the next comes as the send is posted): both must be CommErrors."""
    pair = comm.subgroup([0, 1])
    if comm.rank == 1:
        os._exit(3)
    refusals: list[CommError] = []
    while comm.rank == 0 and len(refusals) < 2:
        try:
            pair.isend(torch.ones(1), 1).wait()
        except CommError as e:
            refusals.append(e)
        time.sleep(0.05)
    if refusals:
        raise refusals[-1]
    return comm.rank


def test_a_send_to_a_dead_rank_in_a_sub_group_is_a_communication_error(cluster):
    with pytest.raises(RankFailure) as failed:
        cluster.run(send_to_a_dead_rank, timeout=60)
    assert failed.value.ranks == [1], failed.value  # the dead rank, and not its sender
    assert failed.value.consequences == [0]
    assert isinstance(failed.value.exceptions[0], CommError)
