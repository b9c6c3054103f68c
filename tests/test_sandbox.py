"""The grader's sandbox, end to end through the CLI: hostile submissions of lab00 on engines.

Each fixture is the instructor's solution with one hostile solution cell. The scores show that
the rest of the lab still ran; the outputs and the gradebook show what the attack achieved.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import nbformat
import pytest

from conftest import course_with_lab, running
from grader import synthetic
from grader.cli import main as cli
from grader.course import REPO, Course
from grader.grading import cell_scores

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

LAB = "lab00_ranks"
FULL = 13

def square_attacking(body: str) -> str:
    """lab00's q1 answer, which first runs `body` in the judge's own process: there the hidden
    test calls it on simulated ranks (a world size other than the cluster's 4). The judge loads
    `attack` because the answer uses it; the student's top-level code runs nowhere."""
    indented = "".join(f"    {line}\n" for line in body.strip("\n").splitlines())
    return ("def square_of_rank(comm):\n"
            "    if comm.rank == 0 and comm.world_size != 4:\n"
            "        attack()\n"
            "    return comm.rank ** 2\n\n\n"
            f"def attack():\n{indented}")


WRITE_EVERY_DB = square_attacking("""
import os, sqlite3
from pathlib import Path
here = Path.cwd()
candidates = [p for folder in [here, *here.parents] for p in folder.glob("*.db")]
candidates += list(here.parents[3].rglob("*.db"))  # the whole course directory
touched = []
for path in set(candidates):
    try:
        with sqlite3.connect(path) as db:
            db.execute("create table pwned (x)")
        touched.append(str(path))
    except Exception:
        pass
print("TOUCHED", sorted(touched))
""")
READ_SOLUTIONS = square_attacking(f"""
from pathlib import Path
here = Path.cwd()
course = here.parents[3]
repo = Path({str(REPO)!r})
targets = [repo / "solutions", course / "solutions", course / "instructor",
           repo / "labs" / "lecture_edition", repo / "build" / "editions"]  # compiled answers
found = [str(p) for t in targets for p in t.rglob("*") if p.is_file() and here not in p.parents]
print("FOUND", found)
""")
DETACHED = square_attacking("""
import subprocess
print("SPAWNED", subprocess.Popen(["sleep", "1000"], start_new_session=True).pid)
""")
TOO_MUCH_MEMORY = square_attacking("""
hog = bytearray(16 * 2**30)
""")
FORK_BOMB = square_attacking("""
import os, time
children = []
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(1)
            os._exit(0)
        children.append(pid)
finally:
    for pid in children:
        os.waitpid(pid, 0)
    print("FORKED", len(children))
""")
BIG_FILE = square_attacking("""
with open("big.bin", "wb") as f:
    f.write(b"x" * (8 << 20))
""")
WHO_AM_I = square_attacking("""
import json, os, socket
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    net = "reached"
except OSError:
    net = "none"
try:
    open("/etc/lib_dist_probe", "w")
    root = "writable"
except OSError:
    root = "read-only"
started = dict(v.split("=", 1) for v in open("/proc/self/environ").read().split(chr(0)) if "=" in v)
print("WHO", json.dumps({"uid": os.getuid(), "ppid": os.getppid(), "net": net, "root": root,
                         "home_at_start": started.get("HOME"),
                         "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
                         **{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd",
                                                           "CapInh", "CapAmb", "NoNewPrivs")}}))
""")
# on the engines (the visible test's cluster.run), each rank tries to overwrite the tuner's
# cache and leaves what it saw in a file; the judge's simulated rank 0 (the hidden test) prints
# them with its own thread count
CACHE_WRITER = """
def square_of_rank(comm):
    import json, os
    from pathlib import Path
    import torch
    if comm.world_size == 4:
        cache = Path(os.environ["LIB_DIST_TUNER_CACHE"])
        written = []
        for path in [*cache.glob("tuner-*.json"), cache / "tuner-planted.json"]:
            try:
                path.write_text("{ corrupt")
                written.append(path.name)
            except OSError:
                pass
        comm.all_reduce(torch.ones(1))
        seen = {"written": written, "alpha": repr(comm.tuner.network.alpha),
                "tuner": repr(comm.tuner), "threads": torch.get_num_threads()}
        Path(f"seen-{comm.rank}.json").write_text(json.dumps(seen))
    elif comm.rank == 0:
        seen = [json.loads(Path(f"seen-{r}.json").read_text()) for r in range(4)]
        print("WRITTEN", sorted({w for s in seen for w in s["written"]}),
              "ALPHA", seen[0]["alpha"], "SAME", all(s["tuner"] == seen[0]["tuner"] for s in seen))
        print("THREADS", [torch.get_num_threads(), *(s["threads"] for s in seen)])
    return comm.rank ** 2
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    course = course_with_lab(root, LAB, cell_timeout=60)
    solved = synthetic.solved(course, LAB)
    folder = root / "incoming"
    attacks = {"db_writer": WRITE_EVERY_DB, "snoop": READ_SOLUTIONS, "daemon": DETACHED,
               "hog": TOO_MUCH_MEMORY, "bomb": FORK_BOMB, "big_file": BIG_FILE,
               "who": WHO_AM_I}
    for student, source in attacks.items():
        synthetic.save(synthetic.with_cell(solved, "q1-solution", source), folder, student, LAB)
    code = cli(["--root", str(root), "--cell-timeout", "60", "--memory-mb", "2048",
                "--processes", "400", "--file-size-mb", "4", "autograde", str(folder)])
    return course, code


def q1_output(course: Course, student: str) -> str:
    """What q1's test cell shows: the attack ran there, in the judge, when the test called it."""
    nb = nbformat.read(course.autograded_notebook(LAB, student), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                == "q1-test")
    return "\n".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}"
                     for o in cell.outputs)


def total(course: Course, student: str) -> float:
    return sum(cell_scores(course, LAB, student).values())


def test_every_attack_was_graded(hostile):
    course, code = hostile
    assert code == 0
    for student in ("db_writer", "snoop", "daemon", "hog", "bomb", "big_file"):
        assert course.autograded_notebook(LAB, student).exists(), student


def test_the_judge_is_nobody_without_capabilities_or_network_in_its_own_namespaces(hostile):
    """The judge is forked, torch imported, by the grader's zygote into the sandbox
    (`grader.zygote`): its parent is outside the sandbox's PID namespace. It is what
    bubblewrap makes of its own processes: nobody, no capability, no new privileges, no
    network, a read-only root, only the sandbox's processes in sight."""
    course, _ = hostile
    line = next(l for l in q1_output(course, "who").splitlines() if l.startswith("WHO "))
    who = json.loads(line[4:])
    assert who["ppid"] == 0, who  # forked in from outside the sandbox
    assert who["uid"] == 65534 and who["NoNewPrivs"] == "1", who
    assert {who[k] for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")} == {
        "0000000000000000"}, who
    assert who["net"] == "none" and who["root"] == "read-only", who
    assert who["pids"] < 40, who  # the judge, its engines and controller: not the machine's
    # the environment the judge's process started with (its zygote's) is a sandbox's, not the
    # grader's
    assert who["home_at_start"] == "/tmp/home", who
    assert total(course, "who") == FULL


def test_a_submission_cannot_touch_the_gradebook(hostile):
    course, _ = hostile
    assert total(course, "db_writer") == FULL
    gradebook = course.db_url.removeprefix("sqlite:///")
    with sqlite3.connect(gradebook) as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master")}
    assert "pwned" not in tables
    out = q1_output(course, "db_writer")
    assert "TOUCHED [" in out and gradebook not in out


def test_a_submission_cannot_see_solutions_or_other_students(hostile):
    course, _ = hostile
    assert "FOUND []" in q1_output(course, "snoop")
    assert course.source_notebook(LAB).exists()  # it was there all along


def test_a_detached_process_does_not_survive(hostile):
    course, _ = hostile
    assert total(course, "daemon") == FULL
    assert "SPAWNED" in q1_output(course, "daemon")
    assert running(lambda cmdline: cmdline[:2] == ["sleep", "1000"]) == []


def test_too_much_memory_fails_that_cell_with_a_memory_limit_message(hostile):
    course, _ = hostile
    out = q1_output(course, "hog")
    assert "MemoryError" in out
    assert "memory limit (2048 MiB per process)" in out
    assert total(course, "hog") == FULL - 1  # only the test that ran the attack failed


def test_a_fork_bomb_is_contained(hostile):
    course, _ = hostile
    out = q1_output(course, "bomb")
    forked = int(out.split("FORKED")[1].split()[0])
    assert 0 < forked < 400
    assert "process limit (400 processes and threads)" in out
    assert total(course, "bomb") == FULL - 1


def test_a_file_beyond_the_size_limit_fails_with_a_file_size_message(hostile):
    course, _ = hostile
    out = q1_output(course, "big_file")
    assert "File too large" in out and "file size limit (4 MiB per file)" in out
    assert total(course, "big_file") == FULL - 1


@pytest.fixture(scope="module")
def default_limits(tmp_path_factory):
    """One submission graded with the default limits (shared-memory files do not fit under
    the hostile run's 4 MiB file size limit, so its groups use other transports)."""
    root = tmp_path_factory.mktemp("course")
    course = course_with_lab(root, LAB)
    folder = root / "incoming"
    synthetic.save(synthetic.with_cell(synthetic.solved(course, LAB), "q1-solution",
                                       CACHE_WRITER), folder, "cache_writer", LAB)
    assert cli(["--root", str(root), "autograde", str(folder)]) == 0
    return course


def test_submissions_read_the_tuners_calibration_from_the_cache_and_cannot_change_it(
        default_limits):
    """The grader calibrated once, outside the sandbox (grader.tuner_cache); the submission's
    engines used that calibration instead of measuring their own, and could not write it."""
    course = default_limits
    out = q1_output(course, "cache_writer")
    assert "WRITTEN [] ALPHA" in out and "SAME True" in out
    alpha = float(out.split("ALPHA ")[1].split()[0])
    cache = Path(os.environ["LIB_DIST_TUNER_CACHE"])
    stored = [json.loads(p.read_text()) for p in cache.glob("tuner-*.json")]
    assert any(s["key"]["world_size"] == 4 and s["model"]["alpha"] == alpha for s in stored)
    assert total(course, "cache_writer") == FULL


def test_a_submission_runs_one_torch_thread_per_process(default_limits):
    """Kernel and engines share two cores: a thread per core in each would fight for them."""
    assert "THREADS [1, 1, 1, 1, 1]" in q1_output(default_limits, "cache_writer")


def test_without_bubblewrap_the_grader_refuses_unless_told(tmp_path, monkeypatch, capsys):
    course = course_with_lab(tmp_path, LAB)
    folder = tmp_path / "incoming"
    synthetic.save(synthetic.with_cell(synthetic.solved(course, LAB), "q1-solution", DETACHED),
                   folder, "ada", LAB)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli(["--root", str(tmp_path), "autograde", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "bubblewrap is not installed" in err and "--no-sandbox" in err
    monkeypatch.undo()
    assert cli(["--root", str(tmp_path), "--no-sandbox", "autograde", str(folder)]) == 0
    assert "1 stray processes ended" in capsys.readouterr().out  # the subreaper's sweep
    assert running(lambda cmdline: cmdline[:2] == ["sleep", "1000"]) == []

