"""The course hub for real: JupyterHub with its proxy, local unix users logging in with their
passwords (PAM), single-user JupyterLab servers spawned as those users, and nbgrader's
file-system exchange (deploy/).

The instructor, a unix user, releases lab00 with nbgrader's commands; two students, unix users
too, log in through the hub's login page in Debian's Chromium, open the Assignments page that
nbgrader's lab extension adds, and fetch the lab into their own home, as their own user. A hub
that cannot start says why in one line. The test creates its users and exchange and removes
them, and stops every server it started.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from browser import chromium

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PROXY = REPO / "build" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
STUDENTS = ("ldhub-alice", "ldhub-bob")
INSTRUCTOR = "ldhub-teacher"
LAB = "lab00_ranks"

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="creates unix users: run as root")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user: str, command: str, env: dict[str, str]) -> str:
    done = subprocess.run(["su", user, "-s", "/bin/sh", "-c", command], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{user}: {command}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def traversable(paths: list[Path]) -> dict[Path, int]:
    """Let every user reach the environment (o+x on each folder above it); the old modes."""
    changed = {}
    for path in paths:
        for folder in [path, *path.parents]:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                changed[folder] = mode
                folder.chmod(mode | stat.S_IXOTH)
    return changed


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    assert PROXY.is_file(), "no configurable-http-proxy: `make hub-tool` installs it"
    root = tmp_path_factory.mktemp("hub")
    exchange, data = root / "exchange", root / "data"
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o1777)  # nbgrader's exchange: everyone writes, nobody deletes others'
    data.mkdir()
    passwords = {user: secrets.token_urlsafe(12) for user in (*STUDENTS, INSTRUCTOR)}
    modes = traversable([Path(os.path.realpath(sys.executable)).parent, REPO, exchange])
    env = {**os.environ, "LIB_DIST_HUB_DATA": str(data), "LIB_DIST_EXCHANGE": str(exchange),
           "LIB_DIST_STUDENTS": ",".join(STUDENTS), "LIB_DIST_INSTRUCTOR": INSTRUCTOR,
           "LIB_DIST_HUB_PORT": str(free_port()), "LIB_DIST_HUB_API_PORT": str(free_port()),
           "LIB_DIST_PROXY_API_PORT": str(free_port()),
           "JUPYTER_CONFIG_PATH": str(DEPLOY / "jupyter"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    hub_process = None
    try:
        for user, password in passwords.items():
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
            subprocess.run(["chpasswd"], input=f"{user}:{password}", text=True, check=True)
        course = Path(pwd.getpwnam(INSTRUCTOR).pw_dir) / "course"
        shutil.copytree(REPO / "solutions" / LAB, course / "source" / LAB)
        shutil.chown(course, INSTRUCTOR)
        subprocess.run(["chown", "-R", f"{INSTRUCTOR}:", str(course)], check=True)
        released = as_user(INSTRUCTOR, f"cd {course} && nbgrader generate_assignment {LAB} && "
                                        f"nbgrader release_assignment {LAB}", env)
        assert "Released as: lib_dist lab00_ranks" in released, released
        log = open(root / "hub.log", "w")
        hub_process = subprocess.Popen([sys.executable, str(DEPLOY / "start.py")], env=env,
                                       cwd=data, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{env['LIB_DIST_HUB_PORT']}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/hub/login", timeout=2)
                break
            except OSError:
                assert hub_process.poll() is None, (root / "hub.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the hub did not answer within 60 s"
                time.sleep(0.3)
        yield {"base": base, "passwords": passwords, "exchange": exchange, "env": env}
    finally:
        if hub_process is not None:
            hub_process.send_signal(signal.SIGTERM)  # the hub stops the proxy and the servers
            hub_process.wait(60)
        for user in (*STUDENTS, INSTRUCTOR):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        time.sleep(0.5)
        for user in (*STUDENTS, INSTRUCTOR):
            subprocess.run(["userdel", "--remove", user], capture_output=True)
        for folder, mode in modes.items():
            folder.chmod(mode)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def log_in(browser, hub, user: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
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
    page.wait_for_selector(f"text={LAB}", timeout=60_000)


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
