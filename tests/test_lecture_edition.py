"""The lecture edition (`grader.lectures`): lib_dist with every file that holds a lab's reference
compiled by Cython, so that lectures run for a student who has done no lab, and no answer's
source or bytecode is in it.

Built once per state of lib_dist's source (a minute or two on 2 cores) into the editions cache,
then copied; every lecture ran top to bottom on it when it was built (the closing note of issue
28 gives the times); here the lectures that run most of the compiled modules run again on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from grader.edition import SOURCE
from grader.lectures import compiled_files, lecture_edition
from lib_dist.extend import LABS
from test_judge_process import assert_no_reference_body

COURSE = Path(__file__).resolve().parent.parent / "course"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return lecture_edition(tmp_path_factory.mktemp("editions") / "lecture_edition")


def child_env(home: Path) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LIB_DIST_GRADED_LAB"} | {
        "PYTHONPATH": str(home)}


def test_every_file_holding_a_reference_is_an_extension_module_and_nothing_else(home):
    package = home / "lib_dist"
    assert len(compiled_files()) >= 40
    for source in compiled_files():
        copy = package / source.relative_to(SOURCE)
        assert not copy.exists() and not copy.with_suffix(".c").exists(), copy
        assert list(copy.parent.glob(f"{copy.stem}.cpython-*.so")), f"{copy} was not compiled"
    assert not list(home.rglob("*.c")) and not (home / "build").exists()
    assert (package / "models" / "gpt.py").is_file()  # what no lab asks for stays as it was


def test_the_lecture_edition_holds_no_body_of_any_labs_references(home):
    assert_no_reference_body(home, sorted(LABS))


def test_the_references_run_compiled_and_show_no_source(home):
    script = (
        "import inspect, torch\n"
        "import lib_dist.losses as l, lib_dist.data_parallel.wrapper as w\n"
        "from lib_dist.integrity import edition\n"
        "print('LAB', edition.LAB, l.__file__.endswith('.so'), w.__file__.endswith('.so'))\n"
        "x, y = torch.randn(5, 7, dtype=torch.float64), torch.tensor([0, 6, 2, 3, 1])\n"
        "print('diff', float((l.cross_entropy(x, y) - torch.nn.functional.cross_entropy(x, y))"
        ".abs()))\n"
        "try:\n"
        "    inspect.getsource(l.cross_entropy)\n"
        "except (OSError, TypeError) as e:\n"
        "    print('no source:', type(e).__name__)\n")
    child = subprocess.run([sys.executable, "-c", script], env=child_env(home), cwd=home,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines[0] == "LAB None True True"
    assert float(lines[1].split()[1]) <= 8 * torch.finfo(torch.float64).eps  # 7 exps, a log
    assert lines[2].startswith("no source:")


# The lectures that run the most compiled modules in two minutes: pipeline schedules and p2p,
# tensor-parallel layers, ZeRO-2/FSDP and recomputation, and comm's collectives in all three.
LECTURES = ["05_pipeline_parallel", "06_tensor_parallel", "09_fitting_the_model"]


@pytest.mark.cluster
@pytest.mark.parametrize("name", LECTURES)
def test_a_lecture_runs_top_to_bottom_on_the_lecture_edition(home, name, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(home))  # the kernel, and its engines, import it
    monkeypatch.delenv("LIB_DIST_GRADED_LAB", raising=False)
    nb = nbformat.read(COURSE / f"{name}.ipynb", as_version=4)
    probe = nbformat.v4.new_code_cell("import lib_dist.comm.base as b; print(b.__file__)")
    nb.cells.insert(0, probe)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(COURSE)}},
                   extra_arguments=["--HistoryManager.hist_file=:memory:"]).execute()
    assert nb.cells[0].outputs[0]["text"].strip().startswith(str(home / "lib_dist"))
    assert nb.cells[0].outputs[0]["text"].strip().endswith(".so")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert errors == []
