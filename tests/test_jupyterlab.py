"""JupyterLab in a real browser: a student's Run All, and nbgrader's Validate button.

A JupyterLab server (this environment's `jupyter lab`, offline) serves a folder holding lab00
twice: the solution, with two cells a student might add (a `%%px` cell on every engine, and a
call in which rank 2 divides by zero), and the release as students get it. Debian's Chromium,
driven by Playwright, opens them the way a student does: Run > Run All Cells starts the
notebook's cluster from the browser's kernel, and the outputs on the page show the engines'
prints and the failing rank's `RankFailure`; the toolbar's Validate runs nbgrader's validator
on the server, which passes the solution and fails the release. The screenshots land in
build/screenshots/ for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from browser import chromium, wait_for_kernel, write_lab_settings
from local_servers import free_port, wait_until_answering

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "build" / "screenshots"
TOKEN = "lib-dist-test"
PX = "%%px\nprint(f'engine says: rank {rank} of {world_size}')"
FAILING = "cluster.run(lambda comm: 1 / (comm.rank - 2))  # rank 2 divides by zero"
CELLS = "[...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')]"

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """A JupyterLab server on the course folder; its base URL (token in the query)."""
    root = tmp_path_factory.mktemp("jupyterlab")
    solved = nbformat.read(REPO / "solutions/lab00_ranks/lab00_ranks.ipynb", as_version=4)
    for source in (PX, FAILING):  # before the last cell, cluster.stop()
        solved.cells.insert(len(solved.cells) - 1, nbformat.v4.new_code_cell(source))
    (root / "solved").mkdir()
    nbformat.write(solved, root / "solved" / "lab00_ranks.ipynb")
    (root / "released").mkdir()
    shutil.copy(REPO / "labs/lab00_ranks/lab00_ranks.ipynb", root / "released")
    settings = root.parent / "lab-settings"
    write_lab_settings(settings)
    port = free_port()
    log = open(root / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings)})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(f"{base}/api/status?token={TOKEN}", server, root / "server.log",
                             "JupyterLab")
        yield base
    finally:
        server.terminate()  # shuts its kernels down; each kernel's cluster goes with it
        server.wait(30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def open_notebook(browser, base: str, path: str):
    """A new page with `path` open, alone: a workspace of its own, reset."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    workspace = path.replace("/", "-").removesuffix(".ipynb")
    page.goto(f"{base}/lab/workspaces/{workspace}/tree/{path}?token={TOKEN}&reset")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    wait_for_kernel(page)
    return page


def validate(page, name: str) -> str:
    """Click the toolbar's Validate; the text of nbgrader's verdict."""
    page.click(".jp-NotebookPanel-toolbar >> text=Validate")
    page.wait_for_selector(".jp-Dialog-content", timeout=30_000)
    page.wait_for_function(
        "() => !document.querySelector('.jp-Dialog-content').innerText.includes('Validating')",
        timeout=240_000)
    text = page.inner_text(".jp-Dialog-content")
    page.screenshot(path=str(SHOTS / name))
    page.click(".jp-Dialog-content >> text=Ok")
    return text


def test_run_all_starts_engines_runs_px_and_shows_a_rank_failure(lab_server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_notebook(browser, lab_server, "solved/lab00_ranks.ipynb")
    page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    # Run All stops at a failing cell: wait for the rank failure, or for any cell's error.
    try:
        page.wait_for_function(f"() => {CELLS}.some(c => /RankFailure|RankTimeout|Error/.test("
                               "c.querySelector('.jp-OutputArea')?.innerText ?? ''))",
                               timeout=180_000)
    finally:  # what the page showed, for the report of a failure
        page.screenshot(path=str(SHOTS / "jupyterlab-run-all.png"))
        cells = page.evaluate(f"() => {CELLS}.map(c => c.innerText)")
        print("\n----\n".join(cell[-600:] for cell in cells))
    page.close()
    everything = "\n".join(cells)
    failed = [cell for cell in cells[:-2] if "Error" in cell]
    assert not failed, f"a cell of the solution failed in the browser:\n{failed[0][-3000:]}"
    assert "Cluster" in cells[0] and "4" in cells[0], cells[0][:300]  # the setup cell's cluster
    px = next(c for c in cells if "%%px" in c)
    for rank in range(4):
        assert f"engine says: rank {rank} of 4" in px, px[-500:]
    failing = next(c for c in cells if "divides by zero" in c)
    assert "RankFailure: rank 2 failed" in failing and "ZeroDivisionError" in failing, failing[-800:]
    assert "rank 2 failed" in everything


def test_validate_passes_the_solution_and_fails_the_release(lab_server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_notebook(browser, lab_server, "solved/lab00_ranks.ipynb")
    solved = validate(page, "jupyterlab-validate-solution.png")
    page.close()
    page = open_notebook(browser, lab_server, "released/lab00_ranks.ipynb")
    released = validate(page, "jupyterlab-validate-release.png")
    page.close()
    assert "Success! Your notebook passes all the tests." in solved, solved
    assert "failed" in released.lower() and "NotImplementedError" in released, released[:1000]
