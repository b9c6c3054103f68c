"""Servers the tests start on localhost: a free port, and waiting until one answers."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A port the OS has free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(url: str, process: subprocess.Popen, log: Path, what: str,
                         seconds: float = 60) -> None:
    """Return once `url` answers; fail with the end of `log` if `process` exits first, or
    after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{what} did not answer within {seconds:g} s"
            time.sleep(0.2)
