"""benchmarks/gpu_check.py where there is no GPU (CI, this machine): it says so, skips each row
that needs CUDA with that reason, runs the rows that need none (Cluster(2) falls back to gloo
on the CPU; Cluster(N + 1, device="cuda") refuses), and exits with 0; a row that breaks is
reported FAIL with its traceback, and the exit status is 1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="checks the script where there is no CUDA")


def table(output: str) -> dict[str, tuple[str, str]]:
    """The printed table, after its header line: what -> (status, result)."""
    body = output.split("\nwhat ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = [re.fullmatch(r"(.+?)\s{2,}(pass|skip|FAIL)\s+(.*)", line) for line in body]
    assert all(rows), body
    return {row[1]: (row[2], row[3]) for row in rows if row}


@pytest.mark.cluster
def test_without_cuda_the_gpu_rows_are_skipped_and_the_others_pass(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_check
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA here: the rows that need a GPU are skipped" in done.stdout
    rows = table(done.stdout)
    assert len(rows) == len(gpu_check.CHECKS)
    for name, (what, _, needs_cuda, _) in gpu_check.CHECKS.items():
        status, result = rows[what]
        if needs_cuda:
            assert (status, result) == ("skip", "no CUDA on this machine"), name
        else:
            assert status == "pass", (name, result)
    status, result = rows["Cluster(N + 1, device='cuda') on N GPUs refuses, clearly"]
    assert result == ("ValueError: 1 GPU ranks requested on this machine, which has 0 GPUs; "
                      "use fewer ranks or device='cpu'")
    assert rows["Cluster(2) with fewer than 2 GPUs: both ranks on the CPU, gloo"][1] == (
        "0 GPUs: both ranks gloo on cpu")


def test_a_check_that_breaks_fails_loudly(monkeypatch, capsys):
    """A Cluster that no longer refuses more GPU ranks than GPUs: the row fails, its traceback
    is printed, and the exit status is 1."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() extends it
    import lib_dist.cluster.cluster

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import gpu_check

    monkeypatch.setattr(lib_dist.cluster.cluster, "check_gpus", lambda *args: None)
    assert gpu_check.main(["--only", "refuses", "LossScaler"]) == 1
    out, err = capsys.readouterr()
    rows = table(out)
    assert rows["Cluster(N + 1, device='cuda') on N GPUs refuses, clearly"] == (
        "FAIL", "AssertionError: Cluster(1, device='cuda') was accepted on 0 GPUs")
    assert rows["LossScaler's fp16 step against GradScaler's (goal <= 1.05)"][0] == "skip"
    assert "refuses FAILED:\nTraceback (most recent call last):" in err
