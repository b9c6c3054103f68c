"""The guard's snapshot (lib_dist.integrity.snapshot) sees every way of rebinding what tests rely
on, whether or not it can read CPython's version tags of the namespaces (`versions`), and a
namespace written to and put back as it was is no change."""

from __future__ import annotations

import sys
import types

import pytest

from lib_dist.integrity import versions
from lib_dist.integrity.snapshot import Snapshot


def watched() -> tuple[types.ModuleType, type, Snapshot]:
    """A module (in sys.modules, as every watched one is) and a class, watched."""
    module = types.ModuleType("watched_module")
    sys.modules[module.__name__] = module
    module.compare = lambda a, b: a == b  # type: ignore[attr-defined]
    module.threshold = 0.5  # type: ignore[attr-defined]

    class Helper:
        def close(self, a: float, b: float) -> bool:
            return abs(a - b) < 1e-6

    return module, Helper, Snapshot([module], [Helper])


KINDS = ["tags", "no tags"]


@pytest.fixture(autouse=True)
def forget_the_module():
    yield
    sys.modules.pop("watched_module", None)


def made(kind: str, monkeypatch) -> tuple[types.ModuleType, type, Snapshot]:
    if kind == "no tags":  # what a Python without readable tags does
        monkeypatch.setattr(versions, "_tag_reader", lambda: None)
    return watched()


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_of_rebinding_is_a_change_until_put_back(kind, monkeypatch):
    module, helper, snapshot = made(kind, monkeypatch)
    original_compare, original_threshold, original_close = (module.compare, module.threshold,
                                                            helper.close)
    rebindings = {
        "sys.modules": (lambda: sys.modules.__setitem__("watched_module", types.ModuleType("x")),
                        ["sys.modules['watched_module']"]),
        "setattr": (lambda: setattr(module, "compare", lambda a, b: True),
                    ["watched_module.compare"]),
        "vars": (lambda: vars(module).__setitem__("threshold", 1e9),
                 ["watched_module.threshold"]),
        "del": (lambda: delattr(module, "compare"), ["watched_module.compare"]),
        "class": (lambda: setattr(helper, "close", lambda self, a, b: True),
                  [f"{__name__}.watched.<locals>.Helper.close"]),
        "added": (lambda: setattr(module, "extra", print), ["watched_module.extra"]),
    }
    for how, (rebind, expected) in rebindings.items():
        assert snapshot.changes() == [], how
        rebind()
        assert snapshot.changes() == expected, how
        assert snapshot.changes() == expected, how  # still there: asked twice
        module.compare, module.threshold = original_compare, original_threshold
        helper.close = original_close
        vars(module).pop("extra", None)
        sys.modules["watched_module"] = module
        assert snapshot.changes() == [], how


@pytest.mark.parametrize("kind", KINDS)
def test_a_rebinding_made_and_undone_between_two_checks_is_no_change(kind, monkeypatch):
    module, _, snapshot = made(kind, monkeypatch)
    original = module.compare
    module.compare = print
    module.compare = original
    assert snapshot._unchanged() and snapshot.changes() == []


def test_the_tags_are_read_where_cpython_offers_them():
    """Where `_testcapi` exists, the quick path is taken: after a check that found the
    namespaces written to but unchanged, the tags alone answer the next one."""
    pytest.importorskip("_testcapi", reason="this Python has no _testcapi: every check "
                                            "compares every binding")
    module, _, snapshot = watched()
    assert snapshot._versions.unchanged()
    original = module.threshold
    module.threshold = 0.75
    assert not snapshot._versions.unchanged()
    module.threshold = original
    assert not snapshot._versions.unchanged()  # written to twice...
    assert snapshot.changes() == []  # ...but every binding is what it was: so noted
    assert snapshot._versions.unchanged()


def test_a_python_whose_tags_do_not_move_is_not_trusted():
    assert versions._tags_move(lambda d: 7) is False
