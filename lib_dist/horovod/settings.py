"""What `hvd.init` reads from the environment: Tensor Fusion's threshold, whether operations
are negotiated and checked, and how long operations some rank never started may wait."""

from __future__ import annotations

import os

from ..comm import Communicator

DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024  # bytes, Horovod's default


def _checks() -> bool:
    text = os.environ.get("LIB_DIST_HVD_CHECKS", "1").strip()
    if text not in ("0", "1"):
        raise ValueError(f"LIB_DIST_HVD_CHECKS must be 1 (negotiate and check every operation, "
                         f"the default) or 0 (run them unchecked, in start order), got {text!r}")
    return text == "1"


def _stall_after(comm: Communicator) -> float:
    text = os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "")
    if text:
        return float(text)
    timeout = getattr(comm, "timeout", None) or getattr(getattr(comm, "world", None),
                                                        "timeout", None)
    return float(timeout or 60.0)


def _fusion_threshold() -> int:
    text = os.environ.get("HOROVOD_FUSION_THRESHOLD", "")
    if not text:
        return DEFAULT_FUSION_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be a number of bytes (0 turns Tensor "
                         f"Fusion off), got {text!r}")
    return value
