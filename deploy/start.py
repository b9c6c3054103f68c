"""Start the course hub: `python deploy/start.py` (as root; settings as in jupyterhub_config.py).

Checks first what would otherwise end in a long traceback, and says it in one line: the
proxy (configurable-http-proxy, `make hub-tool` installs it) missing, or the hub's port taken.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PROXY = HERE.parent / "build" / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


def problem() -> str | None:
    """Why the hub cannot start here, in one line; None when it can."""
    proxy = os.environ.get("LIB_DIST_PROXY", str(DEFAULT_PROXY))
    if not (Path(proxy).is_file() or shutil.which(proxy)):
        return (f"hub: the proxy {proxy} is missing: run `make hub-tool` (npm install "
                f"configurable-http-proxy) or set LIB_DIST_PROXY")
    ip = os.environ.get("LIB_DIST_HUB_IP", "127.0.0.1")
    for name, default in (("LIB_DIST_HUB_PORT", "8000"), ("LIB_DIST_HUB_API_PORT", "8081"),
                          ("LIB_DIST_PROXY_API_PORT", "8001")):
        port = int(os.environ.get(name, default))
        with socket.socket() as s:
            try:
                s.bind((ip, port))
            except OSError:
                return (f"hub: port {port} on {ip} is taken (another hub, or another server): "
                        f"stop it or choose another with {name}")
    return None


def main() -> None:
    found = problem()
    if found:
        sys.exit(found)
    os.execv(sys.executable, [sys.executable, "-m", "jupyterhub", "-f",
                              str(HERE / "jupyterhub_config.py"), *sys.argv[1:]])


if __name__ == "__main__":
    main()
