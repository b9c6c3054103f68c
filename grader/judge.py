"""The grader's side of the judge: run a lab's locked cells where no student code ran first, and
take each test's verdict only from a line signed with a key the submission never saw.

For a lab lib_dist declares (`lib_dist.extend.LABS`), `GradedExecute` does not run the
submitted notebook. It starts `python -m lib_dist.integrity.judge` (in the submission's sandbox,
with lib_dist's judged edition, `grader.edition`), hands it on standard input the submission's
own code cells, the lab's locked cells as the gradebook holds them (hidden tests included) in
the release's order, a fresh key and nonce, and the number of a pipe, and reads the pipe:

    A {"loaded", "problems", "earlier"}      which answers were loaded (and earlier labs')
    B <index>                                 a cell starts (its timeout starts)
    O {"index", "text", "error", "changed"}   what it printed, raised, changed
    V <nonce>|<index>|<name>|pass|<hmac>      a graded cell's verdict, signed
    E                                         every cell ran

A test passes when exactly one verdict for it arrives, correctly signed, saying pass. A cell that
runs past its timeout, or during which the judge dies, fails with the reason; the judge then
starts again from the next cell (setup and helper cells run again, tests before it do not).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lib_dist.patience import stretched

STARTUP_SECONDS = 120  # the judge's start: imports, the lab's edition, loading the answers
Launcher = Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str]]]


@dataclass
class Cell:
    """A locked cell of the lab, as the gradebook holds it."""

    name: str
    source: str
    graded: bool


@dataclass
class Result:
    """What the judge saw of one cell."""

    text: str = ""
    error: dict[str, Any] | None = None
    changed: list[str] = field(default_factory=list)
    verdicts: list[bool] = field(default_factory=list)
    note: str = ""  # the grader's own reason: a timeout, a death, a forged verdict

    @property
    def passed(self) -> bool:
        return self.verdicts == [True] and not self.note


@dataclass
class Judgement:
    """Every cell's result (by index into the cells), and what the judge said of the answers."""

    results: dict[int, Result]
    loaded: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    earlier: list[str] = field(default_factory=list)  # "name (lab)": earlier answers used


def judge(lab: str, answers: list[str], cells: list[Cell], cwd: Path, launch: Launcher,
          timeout: float, log: IO[bytes] | None = None,
          died_why: Callable[[], str] = lambda: "",
          earlier: dict[str, dict[str, list[str]]] | None = None) -> Judgement:
    """Run `cells` in judges started by `launch` (see the module docstring); `died_why` says
    why a judge that died did (the sandbox's memory limit, say); `earlier`: the student's
    answers of earlier labs to run lib_dist on (`earlier_answers`, `autograde --own-answers`)."""
    found = Judgement({i: Result() for i in range(len(cells))})
    start = 0
    while start < len(cells):
        reached = _run_once(lab, answers, cells, start, cwd, launch, timeout, log, found, died_why,
                            earlier or {})
        if reached is None:  # every cell ran
            break
        start = reached + 1
    return found


def _run_once(lab: str, answers: list[str], cells: list[Cell], start: int, cwd: Path,
              launch: Launcher, timeout: float, log: IO[bytes] | None, found: Judgement,
              died_why: Callable[[], str], earlier: dict[str, dict[str, list[str]]]
              ) -> int | None:
    """One judge, from cell `start`: None when it ran to the end, else the index of the cell
    at which it stopped (timed out or died), marked as such in `found`."""
    key, nonce = secrets.token_bytes(32), secrets.token_hex(8)
    read_end, write_end = os.pipe()
    job = {"lab": lab, "answers": answers, "start": start, "key": key.hex(), "nonce": nonce,
           "channel": write_end, "cells": [vars(c) for c in cells], "earlier": earlier}
    command = [sys.executable, "-m", "lib_dist.integrity.judge"]
    joined = getattr(launch, "start", None)  # a judge forked with torch imported (grader.joining)
    try:
        process = joined(command, dict(os.environ), log, write_end) if joined else None
        if process is None:
            argv, env = launch(command, dict(os.environ))
            process = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                       stdout=log or subprocess.DEVNULL,
                                       stderr=log or subprocess.DEVNULL, pass_fds=(write_end,),
                                       cwd=cwd, env=env, start_new_session=True)
    finally:
        os.close(write_end)
    reader = _Reader(key, nonce, cells, found)
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(job).encode())
        process.stdin.close()
        return reader.follow(read_end, process, start, timeout, died_why)
    finally:
        os.close(read_end)
        _end(process, patience=0 if reader.finished else 10)


class _Reader:
    """Follows one judge's pipe, filling `found`."""

    def __init__(self, key: bytes, nonce: str, cells: list[Cell], found: Judgement):
        self.key, self.nonce, self.cells, self.found = key, nonce, cells, found
        self.current: int | None = None
        self.finished = False

    def follow(self, fd: int, process: subprocess.Popen[bytes], start: int, timeout: float,
               died_why: Callable[[], str]) -> int | None:
        deadline, pending = time.monotonic() + stretched(STARTUP_SECONDS), b""
        while not self.finished:
            wait = deadline - time.monotonic()
            if wait <= 0:
                late = (f"this cell ran past the {timeout:.0f} s cell timeout and was stopped"
                        if self.current is not None else
                        f"the judge did not start within {stretched(STARTUP_SECONDS):.0f} s")
                return self._stopped(start, late)
            ready, _, _ = select.select([fd], [], [], min(wait, 0.5))
            chunk = os.read(fd, 1 << 16) if ready else b""
            if not chunk and (ready or process.poll() is not None):
                if process.poll() is None:
                    process.wait()
                return self._stopped(start, _death(process.returncode, died_why()))
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if self._heard(line.decode("utf-8", "replace")):
                    deadline = time.monotonic() + stretched(timeout)
        return None

    def _heard(self, line: str) -> bool:
        """Take in one line; whether a new cell started."""
        kind, _, payload = line.partition(" ")
        try:
            if kind == "B":
                self.current = int(payload)
                return True
            if kind == "A":
                said = json.loads(payload)
                self.found.loaded, self.found.problems = said["loaded"], said["problems"]
                self.found.earlier = [str(e) for e in said.get("earlier", [])]
            elif kind == "O":
                said = json.loads(payload)
                result = self.found.results[int(said["index"])]
                result.text, result.error = str(said["text"]), said["error"]
                result.changed = [str(c) for c in said["changed"]]
            elif kind == "V":
                self._verdict(payload)
            elif kind == "E":
                self.finished = True
        except (ValueError, KeyError, TypeError, IndexError):
            self._forged(f"the judge's channel carried a line that is not the judge's: "
                         f"{line[:120]!r}")
        return False

    def _verdict(self, payload: str) -> None:
        line, _, mac = payload.rpartition("|")
        nonce, index, name, status = line.split("|")
        want = hmac.new(self.key, line.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, mac) or nonce != self.nonce:
            raise ValueError("unsigned")
        cell = int(index)
        if self.cells[cell].name != name or status not in ("pass", "fail"):
            raise ValueError("wrong cell")
        self.found.results[cell].verdicts.append(status == "pass")

    def _forged(self, why: str) -> None:
        if self.current is not None:
            result = self.found.results[self.current]
            result.note = result.note or why

    def _stopped(self, start: int, why: str) -> int:
        at = self.current if self.current is not None else start
        if self.current is None:  # nothing ran: every graded cell from `start` fails alike
            for i in range(start, len(self.cells)):
                self.found.results[i].note = f"not run: {why}"
            return len(self.cells)
        self.found.results[at].note = why
        return at


def _death(code: int | None, why: str) -> str:
    how = (f"killed by signal {-code}" if code is not None and code < 0
           else f"exited with status {code}")
    return (f"the judge's process {how} while this cell ran"
            + (f" ({why})" if why else " (os._exit, a crash, or running out of memory)"))


def _end(process: subprocess.Popen[bytes], patience: float) -> None:
    """End the judge and everything in its session (engines, a student's children), after
    `patience` seconds to exit by itself. A judge that said every cell ran has no more to say:
    it is ended at once (its interpreter's teardown, torch's included, would cost the
    submission about a second)."""
    try:
        if patience:
            process.wait(timeout=stretched(patience))
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
