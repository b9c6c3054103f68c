"""Engines launched by MPI: lab00's solution passes on 4 engines that Debian's Open MPI started.

`Cluster(4, ipp_options={"engines": "mpi"})` hands the engines to ipyparallel's
MPIEngineSetLauncher (`mpiexec -n 4`), with mpi4py in each engine; lib_dist then joins them
into one torch.distributed group, as it does local engines. The solution notebook (its hidden
tests included) runs with its setup cell's cluster so launched, and a last cell
asks each rank for the MPI rank and world size that mpiexec gave its process.

As root (a container, CI) Open MPI refuses to start without OMPI_ALLOW_RUN_AS_ROOT and its
confirmation; on a machine with fewer cores than ranks it needs oversubscription allowed.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "solutions" / "lab00_ranks" / "lab00_ranks.ipynb"
LOCAL = "cluster = Cluster(4, timeout=30).start()"
MPI = 'cluster = Cluster(4, timeout=60, ipp_options={"engines": "mpi"}).start()'
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
ASK_MPI = """import os
print("mpi:", sorted(cluster.run(lambda comm: (comm.rank, os.environ["OMPI_COMM_WORLD_RANK"],
                                               os.environ["OMPI_COMM_WORLD_SIZE"]))))"""

pytestmark = pytest.mark.timeout(300)


def errors(nb: nbformat.NotebookNode) -> list[str]:
    return [f"{cell.metadata.get('nbgrader', {}).get('grade_id', i)}: {o['ename']}: {o['evalue']}"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for o in cell.outputs if o.output_type == "error"]


def test_lab00_solution_passes_on_four_mpi_launched_engines(monkeypatch, tmp_path):
    assert shutil.which("mpiexec"), "no mpiexec: `make test` installs Debian's openmpi-bin"
    for name, value in MPI_ENV.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(LAB, as_version=4)
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    assert LOCAL in setup.source, "lab00's setup cell no longer starts its cluster this way"
    setup.source = setup.source.replace(LOCAL, MPI)
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(ASK_MPI))
    client = NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    assert not errors(nb), errors(nb)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(graded) >= 8
    printed = "".join(o.get("text", "") for o in nb.cells[-2].outputs)
    assert printed.startswith("mpi: "), printed
    ranks = ast.literal_eval(printed.removeprefix("mpi: ").strip())
    # lib_dist's ranks need not follow MPI's: each MPI rank once, in a world of 4
    assert [r for r, _, _ in ranks] == [0, 1, 2, 3], printed
    assert sorted(int(m) for _, m, _ in ranks) == [0, 1, 2, 3], printed
    assert {size for _, _, size in ranks} == {"4"}, printed
