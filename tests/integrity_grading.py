"""What the integrity tests (tests/test_integrity*.py) share: one lab released into a scratch
course, its solution, its untouched release and each cheating submission graded once, in the
sandbox, as `python -m grader autograde` does (`graded_lab`, the module-scoped fixture every
lab's tests use), the checks of a cheat's and the blank release's scores, and the catalog's
cheats that any lab can be handed (`catalog`, from its `LABS` entry): each lab's module adds
them with a line and checks them with `check_catalog`."""

from __future__ import annotations

import ast
import textwrap

import nbformat
import pytest

from conftest import course_with_lab
from grader import synthetic
from grader.grading import autograde, cell_scores, find_submissions
from grader.judged import DISAGREES
from lib_dist.extend import LABS


def code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def graded_lab(lab: str, cheats: dict, solution: bool = True, jobs: int = 2,
               release: bool = True):
    """The module-scoped fixture of `lab` graded (`grade`): in a test module,
    `lab04 = graded_lab(LAB04, LAB04_CHEATS)` makes `lab04` a fixture, graded once per module."""
    @pytest.fixture(scope="module")
    def graded(tmp_path_factory):
        """The lab graded once for this module: (course, {student: cell scores})."""
        return grade(tmp_path_factory, lab, cheats, solution, jobs, release)
    return graded


def grade(tmp_path_factory, lab, cheats, solution=True, jobs=2, release=True):
    """Grade the solution (unless not `solution`; handed in with its last test cell deleted,
    another edited and a third moved, see `rearranged`), the untouched release (student
    "release", unless not `release`)
    and each cheat once, `jobs` at a time as `python -m grader autograde -j` does; (course,
    {student: cell scores}). A cheat's cells are {grade id: source} replaced in the solution
    ("+id": a cell dressed as a locked one, inserted after id), or a function of (the
    solution, the release) that returns the whole notebook."""
    root = tmp_path_factory.mktemp(lab)
    course = course_with_lab(root, lab)
    solved = synthetic.solved(course, lab)
    blank = synthetic.blank(course, lab)
    folder = root / "incoming"
    if solution:  # handed in rearranged: graded as shipped all the same (`rearranged`)
        synthetic.save(rearranged()(solved), folder, "solution", lab)
    if release:
        synthetic.save(blank, folder, "release", lab)
    for student, (cells, _) in cheats.items():
        nb = solved
        if callable(cells):
            nb = cells(solved, blank)
        else:
            for grade_id, source in cells.items():
                nb = (dressed_as_locked(nb, grade_id[1:], source) if grade_id.startswith("+")
                      else synthetic.with_cell(nb, grade_id, source))
        synthetic.save(nb, folder, student, lab)
    subs, problems = find_submissions(course, folder)
    assert problems == []
    outcomes = autograde(course, subs, progress=False, jobs=jobs)
    assert [o.error for o in outcomes if o.error] == []
    scores = {o.submission.student: cell_scores(course, lab, o.submission.student)
              for o in outcomes}
    return course, scores


def dressed_as_locked(nb, after: str, source: str):
    """`nb` with a new cell after `after`, whose metadata claims it is one of the lab's own
    locked cells."""
    nb = nbformat.from_dict(nb)
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "grade_id": "helpers-2", "locked": True,
                                 "schema_version": 3, "solution": False, "task": False}
    nb.cells.insert(at + 1, cell)
    return nb


def error_text(course, lab, student) -> str:
    nb = nbformat.read(course.autograded_notebook(lab, student), as_version=4)
    return "\n".join(f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells
                     for o in c.get("outputs", []) if o.get("output_type") == "error")


def outputs_text(course, lab, student) -> str:
    """Everything the graded notebook shows: streams and errors."""
    nb = nbformat.read(course.autograded_notebook(lab, student), as_version=4)
    return "\n".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}"
                     for c in nb.cells for o in c.get("outputs", []))


def check_blank_release(graded):
    """The untouched release scores 0 on every graded cell: no test passes without an answer
    (what `grader check` checks; lab00's is in test_grader)."""
    _, scores = graded
    assert scores["release"] and not any(scores["release"].values()), scores["release"]


def full_marks(course, lab) -> dict[str, float]:
    """Each test cell's points, as the lab's source notebook gives them."""
    nb = nbformat.read(course.source_notebook(lab), as_version=4)
    return {grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")}


def solution_errors(course, lab) -> str:
    """What the graded solution's notebook shows (the judge's reasons included), its last
    6,000 characters: why a cell lost points, for a failure's message."""
    try:
        return outputs_text(course, lab, "solution")[-6000:]
    except OSError as e:  # not graded this time: say so rather than hide the scores
        return f"(no autograded notebook for the solution: {e})"


def check_cheat(graded, lab, cheats, student):
    course, scores = graded
    full = scores.get("solution") or full_marks(course, lab)
    assert full == full_marks(course, lab), (
        f"the solution lost points: {full}\n{solution_errors(course, lab)}")
    zeroed = set(full) if cheats[student][1] == "all" else cheats[student][1]
    expected = {cell: 0.0 if cell in zeroed else points for cell, points in full.items()}
    errors = error_text(course, lab, student)
    assert scores[student] == expected, (scores[student], errors[-4000:])
    return errors


# -- the catalog of cheats every lab is handed (issue 27) ------------------------------------

def grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def test_cells(nb) -> list[str]:
    """The graded test cells' grade ids, in the notebook's order."""
    return [grade_id(c) for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def answer_cells(nb, lab: str) -> dict[str, str]:
    """ask -> the grade id of the solution cell that defines it, for each name `lab` asks."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            for node in ast.parse(cell.source).body:
                names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                         else [t.id for t in getattr(node, "targets", [])
                               if isinstance(t, ast.Name)])
                found.update({n: grade_id(cell) for n in names if n in LABS[lab].asks})
    return found


def locked_helpers(nb) -> list[str]:
    """The functions the lab's locked cells define before its first answer (what its tests
    compare with; later ones may use the answers, which would leave a rewriting answer that
    uses them unanswered)."""
    first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get(
        "solution"))
    return [node.name for c in nb.cells[:first] if c.cell_type == "code"
            and c.metadata.get("nbgrader", {}).get("locked")
            and not c.metadata.get("nbgrader", {}).get("grade")
            for node in ast.parse(c.source).body if isinstance(node, ast.FunctionDef)]


# Row 1: one cell, before the tests, that keeps every exception of a later cell from the grader.
KERNEL_HOOKS = code("""
    import sys
    import threading
    _shell = get_ipython()
    _shell.set_custom_exc((BaseException,), lambda shell, *exc, tb_offset=None: None)
    sys.excepthook = threading.excepthook = sys.unraisablehook = lambda *args: None
    _shell.events.register("post_run_cell", lambda result: setattr(result, "error_in_exec",
                                                                     None))
    """)


def rewritten(helpers: list[str]) -> str:
    """Row 2, at top level: the bodies of torch's assert_close and the lab's helpers replaced,
    the function objects kept."""
    return code(f"""
        import torch.testing as _testing
        _yes = (lambda *args, **kwargs: True).__code__
        for _helper in (_testing.assert_close, {", ".join(helpers)}):
            _helper.__code__ = _yes
        """)


# In place of the guard's check before each test, one that makes the guard's cell runner run
# nothing, once, and put itself back; `_swap_the_guard()` returns True (the judge runs the
# tests' code itself, so this scores nothing)
GUARD_SWAPPER = code("""
    def _swap_the_guard():
        from lib_dist.integrity import current
        import lib_dist.integrity.guard as guard_module

        def before_each_test(when):
            if when.startswith("before"):
                real = guard_module._exec_cell

                def run_nothing(source, filename, namespace):
                    guard_module._exec_cell = real

                guard_module._exec_cell = run_nothing

        current.guard().raise_if_changed = before_each_test
        return True
    """)


def rewritten_by_an_answer(ask: str) -> str:
    """Row 2, from inside an answer's dependency: loading `ask` replaces the body of torch's
    assert_close, which the judge's own tests call (so this runs where the answers are loaded,
    in the judge; the lab's helpers there are the judge's, out of the answers' reach). Before
    that, it swaps the guard's parts (`GUARD_SWAPPER`)."""
    return GUARD_SWAPPER + code(f"""
        _SWAPPED = _swap_the_guard()

        def _rewrite():
            import torch.testing
            torch.testing.assert_close.__code__ = (lambda *args, **kwargs: True).__code__
            return True
        _REWRITTEN = _rewrite()
        def {ask}(*args, **kwargs):
            return _SWAPPED and _REWRITTEN
        """)


def rigged_release(lab: str):
    """Rows 1 and 2: the untouched release, plus the kernel hooks cell before the first test,
    the helpers' bodies replaced at top level and from an answer's dependency, and every test
    cell stored with a passing output (as the rigged kernel would show it). Scores 0 everywhere."""
    def build(solved, blank):
        nb = nbformat.from_dict(blank)
        helpers, tests = locked_helpers(nb), test_cells(nb)
        first = next(i for i, c in enumerate(nb.cells) if grade_id(c) == tests[0])
        nb.cells[first:first] = [nbformat.v4.new_code_cell(KERNEL_HOOKS),
                                 nbformat.v4.new_code_cell(rewritten(helpers))]
        ask = LABS[lab].asks[0]
        nb = synthetic.with_cell(nb, answer_cells(solved, lab)[ask],
                                 rewritten_by_an_answer(ask))
        for cell in nb.cells:
            if grade_id(cell) in tests:
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
        return nb
    return build, "all"


# Rows 3 and 5: the reference reached around the stubs, four ways, each answer another way.
ROUTES = code('''
    def _reached(module, qualname):
        import importlib
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj


    def _home(obj):
        """The module that defines obj (a function under decorators: the innermost)."""
        import inspect, sys
        return sys.modules[(obj if isinstance(obj, type) else inspect.unwrap(obj)).__module__]


    def _as_mine(obj, name):
        """obj, unwrapped; a class copied under a module of mine, its methods unwrapped."""
        import inspect
        if not isinstance(obj, type):
            return inspect.unwrap(obj)
        body = {k: inspect.unwrap(v) if inspect.isfunction(v) else v
                for k, v in vars(obj).items() if k not in ("__dict__", "__weakref__")}
        return type(name, obj.__bases__, {**body, "__module__": "mine"})


    def _pick(namespace, obj, qualname):
        import inspect
        found = namespace[(obj if isinstance(obj, type) else inspect.unwrap(obj)).__qualname__
                          .split(".")[0]]
        for part in qualname.split(".")[1:]:
            found = getattr(found, part)
        return _as_mine(found, qualname.split(".")[-1])


    def _run_as_mine(source, package):
        """lib_dist's source run as a module of mine (registered: dataclasses look it up)."""
        import sys, types
        mine = types.ModuleType("mine")
        mine.__package__ = package
        sys.modules["mine"] = mine
        exec(compile(source, "mine.py", "exec"), vars(mine))
        return vars(mine)


    def through_wrapped(module, qualname):
        """A decorator's (or a guard's) __wrapped__, followed to the end."""
        return _as_mine(_reached(module, qualname), qualname.split(".")[-1])


    def compiled_again(module, qualname):
        """lib_dist's file read, compiled and run again under a module name of mine."""
        obj = _reached(module, qualname)
        home = _home(obj)
        with open(home.__file__, encoding="utf-8") as f:
            return _pick(_run_as_mine(f.read(), home.__package__), obj, qualname)


    def loaded_twice(module, qualname):
        """A second copy of lib_dist's module, loaded from a path with '..'."""
        import importlib.util, os
        obj = _reached(module, qualname)
        home = _home(obj)
        folder, file = os.path.split(home.__file__)
        path = os.path.join(folder, "..", os.path.basename(folder), file)
        spec = importlib.util.spec_from_file_location(home.__name__ + "_again", path)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
        return _pick(vars(copy), obj, qualname)


    def asked_in_a_child(module, qualname):
        """Grading detected (any variable naming it): a child Python without them is asked
        for the reference's module, whose source then runs here."""
        import os, subprocess, sys
        env = {k: v for k, v in os.environ.items()
               if "GRADE" not in k.upper() and not k.startswith("LIB_DIST")}
        script = (f"import importlib, inspect, sys\\nobj = importlib.import_module({module!r})\\n"
                  f"for part in {qualname!r}.split('.'):\\n    obj = getattr(obj, part)\\n"
                  "home = sys.modules[obj.__module__]\\n"
                  "print(home.__name__)\\nprint(open(home.__file__).read())")
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=600)
        if out.returncode:
            raise RuntimeError(f"the child failed: {out.stderr[-2000:]}")
        home, _, source = out.stdout.partition("\\n")
        return _pick(_run_as_mine(source, home.rpartition(".")[0]), _reached(module, qualname),
                     qualname)
    ''')
ROUTE_NAMES = ("asked_in_a_child", "compiled_again", "loaded_twice", "through_wrapped")
SAME_JOB = {"ring_all_reduce": "_default_all_reduce",  # an ask whose reference has another name
            "zigzag_positions": "positions", "fold": "_fold", "coordinates_of": "coordinates",
            "replica_share": "replica_batch", "latest_complete": "latest"}


def reference_of(lab: str, ask: str) -> tuple[str, str] | None:
    """(module, qualname) of lib_dist's own version of `ask`: the reference named like it, or
    the method of that name (lab03's collectives are Communicator's methods)."""
    for exact in (True, False):
        for reference in LABS[lab].references:
            module, _, qualname = reference.partition(":")
            head, last = qualname.split(".")[0], qualname.split(".")[-1]
            if (head == ask) if exact else (last == SAME_JOB.get(ask, ask)):
                return module, (head if exact else qualname)
    return None


def reached_answers(lab: str) -> dict[str, tuple[str, str, str]]:
    """ask -> (route, module, qualname) for every ask with a reference, the routes in turn."""
    asks = [a for a in LABS[lab].asks if reference_of(lab, a)]
    return {ask: (ROUTE_NAMES[i % len(ROUTE_NAMES)], *reference_of(lab, ask))
            for i, ask in enumerate(asks)}


def around_the_stubs(lab: str):
    """Rows 3 and 5: the solution, with every answer that lib_dist has a version of bound
    instead to that version, reached around the stubs (`ROUTES`), each answer another way.
    Added after the notebook's last answer, so that these bindings are the last (the ones
    loaded) and the solution's helpers stay."""
    def build(solved, blank):
        cells = answer_cells(solved, lab)
        last = [grade_id(c) for c in solved.cells if grade_id(c) in cells.values()][-1]
        source = next(c.source for c in solved.cells if grade_id(c) == last)
        source += "\n\n" + ROUTES + "".join(
            f"\n{ask} = {route}({module!r}, {qualname!r})"
            for ask, (route, module, qualname) in reached_answers(lab).items()) + "\n"
        return synthetic.with_cell(solved, last, source)
    return build, "all"


def rearranged(zeroed: frozenset[str] = frozenset()):
    """Not a cheat: the lab's last test cell deleted, another edited to fail and a third moved
    to the end, as a student may do by accident; the judge runs the tests the gradebook holds,
    in the release's order, so the tests outside `zeroed` keep their points."""
    def edit(nb):
        tests = [t for t in test_cells(nb) if t not in zeroed]
        last, edited, moved = tests[-1], tests[-2], tests[0]
        assert last == test_cells(nb)[-1], "the lab's last test cell is one the cheat zeroes"
        nb = synthetic.with_cell(nb, edited, "raise AssertionError('edited by the student')\n")
        nb = synthetic.without_cell(nb, last)
        at = next(i for i, c in enumerate(nb.cells) if grade_id(c) == moved)
        nb.cells.append(nb.cells.pop(at))
        return nb
    return edit


def catalog(lab: str) -> dict:
    """The catalog's generic cheats for `lab` (rows 1, 2, 3 and 5 of issue 27), to add to the
    lab's cheats: {student: (build, "all")}."""
    cheats = {"rigged_release": rigged_release(lab)}
    if reached_answers(lab):
        cheats["around_the_stubs"] = around_the_stubs(lab)
    return cheats


def check_catalog(graded, lab: str, student: str) -> str:
    """The catalog's cheat scores 0 everywhere, with its reasons in the feedback."""
    course, scores = graded
    assert scores[student] and not any(scores[student].values()), scores[student]
    errors = error_text(course, lab, student)
    if student == "rigged_release":
        said = outputs_text(course, lab, student)
        assert "graded by the judge: your notebook was not run" in said
        assert said.count(DISAGREES) == len(scores[student]), said[-3000:]
        assert (f"{LABS[lab].asks[0]} could not be loaded: Forbidden: the judge does not allow "
                f"changing __code__ of assert_close") in said, said[:3000]
    else:  # each route ran in the judge and found lib_dist's stub, not the reference
        said = outputs_text(course, lab, student)
        loaded = said.split("against the definitions of ", 1)[1].split("\n", 1)[0]
        assert {a.strip() for a in loaded.split(",")} >= set(reached_answers(lab)), said[:3000]
        assert f"{lab} asks you to write" in said and "lib_dist's own" in said, said[-3000:]
    return errors
