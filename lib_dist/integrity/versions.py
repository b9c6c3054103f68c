"""Whether a fixed set of namespaces was written to since a moment: CPython's version tags.

CPython gives every dict a version tag (PEP 509) that takes a new value, from one counter for
the whole process, each time something is stored in or deleted from the dict, however it is
written: `setattr` on a module or a class, `vars(module)[name] = ...`, `del`, `update`. Reading
~400 tags is tens of microseconds, where comparing the ~10,000 bindings behind them takes
0.7 ms; the guard (`snapshot.Snapshot`) reads them each time an answer returns, and compares
bindings only when a tag moved.

The tag is read with `_testcapi.dict_get_version`, which only reads. Where it cannot be had
(a Python built without `_testcapi`) or does not behave as described (checked on a dict and a
class when a `Versions` is made), `unchanged()` always answers no, and the caller compares
every binding, as it would without this.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable, Mapping
from typing import Any


def _tag_reader() -> Callable[[dict[str, Any]], int] | None:
    try:  # CPython's module of C-API tests; the function reads a dict's tag, nothing else
        version_of = importlib.import_module("_testcapi").dict_get_version
    except (ImportError, AttributeError):
        return None
    return version_of if _tags_move(version_of) else None


def _tags_move(version_of: Callable[[dict[str, Any]], int]) -> bool:
    """Storing into, deleting from and setting an attribute of a class each change the tag."""
    probe: dict[str, Any] = {}
    probe_class = type("Probe", (), {})
    seen = [version_of(probe)]
    probe["x"] = 1
    seen.append(version_of(probe))
    del probe["x"]
    seen.append(version_of(probe))
    class_dict = _dict_behind(vars(probe_class))
    if class_dict is None:
        return False
    seen.append(version_of(class_dict))
    probe_class.x = 1  # type: ignore[attr-defined]
    seen.append(version_of(class_dict))
    return len(set(seen)) == len(seen)


def _dict_behind(namespace: Mapping[str, Any]) -> dict[str, Any] | None:
    """The dict itself: a module's `vars`, or the one a class's mappingproxy shows."""
    if type(namespace) is dict:
        return namespace
    inside = [r for r in gc.get_referents(namespace) if type(r) is dict]
    return inside[0] if len(inside) == 1 else None


class Versions:
    """The version tags of `namespaces` (dicts, or classes' mappingproxies), remembered now."""

    def __init__(self, namespaces: list[Mapping[str, Any]]):
        dicts = [_dict_behind(namespace) for namespace in namespaces]
        self._version_of = _tag_reader()
        if self._version_of is None or any(d is None for d in dicts):
            self._version_of, self._dicts = None, []
        else:
            self._dicts = [d for d in dicts if d is not None]
        self._remembered = self.now()

    def now(self) -> list[int] | None:
        """Every namespace's tag as it is now (None where tags cannot be read)."""
        if self._version_of is None:
            return None
        return list(map(self._version_of, self._dicts))

    def remember(self, tags: list[int] | None) -> None:
        """`tags` (read with `now()`) are what `unchanged` compares with from now on: the caller
        found every binding as it was, after reading them."""
        self._remembered = tags

    def unchanged(self) -> bool:
        """No namespace was written to since the tags remembered last were read."""
        return self._remembered is not None and self.now() == self._remembered


__all__ = ["Versions"]
