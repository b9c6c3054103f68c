"""What `Cluster.run` sends to the engines: checked on the client, where a mistake is cheap
to explain, and sent by value where an engine could not import it."""

from __future__ import annotations

import sys
from typing import Any, Callable

import cloudpickle


def check_sendable(fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> None:
    """Fail early, with advice, on what the engines could not receive."""
    if not callable(fn):
        raise TypeError(f"run() needs a function fn(comm, ...), got {type(fn).__name__}")
    _send_by_value(fn)
    try:
        cloudpickle.dumps((fn, args, kwargs))
    except Exception as e:  # noqa: BLE001 - anything pickling raises
        raise TypeError(
            f"cannot send {getattr(fn, '__name__', fn)!r} or its arguments to the engines: {e}. "
            f"Functions and arguments must be picklable: avoid capturing open files, locks, "
            f"sockets or generators; create those inside the function instead.") from e


def _send_by_value(fn: Callable[..., Any]) -> None:
    """Send functions from scripts and test files as code, like those of a notebook.

    cloudpickle sends a function by reference (module and name) when its module was
    imported, but an engine may not find a module that is not installed.
    """
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None) or ""
    installed = ("site-packages" in path or path.startswith(sys.base_prefix)
                 or module is None or module.__name__.split(".")[0] in ("lib_dist", "__main__"))
    if not installed:
        cloudpickle.register_pickle_by_value(module)
