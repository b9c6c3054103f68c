"""The optimizer extension point: subclass `Optimizer` and write `update` (see `base`)."""

from .base import Optimizer, param_groups

__all__ = ["Optimizer", "param_groups"]
