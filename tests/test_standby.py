"""The engine host and controller started in standby with a kernel (lib_dist.cluster.standby):
the kernel's first cluster takes them over, a later one starts its own, and standbys nobody
claimed end with the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lib_dist.cluster import standby
from lib_dist.patience import stretched

pytestmark = pytest.mark.cluster

KERNEL = '''
import json, os
from lib_dist.cluster import Cluster
waiting = dict(item.split("=") for item in os.environ["LIB_DIST_STANDBY"].split(","))
pids = {kind: int(entry.split(":")[0]) for kind, entry in waiting.items()}
with Cluster(2, timeout=30) as first:
    ranks = first.run(lambda comm: comm.rank)
    engine_host = [l.pid for l in first._ipp.engines.values()]
    controller = first._ipp.controller.pid
    parents = [__import__("psutil").Process(r["pid"]).ppid() for r in first.ranks]
    preloaded = first.run(lambda comm: "wave" in __import__("sys").modules)
with Cluster(2, timeout=30) as second:
    again = second.run(lambda comm: comm.rank)
    second_host = [l.pid for l in second._ipp.engines.values()]
print(json.dumps(dict(pids=pids, ranks=ranks, again=again, engine_host=engine_host,
                      controller=controller, parents=parents, second_host=second_host,
                      left=os.environ.get("LIB_DIST_STANDBY"), preloaded=preloaded,
                      kernel_env=os.environ.get("LIB_DIST_ENGINE_IMPORTS"))))
'''


def run_kernel(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, standby.__file__, "--import", "wave", "--",
                           sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=stretched(timeout))


def test_first_cluster_takes_over_the_standbys_and_a_second_starts_its_own() -> None:
    done = run_kernel(KERNEL)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ranks"] == [0, 1] and got["again"] == [0, 1]
    assert got["engine_host"] == [got["pids"]["engines"]]
    assert got["controller"] == got["pids"]["controller"]
    assert set(got["parents"]) == {got["pids"]["engines"]}  # engines forked from the standby
    assert got["second_host"] != got["engine_host"]
    assert got["left"] == ""  # both claimed: nothing for a later cluster to claim
    assert got["preloaded"] == [True, True]  # the lab's preload, imported by the host
    assert got["kernel_env"] is None


MODULE_KERNEL = '''
import json, os, sys
import psutil
torch_before = "torch" in sys.modules  # imported by the wrapper, before this module ran
wave_before = "wave" in sys.modules  # its --import too
controller_before = "ipyparallel.controller.app" in sys.modules
from lib_dist.cluster import Cluster
waiting = dict(item.split("=") for item in os.environ["LIB_DIST_STANDBY"].split(","))
engines = int(waiting["engines"].split(":")[0])
with Cluster(2, timeout=30) as cluster:
    ranks = cluster.run(lambda comm: comm.rank)
    parents = [psutil.Process(r["pid"]).ppid() for r in cluster.ranks]
    engines_parent = psutil.Process(engines).ppid()
    controller_parent = psutil.Process(cluster._ipp.controller.pid).ppid()
    preloaded = cluster.run(lambda comm: "wave" in sys.modules)
print(json.dumps(dict(torch_before=torch_before, wave_before=wave_before, preloaded=preloaded,
                      argv=sys.argv[1:], path0=sys.path[0], name=__name__, me=os.getpid(),
                      engines=engines, engines_parent=engines_parent, ranks=ranks,
                      parents=parents, controller_before=controller_before,
                      controller_parent=controller_parent)))
'''


def test_a_python_module_kernel_shares_its_imports_with_the_hosts_forked_from_it(
        tmp_path: Path) -> None:
    (tmp_path / "module_kernel.py").write_text(MODULE_KERNEL)
    done = subprocess.run([sys.executable, standby.__file__, "--import", "wave", "--",
                           sys.executable, "-m", "module_kernel", "-f", "x.json"],
                          capture_output=True, text=True, timeout=stretched(120), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["torch_before"] and got["name"] == "__main__"
    assert got["wave_before"] and got["preloaded"] == [True, True]  # one import, shared
    assert got["argv"] == ["-f", "x.json"] and got["path0"] == str(tmp_path)
    assert got["engines_parent"] == got["me"]  # the engine host is forked from the kernel
    assert got["controller_before"] and got["controller_parent"] == got["me"]  # and the controller
    assert got["ranks"] == [0, 1] and set(got["parents"]) == {got["engines"]}


@pytest.mark.parametrize("form", ["-c", "-m"])
def test_unclaimed_standbys_end_with_the_kernel(form: str, tmp_path: Path) -> None:
    code = ("import os, time; print(os.environ['LIB_DIST_STANDBY'], flush=True); "
            "time.sleep(float(os.environ.get('NAP', '0')))")
    (tmp_path / "napping_kernel.py").write_text(code)
    kernel = ["-c", code] if form == "-c" else ["-m", "napping_kernel"]
    for nap in ("0", "4"):  # before and after the standbys have imported what they need
        done = subprocess.run([sys.executable, standby.__file__, "--", sys.executable, *kernel],
                              capture_output=True, text=True, timeout=stretched(60), cwd=tmp_path,
                              env={**os.environ, "NAP": nap})
        entries = dict(item.split("=") for item in done.stdout.strip().split(","))
        pids = [int(entry.split(":")[0]) for entry in entries.values()]
        deadline = time.monotonic() + stretched(10)
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids), f"standbys outlived the kernel (nap {nap})"


def test_a_kernel_without_standbys_starts_clusters_as_before(tmp_path: Path) -> None:
    assert standby.claim("engines", ["2"], str(tmp_path / "out"), str(tmp_path), {}) is None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_module_to_import_ahead_that_is_missing_is_said_and_the_kernel_runs(
        tmp_path: Path) -> None:
    (tmp_path / "hello_kernel.py").write_text("print('kernel ran')")
    done = subprocess.run([sys.executable, standby.__file__, "--import", "no_such_module_here",
                           "--", sys.executable, "-m", "hello_kernel"], capture_output=True,
                          text=True, timeout=stretched(60), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kernel ran"
    assert "not imported ahead: No module named 'no_such_module_here'" in done.stderr
