"""Engines launched by MPI and by Slurm: lab00's solution passes on 4 engines of each.

`Cluster(4, ipp_options={"engines": "mpi"})` hands the engines to ipyparallel's
MPIEngineSetLauncher (`mpiexec -n 4`, Debian's Open MPI, mpi4py in each engine);
`{"engines": "slurm", "controller": "slurm"}` submits the controller and the engines as Slurm
jobs (sbatch, then srun for the 4 engine tasks) to a one-node Slurm cluster the test starts
(`slurm_node`). lib_dist then joins the engines into one torch.distributed group, as it does
local ones. The solution notebook, its hidden tests included, runs with its setup cell's
cluster so launched, and a last cell asks each rank which process the launcher made of it.

As root (a container, CI) Open MPI refuses to start without OMPI_ALLOW_RUN_AS_ROOT and its
confirmation; on a machine with fewer cores than ranks it needs oversubscription allowed.
"""

from __future__ import annotations

import ast
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from lib_dist.patience import stretched
from slurm_node import SlurmNode

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "solutions" / "lab00_ranks" / "lab00_ranks.ipynb"
LOCAL = "cluster = Cluster(4, timeout=30).start()"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
ASK = """import os
print("ranks:", sorted(cluster.run(lambda comm: (comm.rank, os.environ[{rank!r}],
                                                 os.environ[{size!r}]))))"""

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow, pytest.mark.cluster]


def run_lab00(ipp_options: str, rank_var: str, size_var: str, folder: Path) -> list[tuple]:
    """lab00's solution with its cluster started with `ipp_options`, run in `folder`; each
    rank's (rank, the launcher's rank variable, its size variable)."""
    nb = nbformat.read(LAB, as_version=4)
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    assert LOCAL in setup.source, "lab00's setup cell no longer starts its cluster this way"
    setup.source = setup.source.replace(
        LOCAL, f"cluster = Cluster(4, timeout=60, ipp_options={ipp_options}).start()")
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(
        ASK.format(rank=rank_var, size=size_var)))
    client = NotebookClient(nb, timeout=round(stretched(240)), kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    assert len([c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]) >= 8
    printed = "".join(o.get("text", "") for o in nb.cells[-2].outputs)
    assert printed.startswith("ranks: "), printed
    return ast.literal_eval(printed.removeprefix("ranks: ").strip())


def check_one_process_per_rank(ranks: list[tuple]) -> None:
    # lib_dist's ranks need not follow the launcher's: each of its ranks once, in a world of 4
    assert [r for r, _, _ in ranks] == [0, 1, 2, 3], ranks
    assert sorted(int(theirs) for _, theirs, _ in ranks) == [0, 1, 2, 3], ranks
    assert {size for _, _, size in ranks} == {"4"}, ranks


def test_lab00_solution_passes_on_four_mpi_launched_engines(monkeypatch, tmp_path):
    assert shutil.which("mpiexec"), "no mpiexec: `make test` installs Debian's openmpi-bin"
    for name, value in MPI_ENV.items():
        monkeypatch.setenv(name, value)
    ranks = run_lab00('{"engines": "mpi"}', "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                      tmp_path)
    check_one_process_per_rank(ranks)


@pytest.fixture
def slurm(tmp_path_factory, monkeypatch):
    assert shutil.which("slurmctld"), "no slurmctld: `make test` installs Debian's slurm-wlm"
    node = SlurmNode(tmp_path_factory.mktemp("slurm"))
    try:
        seconds = node.start()
        print(f"the Slurm node was idle {seconds:.1f} s after its daemons started")
        monkeypatch.setenv("SLURM_CONF", str(node.conf))
        yield node
    finally:
        node.stop()


def test_lab00_solution_passes_on_four_engines_submitted_to_slurm(slurm, tmp_path):
    start = time.monotonic()
    ranks = run_lab00('{"engines": "slurm", "controller": "slurm"}', "SLURM_PROCID",
                      "SLURM_NTASKS", tmp_path)
    check_one_process_per_rank(ranks)
    assert (tmp_path / "slurm_engine.sbatch").read_text().count("srun ") == 1
    print(f"lab00 on Slurm engines: {time.monotonic() - start:.1f} s")
    deadline = time.monotonic() + stretched(30)  # the notebook's last cell stopped the cluster
    while slurm.jobs().strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not slurm.jobs().strip(), f"jobs left running: {slurm.jobs()}"
