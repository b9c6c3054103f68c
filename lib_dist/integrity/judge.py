"""The judge: the process a graded lab's tests run in, and where their verdicts come from.

The grader (`grader.judge`) starts `python -m lib_dist.integrity.judge` in the submission's
sandbox, with lib_dist's judged edition (`grader.edition`) in place of lib_dist, and writes one
job on its standard input: the lab, the sources of the submission's own code cells, the lab's
locked cells as the gradebook holds them (setup, helpers, visible and hidden tests) in the
release's order, a key and the number of the pipe to report on. The student's notebook is not
run here: of the student's code, only the definitions of the names the lab asks for (and what
they use) are loaded (`lib_dist.definitions`), after the guard has taken its snapshot.

Each locked cell runs in the guard's locked namespace (`guard.Guard`, which copies the answers
in); the judge runs the cell's code itself, compiled before any student code ran, and checks
with its seals (`seal`) the moment the code ends, before anything a submission could have
rebound or replaced runs again (the guard's methods and state, an exception's `__str__`):
a change swapped in while a test ran and put back by such code afterwards is still seen.
Then the judge writes to the pipe what the cell printed and, for a graded cell, its verdict,
signed with the key (HMAC-SHA256 over the job's nonce, the cell and the verdict). A test
passes when the signed verdict says so: no exception left the cell, the guard saw no change,
and the seals saw none either. The key lives only in this module's frames and closures, out
of the student's reach (`lockdown`), and the verdict is computed with functions captured
before any student code ran.
"""

from __future__ import annotations

import _hashlib
import io
import json
import os
import sys
import threading
import types
from typing import Any

# modules whose functions the tests reach through torch's and Python's own code: sealed loosely
# (not traceback, warnings or IPython: replacing how errors are shown changes no verdict here)
REACHED = frozenset({"torch", "numpy", "lib_dist", "ast", "math", "operator", "functools", "io",
                     "json", "linecache", "types", "inspect", "copy", "collections", "itertools",
                     "contextlib", "os", "random", "re"})


def main() -> None:
    """Read the job, then judge it on a thread of its own. Python hands a signal handler the
    frame the main thread was running; the main thread here only waits, and its frames hold
    nothing (the key went to the judging thread in a box it emptied), while a handler cannot
    even be installed from the judging thread, where the student's code runs."""
    box = [sys.stdin.buffer.read()]
    _close_stdin()
    judging = threading.Thread(target=_judge_from, args=(box,), name="judge")
    judging.start()
    judging.join()


def _judge_from(box: list[bytes]) -> None:
    job = json.loads(box.pop())
    key, channel = bytes.fromhex(job.pop("key")), int(job["channel"])
    write, sign, hex_of = os.write, _hashlib.hmac_digest, bytes.hex
    nonce = str(job["nonce"])

    def report(kind: str, payload: str) -> None:
        write(channel, f"{kind} {payload}\n".encode())

    def verdict(index: int, name: str, passed: bool) -> None:
        line = f"{nonce}|{index}|{name}|{'pass' if passed else 'fail'}"
        report("V", f"{line}|{hex_of(sign(key, line.encode(), 'sha256'))}")

    _judge(job, report, verdict)


def _judge(job: dict[str, Any], report: Any, verdict: Any) -> None:
    from . import guard as guard_module
    from . import lockdown, oracles, seal, snapshot
    from .tracebacks import frameless
    from ..definitions import definitions_in
    from ..extend import LABS

    lab, cells, start = job["lab"], job["cells"], int(job.get("start", 0))
    answers: dict[str, Any] = {}
    judge = guard_module.Guard(lab, answers)
    # what the loop below calls and runs, captured and compiled before any student code runs:
    # the loop looks up nothing a submission could rebind, or swap for a moment and put back
    begin, after, ns = guard_module.Guard.begin, guard_module.Guard.after, judge.ns
    expected = dict(ns)  # the locked namespace as only the locked cells change it
    prepared = _prepared(cells, guard_module.compiled, guard_module.bound_names,
                         frozenset(LABS[lab].asks))
    described = _describer({f"<{c['name']}>": c["source"] for c in cells})
    string_io, exec_, eval_, type_, tuple_ = io.StringIO, exec, eval, type, tuple
    _make_undumpable()
    readers = frameless()  # before the seals: formatting a traceback hands out no frame
    lockdown.lock_down({__file__, guard_module.__file__, *(f"<{cell['name']}>" for cell in cells)},
                       trusted=[*readers, described.__code__])
    strictly = seal.seal(_sealed(judge.snapshot), snapshot.UNWATCHED, snapshot.CLASS_CACHES,
                         snapshot.LAZY_REBINDINGS)
    reached = [(name, vars(module)) for name, module in list(sys.modules.items())
               if module is not None and name.split(".")[0] in REACHED]
    loosely = seal.seal_callables(reached, snapshot.LAZY_REBINDINGS)
    rebound = seal.rebinding_check()

    problems = _load_answers(answers, job["answers"], LABS[lab].asks, definitions_in, oracles)
    earlier = _use_earlier(job.get("earlier") or {}, problems, definitions_in, oracles)
    report("A", json.dumps({"loaded": sorted(answers), "problems": problems,
                            "earlier": earlier}))
    for index, cell in enumerate(cells):
        graded = bool(cell["graded"])
        if index < start and graded:
            continue
        report("B", str(index))
        out, caught, value, step = string_io(), None, None, prepared[index]
        bound: frozenset[str] = frozenset()
        allowed: frozenset[str] = frozenset()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out  # not contextlib's redirect: its __exit__ can be rebound
        try:
            if type_(step) is not tuple_:
                raise step  # the cell does not compile
            body, last, bound, allowed = step
            begin(judge, cell["name"], bound, graded)
            exec_(body, ns)
            value = None if last is None else eval_(last, ns)
        except BaseException as e:  # noqa: BLE001 - a test's failure, whatever it raised
            caught = e
        # checked at once, before any code a submission can reach runs again (the guard's
        # methods, an exception's __str__, IPython's display)
        seen = (strictly() + loosely() + rebound(expected, ns, allowed)) if graded else []
        expected.update({name: ns[name] for name in bound if name in ns})
        try:
            after(judge, bound)
            if graded:
                judge.raise_if_changed(f"while {cell['name']} ran")  # says what changed
            guard_module.shown(value)
        except BaseException as e:  # noqa: BLE001
            caught = e if caught is None else caught
        finally:
            sys.stdout, sys.stderr = saved
        error = None if caught is None else described(caught)
        report("O", json.dumps({"index": index, "text": out.getvalue()[-200_000:],
                                "error": error, "changed": seen}))
        if graded:
            verdict(index, cell["name"], error is None and not seen)
    report("E", "")


def _prepared(cells: list[dict[str, Any]], compiled: Any, bound_names: Any,
              asks: frozenset[str]) -> list[Any]:
    """Each cell's code (statements, final expression), the names it binds, and those it may
    rebind (its own and the answers); or the SyntaxError it raises."""
    prepared: list[Any] = []
    for cell in cells:
        try:
            body, last = compiled(cell["source"], f"<{cell['name']}>")
            bound = frozenset(bound_names(cell["source"]))
            prepared.append((body, last, bound, bound | asks))
        except SyntaxError as e:
            prepared.append(e)
    return prepared


def _load_answers(into: dict[str, Any], cells: list[str], asks: tuple[str, ...],
                  definitions_in: Any, oracles: Any) -> dict[str, str]:
    """Load the student's definitions of `asks` into `into`, all at once or else one by one;
    name -> why it could not be loaded, for each that could not."""
    problems: dict[str, str] = {}
    oracles.enter("the answers' definitions")  # loading runs the student's code
    try:
        try:
            into.update(zip(asks, definitions_in(cells, *asks, source_name="your notebook")))
            return problems
        except Exception:  # noqa: BLE001 - one broken answer: load the others alone
            pass
        for name in asks:
            try:
                into[name] = definitions_in(cells, name, source_name="your notebook")[name]
            except Exception as e:  # noqa: BLE001 - the student's code or a missing answer
                problems[name] = f"{type(e).__name__}: {e}"
    finally:
        oracles.leave()
    return problems


def _use_earlier(earlier: dict[str, Any], problems: dict[str, str], definitions_in: Any,
                 oracles: Any) -> list[str]:
    """Register the student's answers of earlier labs (`Lab.uses`; the grader sends them only
    under `autograde --own-answers`: lab -> {"names", "cells"}) in lib_dist's registry, so
    that lib_dist runs on them here; an all-reduce becomes `Communicator.all_reduce`'s default.
    Returns "name (lab)" for each registered; one that cannot be loaded is noted in `problems`
    and lib_dist's reference is used instead."""
    from .. import registry

    used = []
    oracles.enter("the earlier labs' answers' definitions")  # loading runs the student's code
    try:
        for lab, given in earlier.items():
            for name in given["names"]:
                try:
                    value = definitions_in(given["cells"], name, source_name=f"your {lab}")[name]
                except Exception as e:  # noqa: BLE001 - the student's code or a missing answer
                    problems[f"{name} ({lab})"] = (f"{type(e).__name__}: {e}; lib_dist's "
                                                   f"reference is used instead")
                    continue
                registry.register(name, _refusing_oracles(value, f"{name} ({lab})", oracles))
                if name in registry.ALL_REDUCE_ANSWERS:
                    registry.prefer_all_reduce(registry.MINE)
                used.append(f"{name} ({lab})")
    finally:
        oracles.leave()
    return used


def _refusing_oracles(value: Any, label: str, oracles: Any) -> Any:
    """A function of the student's that runs as an answer does: the lab's oracles refuse to
    be used while it runs (on its thread). Classes are registered as they are."""
    if not isinstance(value, types.FunctionType):
        return value
    enter, leave = oracles.enter, oracles.leave

    def answer(*args: Any, **kwargs: Any) -> Any:
        enter(label)
        try:
            return value(*args, **kwargs)
        finally:
            leave()

    return answer


def _sealed(snap: Any) -> list[tuple[str, Any]]:
    """The namespaces the guard's snapshot watches, labelled as it labels them."""
    return ([(name, vars(module)) for name, module in snap.modules.items()]
            + [(f"{cls.__module__}.{cls.__qualname__}", vars(cls)) for cls in snap.classes])


def _describer(sources: dict[str, str]) -> Any:
    """A function describing an exception a cell raised: its type, message and traceback. The
    traceback is read by this code, which the lockdown trusts to read the frames' code, with
    nothing but the interpreter's own attributes (an exception's class may define `__str__`,
    or a `__traceback__` property: the student's code, which must not run in between)."""
    get_traceback = BaseException.__dict__["__traceback__"].__get__
    traceback_type, type_, str_ = types.TracebackType, type, str

    def described(e: BaseException) -> dict[str, Any]:
        lines: list[tuple[str, int, str]] = []
        tb, left = get_traceback(e), 40
        while type_(tb) is traceback_type and left:
            code = tb.tb_frame.f_code
            lines.append((str_.__str__(code.co_filename), tb.tb_lineno,
                          str_.__str__(code.co_name)))
            tb, left = tb.tb_next, left - 1
        try:
            value = str(e)[:20_000]
        except Exception:  # noqa: BLE001 - a hostile __str__
            value = "(its message could not be read)"
        name = type_(e).__name__
        shown = [f'  File "{file}", line {line}, in {where}\n' + _line_of(sources, file, line)
                 for file, line, where in lines]
        return {"ename": name, "evalue": value,
                "traceback": ["Traceback (most recent call last):\n", *shown, f"{name}: {value}"]}

    return described


def _line_of(sources: dict[str, str], file: str, line: int) -> str:
    """The cell's line `line`, quoted, unless it is part of a hidden test."""
    text = sources.get(file)
    if text is None:
        return ""
    lines, hidden = text.splitlines(), False
    for number, content in enumerate(lines[:line], start=1):
        if "### BEGIN HIDDEN TESTS" in content:
            hidden = True
        elif "### END HIDDEN TESTS" in content:
            hidden = number == line  # the marker itself is not quoted either
    return (f"    {lines[line - 1].strip()}\n" if 0 < line <= len(lines) and not hidden
            else "")


def _close_stdin() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _make_undumpable() -> None:
    """No other process of the sandbox (an engine, a child the student starts) may read this
    one's memory through /proc or ptrace: Linux's prctl(PR_SET_DUMPABLE, 0)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):  # not Linux: the sandbox's own isolation is what remains
        pass


if __name__ == "__main__":
    main()
