"""The cluster as a student meets it: inside a real Jupyter kernel, with %%px."""

from __future__ import annotations

import json
import os
import signal

import pytest
from jupyter_client.manager import start_new_kernel

from conftest import profile_files, wait_until_dead, wait_until_empty
from lib_dist.patience import stretched

pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster]


def execute(client, code: str) -> str:
    """Run one cell; return its stdout; fail if it raised or wrote to stderr (log noise)."""
    out: list[str] = []
    err: list[str] = []

    def collect(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            (out if content["name"] == "stdout" else err).append(content["text"])
        elif msg["msg_type"] == "error":
            err.append("\n".join(content["traceback"]))

    reply = client.execute_interactive(code, timeout=stretched(120), output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(err)
    assert not err, f"the cell wrote to stderr: {''.join(err)}"
    return "".join(out)


@pytest.fixture()
def kernel():
    manager, client = start_new_kernel(kernel_name="python3", cwd=os.getcwd())
    try:
        yield manager, client
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)


def test_notebook_functions_px_cells_and_kernel_death(kernel):
    manager, client = kernel
    execute(client, "from lib_dist.cluster import Cluster\ncluster = Cluster(2, timeout=30).start()")

    # A function defined in the notebook, calling another notebook function and global.
    out = execute(client, (
        "offset = 7\n"
        "def scaled(x):\n"
        "    return 10 * x + offset\n"
        "def work(comm):\n"
        "    return scaled(comm.rank)\n"
        "print(cluster.run(work))"))
    assert out.strip() == "[7, 17]"

    # %%px runs on every rank, which sees comm, rank, world_size and device.
    execute(client, (
        "%%px\n"
        "import torch\n"
        "t = torch.ones(1) * (rank + 1)\n"
        "comm.all_reduce(t)\n"
        "total = (rank, world_size, str(device), t.item())"))
    out = execute(client, "print(cluster.view['total'])")
    assert out.strip() == "[(0, 2, 'cpu', 3.0), (1, 2, 'cpu', 3.0)]"

    # Stopping and starting again is quiet: no ipyparallel logs or engine output dumps.
    first = execute(client, "print(cluster._ipp.cluster_id)").strip()
    execute(client, "cluster.stop(); cluster = Cluster(2, timeout=30).start()")
    assert profile_files(first) == []
    assert execute(client, "print(cluster.run(work))").strip() == "[7, 17]"

    # Kill the kernel outright: no atexit, no stop(). The watchdog must clean up.
    pids = json.loads(execute(client, "import json; print(json.dumps(sorted(cluster.pids())))"))
    second = execute(client, "print(cluster._ipp.cluster_id)").strip()
    assert profile_files(second) != []  # the running controller's and engines' files
    assert len(pids) == 3
    os.kill(manager.provisioner.process.pid, signal.SIGKILL)
    assert wait_until_dead(pids, within=10) == []
    # the reaper deletes them once the processes are gone
    assert wait_until_empty(lambda: profile_files(second), within=10) == []
