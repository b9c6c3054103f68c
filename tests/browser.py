"""Headless Chromium for the tests that look at pages as a reader does.

Debian's chromium (`make test` installs it), driven by Playwright: Playwright's own browser
download cannot work offline. Networking to the outside is switched off: every page the tests
open is on localhost.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
OFFLINE = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-default-apps", "--disable-extensions", "--metrics-recording-only"]


@contextmanager
def chromium() -> Iterator:
    """A Playwright browser: Debian's Chromium, headless and offline."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=OFFLINE)
        try:
            yield browser
        finally:
            browser.close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@contextmanager
def served(root: Path) -> Iterator[str]:
    """`root` served over HTTP on localhost; its base URL."""
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# Every cell drawn, not only those in view (tests read and type into any cell), and no
# question about Jupyter's news in the corner of the page.
LAB_SETTINGS = {"notebook-extension/tracker": {"windowingMode": "none"},
                "apputils-extension/notification": {"fetchNews": "false"}}


def write_lab_settings(folder: Path) -> None:
    """JupyterLab's user settings for the tests, in `folder` (a JUPYTERLAB_SETTINGS_DIR, or a
    user's ~/.jupyter/lab/user-settings)."""
    for name, values in LAB_SETTINGS.items():
        file = folder / "@jupyterlab" / f"{name}.jupyterlab-settings"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(values))


def wait_for_kernel(page, timeout_ms: int = 120_000) -> None:
    """Wait until the open notebook's kernel is started, connected and idle (the status bar
    reads "Python 3 (ipykernel) | Idle"). The toolbar's execution indicator says idle before
    any kernel exists; Run All clicked then finds no kernel, asks to select one, and runs
    nothing."""
    page.wait_for_function(
        "() => /\\(ipykernel\\) \\| Idle/.test("
        "document.querySelector('#jp-main-statusbar')?.innerText ?? '')", timeout=timeout_ms)
