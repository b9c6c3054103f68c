"""The course hub for real: JupyterHub with its proxy, local unix users logging in with their
passwords (PAM), single-user JupyterLab servers spawned as those users, and nbgrader's
file-system exchange (deploy/).

The instructor, a unix user, releases lab00 (the grader's release, then nbgrader's
release_assignment, in a course folder with deploy/instructor_nbgrader_config.py); two
students, unix users too, log in through the hub's login page in Debian's Chromium, open the
Assignments page that nbgrader's lab extension adds, and fetch the lab into their own home, as
their own user. Then the whole cycle: alice pastes every answer, bob the first only; each runs
the notebook, saves and submits from the Assignments page; the instructor collects with
nbgrader, autogrades with the grader (in its sandbox, as the instructor's unix user), writes the
feedback and releases it; each student fetches their feedback and reads their own score
(alice 13 / 13, bob less), and cannot open the other's. Students' kernels import the student
edition of lib_dist, and their JupyterLab lists the lectures' kernel, on the lecture edition;
the kit's reference (lib_dist's source, the solutions, the grader, the tests) is readable by the
instructor's group only, as a deployment keeps it. A hub that cannot start says why in one
line. The test creates its users and exchange, removes them, and stops every server it started.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.lectures import lecture_edition
from browser import chromium, wait_for_kernel, write_lab_settings
from hub_accounts import (as_user, kept_from_students, scratch_root, server_environment, stop_hub,
                          traversable)
from local_servers import free_port, wait_until_answering

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PROXY = REPO / "build" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
STUDENTS = ("ldhub-alice", "ldhub-bob")
INSTRUCTOR = "ldhub-teacher"
STAFF = "ldhub-staff"  # the instructor's group: the only one that reads the kit's reference
# what a deployment keeps from students (README), who need only the environment and labs/
REFERENCE = ("lib_dist", "solutions", "grader", "tests")
LAB = "lab00_ranks"

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.browser, pytest.mark.hub,
              pytest.mark.skipif(os.geteuid() != 0, reason="creates unix users: run as root")]


@pytest.fixture(scope="module")
def hub():
    assert PROXY.is_file(), "no configurable-http-proxy: `make hub-tool` installs it"
    root = scratch_root()
    exchange, data = root / "exchange", root / "data"
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o1777)  # nbgrader's exchange: everyone writes, nobody deletes others'
    data.mkdir()
    passwords = {user: secrets.token_urlsafe(12) for user in (*STUDENTS, INSTRUCTOR)}
    modes = traversable([Path(os.path.realpath(sys.executable)).parent, REPO, exchange])
    kept: dict[Path, tuple[int, int]] = {}
    env = {**os.environ, "LIB_DIST_HUB_DATA": str(data), "LIB_DIST_EXCHANGE": str(exchange),
           "LIB_DIST_STUDENTS": ",".join(STUDENTS), "LIB_DIST_INSTRUCTOR": INSTRUCTOR,
           "LIB_DIST_HUB_PORT": str(free_port()), "LIB_DIST_HUB_API_PORT": str(free_port()),
           "LIB_DIST_PROXY_API_PORT": str(free_port()),
           "JUPYTER_CONFIG_PATH": str(DEPLOY / "jupyter"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    hub_process = None
    try:
        subprocess.run(["groupadd", "--force", STAFF], check=True)
        for user, password in passwords.items():
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user,
                            *(["--groups", STAFF] if user == INSTRUCTOR else [])], check=True)
            subprocess.run(["chpasswd"], input=f"{user}:{password}", text=True, check=True)
        course = Path(pwd.getpwnam(INSTRUCTOR).pw_dir) / "course"
        shutil.copytree(REPO / "solutions" / LAB, course / "solutions" / LAB)
        kept = kept_from_students([REPO / name for name in REFERENCE], STAFF)
        shutil.copy(DEPLOY / "instructor_nbgrader_config.py", course / "nbgrader_config.py")
        subprocess.run(["chown", "-R", f"{INSTRUCTOR}:", str(course)], check=True)
        lecture_edition(root / "lecture_edition")  # its build in the cache the release copies
        env["LIB_DIST_LABS"] = str(course / "labs")  # the editions students import
        released = as_user(INSTRUCTOR, f"cd {course} && {sys.executable} -m grader --root . "
                                        f"release && nbgrader release_assignment {LAB}", env)
        assert "Released as: lib_dist lab00_ranks" in released, released
        modes |= traversable([course / "labs" / "student_edition",
                              course / "labs" / "lecture_edition"])
        for student in STUDENTS:
            jupyter = Path(pwd.getpwnam(student).pw_dir) / ".jupyter"
            write_lab_settings(jupyter / "lab" / "user-settings")
            subprocess.run(["chown", "-R", f"{student}:", str(jupyter)], check=True)
        log = open(root / "hub.log", "w")
        hub_process = subprocess.Popen([sys.executable, str(DEPLOY / "start.py")], env=env,
                                       cwd=data, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{env['LIB_DIST_HUB_PORT']}"
        wait_until_answering(f"{base}/hub/login", hub_process, root / "hub.log", "the hub")
        yield {"base": base, "passwords": passwords, "env": env, "course": course}
    finally:
        if hub_process is not None:
            stop_hub(hub_process)
        for user in (*STUDENTS, INSTRUCTOR):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        time.sleep(0.5)
        for user in (*STUDENTS, INSTRUCTOR):
            subprocess.run(["userdel", "--remove", user], capture_output=True)
        for folder, mode in modes.items():
            folder.chmod(mode)
        for folder, (mode, gid) in kept.items():
            os.chown(folder, -1, gid)
            folder.chmod(mode)
        subprocess.run(["groupdel", STAFF], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def log_in(browser, hub, user: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000},
                            permissions=["clipboard-read", "clipboard-write"])
    page.goto(f"{hub['base']}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub["passwords"][user])
    page.click("#login_submit")
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    assert f"/user/{user}/lab" in page.url, page.url
    return page


def open_assignments(page) -> None:
    page.click("div.lm-MenuBar-itemLabel:text-is('Nbgrader')")
    page.click("li.lm-Menu-item:has-text('Assignment List')")
    page.wait_for_selector(f":is(#released_assignments_list, #fetched_assignments_list, "
                           f"#submitted_assignments_list) >> text={LAB}", timeout=60_000)


@pytest.mark.parametrize("student", STUDENTS)
def test_a_student_logs_in_and_fetches_the_released_lab(hub, browser, student):
    page = log_in(browser, hub, student)
    open_assignments(page)
    page.click("#released_assignments_list >> button:has-text('Fetch')")
    page.wait_for_selector(f"#fetched_assignments_list >> text={LAB}", timeout=60_000)
    (REPO / "build" / "screenshots").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(REPO / "build" / "screenshots" / f"hub-{student}-fetched.png"))
    page.close()
    home = Path(pwd.getpwnam(student).pw_dir)
    fetched = home / LAB / f"{LAB}.ipynb"
    assert fetched.is_file(), f"nothing fetched into {home}"
    assert fetched.stat().st_uid == pwd.getpwnam(student).pw_uid, "fetched as another user"
    assert "### BEGIN SOLUTION" not in fetched.read_text()
    servers = subprocess.run(["pgrep", "-u", student, "-f", "jupyterhub-singleuser"],
                             capture_output=True, text=True).stdout.split()
    assert servers, f"no single-user server runs as {student}"


def test_students_kernels_import_the_student_edition_and_lectures_have_their_own(hub, browser):
    student = STUDENTS[0]
    if not subprocess.run(["pgrep", "-u", student, "-f", "jupyterhub-singleuser"]).returncode == 0:
        log_in(browser, hub, student).close()  # starts their server
    env = server_environment(student)
    labs = hub["course"] / "labs"
    assert env["PYTHONPATH"] == str(labs / "student_edition")
    # a student's own kernel: lib_dist without the answers, a stub naming the lab
    tried = subprocess.run(
        ["su", student, "-s", "/bin/sh", "-c", f"cd && {sys.executable} -c 'import lib_dist; "
         "print(lib_dist.__file__); from lib_dist.pipeline import balanced_bounds; "
         "balanced_bounds([1.0, 2.0], 2)'"],  # in their home, as a kernel of theirs runs
        env=env, capture_output=True, text=True, timeout=120)
    assert tried.stdout.startswith(str(labs / "student_edition" / "lib_dist")), tried.stderr
    # the kit's own reference, and everything built on it, is its staff's alone
    for name in REFERENCE:
        peek = subprocess.run(["su", student, "-s", "/bin/sh", "-c", f"ls {REPO / name}"],
                              capture_output=True, text=True, timeout=60)
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, (name, peek)
    source = REPO / "lib_dist" / "data_parallel" / "buckets.py"
    assert source.is_file()  # there, and not for them
    peek = subprocess.run(["su", student, "-s", "/bin/sh", "-c", f"cat {source}"],
                          capture_output=True, text=True, timeout=60)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek
    assert "lab05_pipeline asks you to write this yourself" in tried.stderr
    assert "Python 3 (lib_dist lectures)" in tried.stderr  # where lectures run
    # the lectures' kernel, as JupyterLab lists it for the student
    specs = json.loads(as_user(student, "jupyter kernelspec list --json", env))["kernelspecs"]
    spec = specs["lib_dist-lectures"]["spec"]
    assert spec["display_name"] == "Python 3 (lib_dist lectures)"
    lecture = subprocess.run(
        ["su", student, "-s", "/bin/sh", "-c", f"cd && {spec['argv'][0]} -c 'import torch; "
         "import lib_dist.losses as l; print(l.__file__); "
         "print(float(l.cross_entropy(torch.zeros(3, 4), torch.tensor([0, 1, 2]))))'"],
        env=env | spec["env"], capture_output=True, text=True, timeout=120)
    where, loss = lecture.stdout.split()
    assert where.startswith(str(labs / "lecture_edition")) and where.endswith(".so"), lecture.stderr
    assert abs(float(loss) - math.log(4)) < 1e-6  # four equal logits: log 4, compiled


def test_a_hub_that_cannot_start_says_why_in_one_line(hub, tmp_path):
    taken = subprocess.run([sys.executable, str(DEPLOY / "start.py")], env=hub["env"],
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode != 0
    assert taken.stderr.strip().count("\n") == 0, taken.stderr
    assert f"port {hub['env']['LIB_DIST_HUB_PORT']}" in taken.stderr and "taken" in taken.stderr
    env = {**hub["env"], "LIB_DIST_PROXY": str(tmp_path / "no-proxy"),
           "LIB_DIST_HUB_PORT": str(free_port())}
    missing = subprocess.run([sys.executable, str(DEPLOY / "start.py")], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "no-proxy is missing" in missing.stderr and "make hub-tool" in missing.stderr


def solutions(count: int) -> dict[int, str]:
    """The first `count` answers of lab00's solution, by their cell's index in the release."""
    import nbformat

    released = nbformat.read(REPO / "labs" / LAB / f"{LAB}.ipynb", as_version=4)
    solved = nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solved.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    found = {i: answers[c.metadata["nbgrader"]["grade_id"]] for i, c in enumerate(released.cells)
             if c.metadata.get("nbgrader", {}).get("solution")}
    return {i: "\n".join(line for line in source.splitlines() if "### " not in line)
            for i, source in list(found.items())[:count]}


def complete_and_submit(browser, hub, student: str, answers: dict[int, str]) -> None:
    """As `student` in the browser: open the fetched lab, type `answers` into their cells,
    Run All, save, and submit from the Assignments page."""
    page = log_in(browser, hub, student)
    if not (Path(pwd.getpwnam(student).pw_dir) / LAB).is_dir():
        open_assignments(page)
        page.click("#released_assignments_list >> button:has-text('Fetch')")
        page.wait_for_selector(f"#fetched_assignments_list >> text={LAB}", timeout=60_000)
    page.goto(f"{hub['base']}/user/{student}/lab/tree/{LAB}/{LAB}.ipynb")
    wait_for_kernel(page)
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
    for index, source in answers.items():
        editor = cells.nth(index).locator(".cm-content")
        page.evaluate("text => navigator.clipboard.writeText(text)", source)
        editor.click()
        page.keyboard.press("Control+a")
        page.keyboard.press("Control+v")  # pasted as it is: typing would be re-indented
    page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-InputArea-prompt')].every(p => !p.innerText.includes('*'))", timeout=180_000)
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1000)
    open_assignments(page)
    page.click("#fetched_assignments_list >> button:has-text('Submit')")
    page.wait_for_selector(f"#submitted_assignments_list >> text={LAB}", timeout=60_000)
    page.screenshot(path=str(REPO / "build" / "screenshots" / f"hub-{student}-submitted.png"))
    page.close()


def test_a_whole_cycle_release_submit_grade_feedback(hub, browser):
    alice, bob = STUDENTS
    complete_and_submit(browser, hub, alice, solutions(5))  # every answer
    complete_and_submit(browser, hub, bob, solutions(1))    # the first one only
    course = hub["course"]
    as_user(INSTRUCTOR, f"cd {course} && nbgrader collect {LAB}", hub["env"])
    graded = as_user(INSTRUCTOR, f"cd {course} && {sys.executable} -m grader --root . "
                                 f"autograde instructor/submitted", hub["env"])
    assert "2 submission" in graded or "ldhub-bob" in graded, graded[-1000:]
    as_user(INSTRUCTOR, f"cd {course} && {sys.executable} -m grader --root . feedback && "
                        f"nbgrader release_feedback {LAB}", hub["env"])
    scores, feedback_urls = {}, {}
    for student in (alice, bob):
        page = log_in(browser, hub, student)
        open_assignments(page)
        page.click("#submitted_assignments_list >> button:has-text('Fetch Feedback')")
        page.wait_for_selector("#submitted_assignments_list >> text=view feedback", timeout=60_000)
        home = Path(pwd.getpwnam(student).pw_dir)
        [html] = home.glob(f"{LAB}/feedback/*/{LAB}.html")  # what "view feedback" opens
        page.goto(f"{hub['base']}/user/{student}/files/{html.relative_to(home)}")
        scores[student] = page.inner_text("body")
        page.screenshot(path=str(REPO / "build" / "screenshots" / f"hub-{student}-feedback.png"))
        feedback_urls[student] = page.url
        page.close()
    for student, other in ((alice, bob), (bob, alice)):  # another's server is not theirs to read
        page = log_in(browser, hub, student)
        response = page.goto(feedback_urls[other])
        assert response is None or response.status >= 400 or student in page.url, page.url
        assert "Score" not in page.inner_text("body") or other not in page.url, page.url
        page.close()
    assert "13.0 / 13.0" in scores[alice] or "13 / 13" in scores[alice], scores[alice][:500]
    assert "13.0 / 13.0" not in scores[bob] and "/ 13" in scores[bob], scores[bob][:500]
    for student, other in ((alice, bob), (bob, alice)):
        assert other not in scores[student], f"{student}'s feedback names {other}"
