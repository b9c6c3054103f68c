"""The engine benchmarks that once broke without any test noticing, run as a user runs them, in
their quickest mode: benchmarks/long_context.py (ring attention and the MoE layer on 2 ranks,
512 tokens, one round), benchmarks/fsdp.py (recomputation, then ZeRO-2, FSDP and FSDP2 on 2
ranks, one round of one step) and benchmarks/capstone.py --quick (8 ranks, one layout, one
round).
Each must exit 0 and print (and, for the capstone, write) every result it promises. The
figures themselves depend on the machine and are not asserted (CONTRIBUTING.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lib_dist.patience import stretched

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(360)]


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` run by this Python from the repository's root, its output captured."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=stretched(300))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_long_context_runs_in_its_quickest_mode():
    out = run("long_context.py", "--lengths", "512", "--ranks", "2", "--rounds", "1").stdout
    assert "2 ranks,   512 tokens: ring" in out, out
    assert "ring / all-gather time" in out, out
    assert "2 ranks, MoE step: lib_dist all_to_all" in out, out


def test_fsdp_runs_in_its_quickest_mode():
    out = run("fsdp.py", "--rounds", "1", "--steps", "1", "--ranks", "2").stdout
    assert "lib_dist / torch.utils.checkpoint:" in out, out
    assert "2 ranks: ZeRO-2" in out and "FSDP2" in out, out
    for way in ("ZeRO-2", "lib_dist", "prefetch"):
        assert f"{way} / FSDP2:" in out, out
    assert "ZeRO-2 holds" in out, out


def test_capstone_runs_in_its_quickest_mode_and_writes_its_results(tmp_path):
    out = run("capstone.py", "--quick", "--out", str(tmp_path)).stdout
    text = (tmp_path / "capstone.txt").read_text()
    assert text.strip() and text.strip() in out.strip(), (text, out)
    found = json.loads((tmp_path / "capstone.json").read_text())
    layout = found["layouts"]["(2, 2, 2)"]
    for key in ("lib_dist_s", "torch_s", "predicted_s", "clock_measured_s",
                "clock_predicted_s"):
        assert layout[key] > 0, (key, layout)
    # every rank's last step returned the same global loss; torch's last stages one each
    losses = {round(r["lib_dist"], 6) for r in layout["losses"]}
    assert len(losses) == 1, layout["losses"]
    assert set(found["checkpoint"]) == {"lib_dist save", "dcp save", "lib_dist load",
                                        "dcp load"}
    calibration = layout["calibrations"][0]  # the round's, that its prediction came from
    assert calibration["matmul_flops"] > 0 and calibration["alpha"] >= 0
    assert set(calibration["all_reduce_lines"]) == {"2", "4", "8"}  # JSON's keys: strings
