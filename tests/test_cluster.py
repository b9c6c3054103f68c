"""lib_dist.cluster on real ipyparallel engines joined into a real gloo group."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import alive, profile_files, wait_until_dead, wait_until_empty
from lib_dist.cluster import Cluster, RankFailure, RankTimeout
from lib_dist.patience import stretched

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster():
    with Cluster(4, timeout=20) as c:
        yield c


def rank_and_sum(comm, scale):
    t = torch.arange(5, dtype=torch.float64) * (comm.rank + 1) * scale
    comm.all_reduce(t)
    return comm.rank, comm.world_size, t


def test_all_reduce_equals_the_local_sum(cluster):
    results = cluster.run(rank_and_sum, 0.5)
    expected = sum(torch.arange(5, dtype=torch.float64) * (r + 1) * 0.5 for r in range(4))
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert all(r[1] == 4 for r in results)
    for _, _, t in results:
        torch.testing.assert_close(t, expected)
    assert cluster.backend == "gloo"
    assert [e.kind for e in sorted(cluster.trace.events, key=lambda e: e.rank)] == ["all_reduce"] * 4


def ring_pass(comm):
    out = torch.full((8,), float(comm.rank))
    buf = torch.empty(8)
    handle = comm.isend(out, (comm.rank + 1) % comm.world_size)
    comm.recv(buf, (comm.rank - 1) % comm.world_size)
    handle.wait()
    return buf[0].item()


def test_point_to_point_messages_are_traced_per_rank(cluster):
    assert cluster.run(ring_pass) == [3.0, 0.0, 1.0, 2.0]
    summary = cluster.trace.summary()
    assert sorted(summary) == [0, 1, 2, 3]
    for traffic in summary.values():
        assert (traffic.sent_messages, traffic.sent_bytes) == (1, 32)
        assert (traffic.recv_messages, traffic.recv_bytes) == (1, 32)
    assert {(m.src, m.dst) for m in cluster.trace.messages()} == {(0, 1), (1, 2), (2, 3), (3, 0)}


def fail_on_rank_two(comm):
    if comm.rank == 2:
        raise ValueError("rank two is broken")
    return comm.rank


def test_an_exception_on_rank_2_is_reported_as_rank_2(cluster):
    with pytest.raises(RankFailure) as info:
        cluster.run(fail_on_rank_two)
    assert info.value.ranks == [2]
    assert info.value.still_running == []
    text = str(info.value)
    assert text.startswith("rank 2 failed")
    assert "ValueError" in text and "rank two is broken" in text
    assert "\x1b[" not in text
    assert cluster.run(lambda comm: comm.rank) == [0, 1, 2, 3]


def fail_before_a_collective(comm):
    if comm.rank == 1:
        raise KeyError("no such layer")
    comm.all_reduce(torch.ones(1))


def test_ranks_waiting_on_a_failed_rank_are_named_and_replaced(cluster):
    engines_before = {r["pid"] for r in cluster.ranks}
    with pytest.raises(RankFailure) as info:
        cluster.run(fail_before_a_collective)
    assert info.value.ranks == [1]
    assert info.value.still_running == [0, 2, 3]
    assert "KeyError" in str(info.value)
    assert cluster.run(rank_and_sum, 1.0)[0][0] == 0
    assert not engines_before & {r["pid"] for r in cluster.ranks}
    assert wait_until_dead(engines_before) == []


def exit_on_rank_one(comm):
    if comm.rank == 1:
        __import__("os")._exit(3)
    comm.all_reduce(torch.ones(1))


def test_an_engine_that_dies_is_named_and_replaced(cluster):
    dead = cluster.ranks[1]["pid"]
    with pytest.raises(RankFailure) as info:
        cluster.run(exit_on_rank_one)
    assert info.value.ranks == [1]
    assert "the engine process died" in info.value.failures[1]
    assert set(info.value.consequences + info.value.still_running) == {0, 2, 3}
    assert cluster.ranks[1]["pid"] != dead
    assert cluster.run(lambda comm: comm.world_size) == [4, 4, 4, 4]


def deadlocked_recv(comm):
    if comm.rank == 0:
        comm.recv(torch.empty(1), 1)  # rank 1 never sends
    return comm.rank


def test_a_deadlocked_recv_times_out_and_the_cluster_recovers(cluster):
    old_engines = [r["pid"] for r in cluster.ranks]
    with pytest.raises(RankTimeout) as info:  # after 3 s, never gloo's 30 min
        cluster.run(deadlocked_recv, timeout=3)
    assert info.value.ranks == [0]
    assert "rank 0 did not finish within 3 s" in str(info.value)
    assert "rank 0: waiting in recv from rank 1" in str(info.value)
    assert wait_until_dead(old_engines) == []  # the hung engines were replaced
    results = cluster.run(rank_and_sum, 2.0)
    expected = sum(torch.arange(5, dtype=torch.float64) * (r + 1) * 2.0 for r in range(4))
    for _, _, t in results:
        torch.testing.assert_close(t, expected)


def spin_on_rank_three(comm):
    if comm.rank == 3:
        while True:
            pass
    comm.barrier()


def test_a_timeout_says_what_each_hung_rank_was_doing(cluster):
    with pytest.raises(RankTimeout) as info:
        cluster.run(spin_on_rank_three, timeout=3)
    assert info.value.ranks == [0, 1, 2, 3]
    text = str(info.value)
    assert "rank 3: running Python code, not waiting on any message" in text
    assert "rank 0: waiting in barrier" in text
    assert cluster.run(lambda comm: comm.rank) == [0, 1, 2, 3]


def test_every_rank_has_a_distinct_engine_and_cpu_device(cluster):
    assert sorted(r["local_rank"] for r in cluster.ranks) == [0, 1, 2, 3]
    assert {r["device"] for r in cluster.ranks} == {"cpu"}
    pids = cluster.run(lambda comm: __import__("os").getpid())
    assert pids == [r["pid"] for r in cluster.ranks]


def test_stop_leaves_no_process_alive():
    c = Cluster(2, timeout=20).start()
    assert c.run(lambda comm: comm.rank) == [0, 1]
    pids = c.pids()
    assert len(pids) == 3 and len(alive(pids)) == 3
    c.stop()
    assert wait_until_dead(pids, within=5) == []
    assert profile_files(c._ipp.cluster_id) == []  # nor logs, nor the controller's records
    c.stop()  # twice is fine
    with pytest.raises(RuntimeError, match="not running"):
        c.run(lambda comm: 0)


def test_interpreter_exit_without_stop_leaves_no_process():
    script = (
        "import json; from lib_dist.cluster import Cluster\n"
        "c = Cluster(2, timeout=20).start()\n"
        "print(json.dumps(sorted(c.pids())), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=stretched(120), check=True)
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(pids) == 3
    assert wait_until_dead(pids, within=10) == []


def test_ipyparallels_own_local_launcher_passes_through():
    with Cluster(2, timeout=20, ipp_options={"engines": "local"}) as c:
        assert c._ipp.engine_launcher_class.__name__ == "LocalEngineSetLauncher"
        assert [r[2] for r in c.run(rank_and_sum, 1.0)][0].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
        pids = c.pids()
    assert wait_until_dead(pids, within=5) == []


@pytest.mark.parametrize("n", [0, -1, 1.5, "4", True])
def test_a_bad_rank_count_is_a_clear_error(n):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        Cluster(n)


def test_more_gpu_ranks_than_gpus_is_a_clear_error():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"{gpus + 1} GPU ranks requested .* {gpus} GPU"):
        Cluster(gpus + 1, device="cuda")


def test_a_function_that_cannot_be_sent_is_a_clear_error(cluster):
    lock = threading.Lock()

    def holds_a_lock(comm):
        with lock:
            return comm.rank

    with pytest.raises(TypeError, match="cannot send 'holds_a_lock'.*picklable"):
        cluster.run(holds_a_lock)
    with pytest.raises(TypeError, match="needs a function"):
        cluster.run(42)


def test_a_controller_too_busy_to_answer_for_a_while_still_gets_every_engine(monkeypatch):
    """On a loaded machine the controller may answer an engine's registration, or the client's
    connection, many seconds late; by default ipyparallel's engines give up after 5 s
    ("Registration timed out"; seen in CI at load ~30: 3 of 4 engines) and its client after 10 s."""
    import os
    import signal

    launch = Cluster._launch_engines

    def launch_while_the_controller_is_frozen(self):
        controller = self._ipp.controller.process.pid
        connection = (Path(self._ipp.profile_dir) / "security"
                      / f"ipcontroller-{self._ipp.cluster_id}-engine.json")
        assert wait_until_empty(lambda: [] if connection.exists() else [1], within=60) == []
        os.kill(controller, signal.SIGSTOP)  # as if starved of CPU by other programs
        thaw = threading.Timer(15, os.kill, (controller, signal.SIGCONT))
        thaw.start()  # while the engines register and the client connects
        launch(self)

    monkeypatch.setattr(Cluster, "_launch_engines", launch_while_the_controller_is_frozen)
    with Cluster(2, timeout=20) as c:
        assert [r[2] for r in c.run(rank_and_sum, 1.0)][0].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]


def test_an_engine_that_never_registers_is_replaced_and_ended(monkeypatch):
    """Seen twice in CI under heavy load: one of four forked engines never registered while
    the others did. Here one is frozen (SIGSTOP) before it can: a fresh one takes its place
    after `arrivals.STALL` s, and the frozen one is ended."""
    import os
    import signal

    import psutil

    from lib_dist.cluster.launchers import engine_hosts

    launch, frozen = Cluster._launch_engines, []

    def launch_and_freeze_one(self):
        launch(self)
        if frozen:
            return
        host = psutil.Process(engine_hosts(self._ipp.engines.values())[0])
        assert wait_until_empty(lambda: [] if len(host.children()) == self.n else [1], 60) == []
        frozen.append(host.children()[-1].pid)
        os.kill(frozen[0], signal.SIGSTOP)

    monkeypatch.setattr(Cluster, "_launch_engines", launch_and_freeze_one)
    with Cluster(2, timeout=20) as c:
        assert [r[2] for r in c.run(rank_and_sum, 1.0)][0].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
        assert frozen[0] not in c.pids()
        assert wait_until_dead(frozen, within=10) == []
