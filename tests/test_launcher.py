"""`python -m lib_dist.run`: examples/horovod_digits.py, a Horovod training script, run through
the launcher on 1, 2 and 4 ranks. Every rank ends with the same parameters, equal to one
process trained on the whole batch where the math says so (N ranks of batch B and rate
lr * N == one process of batch N * B and rate lr * N, since the ranks' shards of each batch
together are that process's batch): bit for bit on 1 rank, to float tolerance on 4, closely on
2 with fp16 compression; and the loss falls. Also: the rank prefix on every output line, the
environment reaching the ranks (a timeline), ranks that fail or hang named in a non-zero exit,
and the usage.

The oracle runs in this process (hvd.size() == 1 outside a cluster). Each launch starts a
cluster and imports scikit-learn and torch.optim on every rank, seconds on a 2-core machine,
so every launch here checks several things at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lib_dist.horovod as hvd
from lib_dist.run import main

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "horovod_digits.py"
# 1280 training examples: a multiple of 4 ranks x 32, so every batch of every run is full
# and N ranks' batches together are exactly the oracle's batch.
ARGS = ["--train-size", "1280", "--epochs", "3", "--batch-size", "32", "--lr", "0.05"]


def launch(np_: int, *args: str, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lib_dist.run", "-np", str(np_), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})


def oracle(tmp: Path, ranks: int) -> dict[str, torch.Tensor]:
    """The example in this process (hvd.size() == 1) with the whole batch and the scaled
    rate: what N ranks of batch 32 should compute."""
    args = ARGS[:]
    args[args.index("--batch-size") + 1] = str(32 * ranks)
    args[args.index("--lr") + 1] = str(0.05 * ranks)
    argv, threads = sys.argv, torch.get_num_threads()
    sys.argv = [str(EXAMPLE), *args, "--save-dir", str(tmp)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
        hvd.shutdown()
    return torch.load(tmp / "rank0.pt")


def params_by_rank(directory: Path, ranks: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(directory / f"rank{r}.pt") for r in range(ranks)]


def losses(stdout: str) -> tuple[list[float], list[float]]:
    """Rank 0's averaged train loss per epoch, and its test losses (before, after each)."""
    train = [float(x) for x in re.findall(r"^\[0\] epoch \d+: average train loss (\S+)$",
                                          stdout, re.M)]
    test = [float(x) for x in re.findall(r"^\[0\] Test set [^:]*: average loss ([\d.]+)",
                                         stdout, re.M)]
    return train, test


def check_training(out: subprocess.CompletedProcess[str], ranks: int) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line]
    assert lines and all(re.match(r"\[\d\] ", line) for line in lines), out.stdout
    checksums = re.findall(r"^\[(\d)\] rank (\d) of (\d): parameter checksum (\S+)$",
                           out.stdout, re.M)
    assert sorted((int(p), int(r), int(n)) for p, r, n, _ in checksums) == [
        (r, r, ranks) for r in range(ranks)]  # each rank's line carries its own prefix
    assert len({c for *_, c in checksums}) == 1
    train, test = losses(out.stdout)
    assert len(train) == 3 and len(test) == 4
    assert train[0] > train[1] > train[2]
    assert test[-1] < 0.6 * test[0]  # 2.3 (chance) before training, about 1.0 after


def test_example_on_1_rank_is_bit_for_bit_one_plain_process(tmp_path):
    check_training(launch(1, str(EXAMPLE), *ARGS, "--save-dir", str(tmp_path)), 1)
    [replica] = params_by_rank(tmp_path, 1)
    for name, value in oracle(tmp_path / "oracle", 1).items():
        assert torch.equal(replica[name], value)  # no communication at all


def test_example_on_4_ranks_equals_one_process_with_the_whole_batch(tmp_path):
    check_training(launch(4, str(EXAMPLE), *ARGS, "--save-dir", str(tmp_path)), 4)
    replicas = params_by_rank(tmp_path, 4)
    for name, value in oracle(tmp_path / "oracle", 4).items():
        for replica in replicas:
            assert torch.equal(replica[name], replicas[0][name])  # identical on every rank
        # the same examples and arithmetic; only the order of the additions differs
        torch.testing.assert_close(replicas[0][name], value, rtol=1e-5, atol=1e-6)


def test_example_on_2_ranks_with_fp16_compression_and_a_timeline(tmp_path):
    timeline = tmp_path / "timeline.json"
    out = launch(2, str(EXAMPLE), *ARGS, "--fp16-allreduce", "--save-dir", str(tmp_path),
                 env={"HOROVOD_TIMELINE": str(timeline)})
    check_training(out, 2)
    replicas = params_by_rank(tmp_path, 2)
    for name, value in oracle(tmp_path / "oracle", 2).items():
        assert torch.equal(replicas[0][name], replicas[1][name])
        # gradients summed in float16: close to the oracle, not equal
        torch.testing.assert_close(replicas[0][name], value, rtol=0, atol=2e-3)
    # HOROVOD_TIMELINE reached the ranks; rank 0 wrote every rank's record
    trace = json.loads(timeline.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1}
    names = {e["name"] for e in spans}
    assert {"ALLREDUCE avg_loss", "ALLREDUCE avg_train_loss"} <= names
    fused = [e for e in spans if e["name"].startswith("ALLREDUCE fused 4 tensors: net.2.bias")]
    assert len(fused) == 2 * 3 * 1280 // 64  # per rank, per step: one fused all-reduce
    assert all(e["args"]["bytes"] == 2 * (64 * 64 + 64 + 64 * 10 + 10 + 4) for e in fused)
    assert any(n.startswith("BROADCAST broadcast_parameters") for n in names)


FAILING = """
import sys
import lib_dist.horovod as hvd
hvd.init()
print(f"hello from {hvd.rank()}", sys.argv[1:])
print("a warning", file=sys.stderr)
if hvd.rank() == 2:
    raise ValueError("rank two is broken")
sys.exit(3 if hvd.rank() == 1 else 0)
"""


def test_failing_ranks_are_named_in_a_non_zero_exit_and_output_carries_the_rank(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    # horovodrun's `python script.py` form; sys.exit(0) on ranks 0 and 3 is success
    out = launch(4, "python", str(script), "--flag", "x", timeout=120)
    assert out.returncode == 1
    assert sorted(re.findall(r"^\[(\d)\] hello from \1 \['--flag', 'x'\]$", out.stdout,
                             re.M)) == ["0", "1", "2", "3"]
    assert sorted(re.findall(r"^\[(\d)\] a warning$", out.stderr, re.M)) == ["0", "1", "2", "3"]
    assert "lib_dist.run: ranks 1, 2 failed" in out.stderr
    assert "fails.py exited with status 3" in out.stderr
    assert "ValueError: rank two is broken" in out.stderr
    assert f'File "{script}", line 8' in out.stderr  # the remote traceback, from the script


def test_a_hang_ends_at_the_timeout_naming_the_ranks(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text("import time\nimport lib_dist.horovod as hvd\nhvd.init()\n"
                      "if hvd.rank() == 1:\n    time.sleep(600)\nhvd.barrier()\n")
    out = launch(2, "--timeout", "3", str(script), timeout=120)
    assert out.returncode == 1
    assert "ranks 0, 1 did not finish within 3 s" in out.stderr
    # rank 0's hvd.barrier() waits in its negotiation: the all-gather of the ranks' requests
    assert "rank 0: waiting in all_gather" in out.stderr


def test_a_module_runs_with_horovodruns_environment(tmp_path):
    (tmp_path / "whoami.py").write_text(
        "import os, sys\n"
        "env = {k[8:]: v for k, v in os.environ.items() if k.startswith('HOROVOD_')}\n"
        "print(__name__, sys.argv[1:], *(f'{k}={env[k]}' for k in sorted(env)))\n")
    # `-m whoami` runs the module from the working directory; what follows it is its own
    out = subprocess.run([sys.executable, "-m", "lib_dist.run", "-np", "2", "-m", "whoami",
                          "-m", "x"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(2):
        line = re.search(rf"^\[{r}\] (.*)$", out.stdout, re.M)
        assert line is not None, out.stdout
        fields = line.group(1).split(" ")
        assert fields[:3] == ["__main__", "['-m',", "'x']"]
        env = dict(f.split("=", 1) for f in fields[3:])
        assert env == dict(RANK=str(r), SIZE="2", LOCAL_RANK=str(r), LOCAL_SIZE="2",
                           CROSS_RANK="0", CROSS_SIZE="1", HOSTNAME=env["HOSTNAME"],
                           CONTROLLER="gloo", CPU_OPERATIONS="gloo")
    assert "HOROVOD_RANK" not in os.environ


def test_usage_and_a_missing_script(capsys):
    with pytest.raises(SystemExit) as info:
        main(["-h"])
    assert info.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: python -m lib_dist.run [-h] -np N")
    for option in ("--timeout", "--engines", "--device"):
        assert option in usage
    assert main(["-np", "2", "no_such_script.py"]) == 2
    err = capsys.readouterr().err
    assert err == "lib_dist.run: error: no such script: no_such_script.py\n"
    assert main(["-np", "2"]) == 2
    assert "give a script to run (or -m MODULE)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["train.py"])  # -np missing
    assert info.value.code == 2
    assert "-np" in capsys.readouterr().err
