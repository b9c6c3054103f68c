"""lib_dist.extend.definitions: load named definitions from a notebook and nothing else.

A scratch notebook holds what real ones do: imports, constants, helpers, test cells, magics,
cells that must never run, a cell that does not parse, redefinitions and unanswered exercises.
"""

from __future__ import annotations

import subprocess
import sys
import traceback

import cloudpickle
import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from lab_solutions import release, solution

import lib_dist.losses
from lib_dist.extend import FALLBACK, MissingDefinition, definitions

CELLS = [
    "import math\nimport json as js\nSCALE = 3\nSIDE = 'side_effect.txt'",
    "def helper(x):\n    return x * SCALE\n\n\ndef target(x):\n    return helper(x) + math.pi",
    "open(SIDE, 'w').write('ran')\nraise RuntimeError('this cell must not run')",
    "%%bash\necho 'a cell magic'",
    "%matplotlib inline\nunrelated = helper(2)",
    "def broken(:\n    pass",
    "assert target(1) == 3 + math.pi",
    "def later():\n    return 1\n\n\ndef later():\n    return 2",
    "def todo(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()",
    "def uses_todo():\n    return todo(1)",
    "class Base:\n    kind = 'base'\n\n\nclass Child(Base):\n    def scaled(self, x):\n"
    "        return helper(x) + len(js.dumps([]))",
    "def start_cluster():\n    open(SIDE, 'w').write('cluster started')\n    return 'cluster'\n\n\n"
    "cluster = start_cluster()",
    "def shadows():\n    cluster = 'a local, not the global'\n    return cluster",
    "def uses_cluster():\n    return cluster",
    "def explodes():\n    return 1 / 0",
    "LIMIT = 1 / 0\n\n\ndef needs_limit():\n    return LIMIT",
]


@pytest.fixture
def notebook(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # side effects, if any ran, would land here
    nb = new_notebook(cells=[new_markdown_cell("# a notebook")]
                      + [new_code_cell(c) for c in CELLS])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_loads_a_function_with_what_it_uses_and_runs_nothing_else(notebook):
    defs = definitions(notebook, "target")
    assert defs.target(1) == 3 + 3.141592653589793
    assert defs.origins == {"target": str(notebook)}
    assert not (notebook.parent / "side_effect.txt").exists()
    assert "helper" in defs.source and "SCALE = 3" in defs.source
    assert "unrelated" not in defs.source and "assert" not in defs.source


def test_access_by_attribute_item_and_unpacking(notebook):
    defs = definitions(notebook, "helper", "later")
    helper, later = defs
    assert helper(2) == defs.helper(2) == defs["helper"](2) == 6
    assert later() == 2  # the last definition wins, as running the notebook would
    assert len(defs) == 2
    with pytest.raises(AttributeError):
        defs.target


def test_classes_bring_their_bases_and_imports(notebook):
    Child = definitions(notebook, "Child").Child
    assert Child.kind == "base" and Child().scaled(2) == 6 + 2


def test_scope_analysis_ignores_locals_that_shadow_globals(notebook):
    assert definitions(notebook, "shadows").shadows() == "a local, not the global"
    assert not (notebook.parent / "side_effect.txt").exists()


def test_globals_a_definition_reads_are_run_with_it(notebook):
    assert definitions(notebook, "uses_cluster").uses_cluster() == "cluster"
    assert (notebook.parent / "side_effect.txt").read_text() == "cluster started"


def test_missing_and_unanswered_names_are_errors_without_fallback(notebook):
    with pytest.raises(MissingDefinition, match=r"no answered definition of nowhere, todo "
                                                r"\(it defines .*helper.*target"):
        definitions(notebook, "nowhere", "todo")
    with pytest.raises(MissingDefinition, match="uses_todo"):
        definitions(notebook, "uses_todo")  # uses an unanswered exercise: unanswered too
    with pytest.raises(MissingDefinition, match="no such file"):
        definitions(notebook.parent / "absent.ipynb", "target")
    with pytest.raises(TypeError):
        definitions(notebook)


def test_fallback_fills_in_missing_unanswered_and_failing_code(notebook):
    fallback = type("Reference", (), {"todo": staticmethod(lambda x: -x),
                                      "uses_todo": staticmethod(lambda: "ref"),
                                      "target": staticmethod(lambda x: "ref"),
                                      "needs_limit": staticmethod(lambda: "ref")})
    defs = definitions(notebook, "todo", "target", fallback=fallback)
    assert defs.todo(2) == -2 and defs.target(1) == 3 + 3.141592653589793
    assert defs.origins == {"todo": FALLBACK, "target": str(notebook)}
    assert definitions(notebook, "uses_todo", fallback=fallback).uses_todo() == "ref"
    absent = definitions(notebook.parent / "absent.ipynb", "target", fallback=fallback)
    assert absent.target(0) == "ref" and absent.origins["target"] == FALLBACK
    failing = definitions(notebook, "needs_limit", fallback=fallback)
    assert failing.needs_limit() == "ref" and "ZeroDivisionError" in failing.problem
    with pytest.raises(ZeroDivisionError):
        definitions(notebook, "needs_limit")
    with pytest.raises(MissingDefinition, match="nor provided by the fallback"):
        definitions(notebook, "nowhere", fallback=fallback)


def test_tracebacks_show_the_notebook_code(notebook):
    explodes = definitions(notebook, "explodes").explodes
    with pytest.raises(ZeroDivisionError):
        try:
            explodes()
        except ZeroDivisionError:
            assert "return 1 / 0" in traceback.format_exc()
            raise


def test_instructor_solutions_load_from_solutions_folder():
    ce = solution("lab01_cross_entropy", "cross_entropy").cross_entropy
    z, t = torch.randn(3, 4), torch.tensor([0, 3, 1])
    assert torch.allclose(ce(z, t), torch.nn.functional.cross_entropy(z, t))
    SGD, AdamW, step = solution("lab02_training", "SGD", "AdamW", "accumulated_step")
    assert issubclass(AdamW, torch.optim.Optimizer) and callable(step)


def test_a_blank_release_is_unanswered_and_falls_back():
    path = release("lab01_cross_entropy")
    with pytest.raises(MissingDefinition, match="cross_entropy"):
        definitions(path, "cross_entropy")
    defs = definitions(path, "cross_entropy", fallback=lib_dist.losses)
    assert defs.cross_entropy is lib_dist.losses.cross_entropy


@pytest.mark.parametrize("future", ["", "from __future__ import annotations\n"])
def test_a_dataclass_loads_with_the_notebooks_own_future_imports(tmp_path, future):
    # a @dataclass looks its class's module up in sys.modules (string annotations); and the
    # notebook's code is compiled with its own __future__ imports, not the loader's
    cell = (f"{future}from dataclasses import dataclass, field\n\n\n@dataclass\nclass Pair:\n"
            "    left: int\n    right: list = field(default_factory=list)\n")
    nb = new_notebook(cells=[new_code_cell(cell)])
    nbformat.write(nb, tmp_path / "answers.ipynb")
    Pair = definitions(tmp_path / "answers.ipynb", "Pair").Pair
    assert Pair(1).right == [] and Pair(2, [3]) == Pair(2, [3])
    assert Pair.__annotations__["left"] == ("int" if future else int)
    # pickled by value, as engines receive answers: the notebook's module exists nowhere else
    there = subprocess.run([sys.executable, "-c", "import pickle, sys\n"
                            "print(pickle.loads(sys.stdin.buffer.read())(4, [5]).right)"],
                           input=cloudpickle.dumps(Pair), capture_output=True)
    assert there.stdout.decode().strip() == "[5]", there.stderr.decode()[-2000:]
