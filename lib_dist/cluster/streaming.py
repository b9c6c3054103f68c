"""`Cluster.run` with each rank's output shown as it is written: what a launcher needs
(`python -m lib_dist.run` prints every rank's lines live, prefixed with the rank, as
horovodrun does).

`Cluster.run` hands back each rank's result once every rank has finished. `run_streaming`
makes the same call, with the same outcome (the results by rank, or `RankFailure` /
`RankTimeout`, the engines replaced after a hang), and meanwhile passes every piece of stdout
and stderr a rank's Python code writes to `on_output(rank, stream, text)`, as ipyparallel
receives it: each engine's `sys.stdout` and `sys.stderr` publish what is written to them
within a fraction of a second, and this module polls them every `interval` seconds.
Output of C code writing to file descriptor 1 or 2 directly does not pass through Python's
streams and is not shown.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .cluster import Cluster

OnOutput = Callable[[int, str, str], None]  # (rank, "stdout" or "stderr", text)
STREAMS = ("stdout", "stderr")


def run_streaming(cluster: Cluster, fn: Callable[..., Any], *args: Any, on_output: OnOutput,
                  timeout: float | None = None, interval: float = 0.1, restart: bool = True,
                  **kwargs: Any) -> list[Any]:
    """`cluster.run(fn, *args, timeout=timeout, **kwargs)`, calling `on_output` with each
    rank's output as it comes (from one thread, in order per rank and stream).
    `restart=False` leaves the engines as they are after a hang or a broken group (for a
    caller about to stop the cluster anyway)."""
    return cluster._run(fn, args, kwargs, timeout,
                        watch=lambda pending: _Echo(pending, on_output, interval),
                        restart=restart)


class _Echo:
    """A thread passing the new output of each rank's call to `on_output`."""

    def __init__(self, pending: dict[int, Any], on_output: OnOutput, interval: float):
        self._pending, self._on_output, self._interval = pending, on_output, interval
        self._seen = {(rank, s): "" for rank in pending for s in STREAMS}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rank output")
        self._thread.start()

    def stop(self, final: bool) -> None:
        """Stop polling; with `final`, first wait (briefly) for output still on its way,
        which ipyparallel may receive after the result, and pass it on."""
        self._done.set()
        self._thread.join()
        if final:
            for ar in self._pending.values():
                if ar.ready():
                    ar.wait_for_output(2.0)
            self._poll()

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            self._poll()

    def _poll(self) -> None:
        for rank, ar in self._pending.items():
            for stream in STREAMS:
                try:
                    text = ar[stream] or ""
                except Exception:  # noqa: BLE001 - an engine that died has no metadata left
                    continue
                seen = self._seen[(rank, stream)]
                if text == seen:
                    continue
                # ipyparallel folds a line rewritten after "\r" (progress bars): then only
                # what follows the part both versions share is new
                start = (len(seen) if text.startswith(seen)
                         else len(os.path.commonprefix([seen, text])))
                self._seen[(rank, stream)] = text
                if len(text) > start:
                    self._on_output(rank, stream, text[start:])
