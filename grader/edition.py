"""The judged edition of lib_dist: the library as a graded lab's processes see it, without the
lab's answers.

lib_dist holds the reference of everything a lab asks students to write. Switching those
functions off inside the graded process (`lib_dist.integrity.stubs`) leaves their code on disk,
where a submission can compile it again, load the module a second time from another path, or
start a child Python that imports it fresh. So the grader builds, once per lab and per state of
lib_dist's source, a copy of the package in which each reference the lab declares
(`lib_dist.extend.LABS`) has lost its body: the `def` keeps its name, signature and decorators,
and raises `AskedToWrite` naming the lab. No source, bytecode or cache of those bodies is in the
copy. The sandbox mounts the copy where lib_dist is (`sandbox.SandboxedKernelManager`,
`judge.command`), so every process of the submission imports it, and nothing else of lib_dist
exists there; without the sandbox, it comes first on the judge's PYTHONPATH.

`lib_dist/integrity/edition.py` in the copy names the lab, so that lib_dist guards the lab's
oracles when it is imported, in the judge and on every engine (`lib_dist/__init__.py`).
"""

from __future__ import annotations

import ast
import compileall
import hashlib
import os
import shutil
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import lib_dist
from lib_dist.extend import LABS
from lib_dist.integrity.stubs import resolve

SOURCE = Path(lib_dist.__file__).resolve().parent
Function = ast.FunctionDef | ast.AsyncFunctionDef
MARKER = Path("integrity") / "edition.py"


def judged_edition(folder: Path, lab: str) -> Path:
    """The folder holding `lib_dist/` as `lab` is judged with, built under `folder` unless
    it is there already (its name carries a hash of lib_dist's source and the lab)."""
    if lab not in LABS:
        raise KeyError(f"lib_dist declares no lab {lab!r} (known: {', '.join(sorted(LABS))})")
    home = Path(folder) / f"{lab}-{_fingerprint(lab)}"
    if (home / "lib_dist" / MARKER).is_file():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{lab}-", dir=home.parent))
    _build(scratch / "lib_dist", lab)
    try:
        os.rename(scratch, home)  # atomic: graders working at once each build, one wins
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
    for stale in home.parent.glob(f"{lab}-*"):  # built from an older lib_dist
        if stale != home and not stale.name.startswith("."):
            shutil.rmtree(stale, ignore_errors=True)
    return home


def _build(target: Path, lab: str) -> None:
    shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, lines in _references_by_file(lab).items():
        copy = target / Path(path).relative_to(SOURCE)
        copy.write_text(stubbed(Path(path).read_text(encoding="utf-8"), lines, lab),
                        encoding="utf-8")
    (target / MARKER).write_text(
        f'"""The lab this copy of lib_dist is judged for (grader.edition)."""\n\nLAB = {lab!r}\n',
        encoding="utf-8")
    compileall.compile_dir(target, quiet=2)


def _references_by_file(lab: str) -> dict[str, dict[str, str]]:
    """source file -> {qualified name of the definition: dotted name} of each reference."""
    found: dict[str, dict[str, str]] = {}
    for reference in LABS[lab].references:
        function = resolve(reference)
        while not _inside_lib_dist(function.__code__) and hasattr(function, "__wrapped__"):
            function = function.__wrapped__  # under a decorator of torch's (`@torch.no_grad()`)
        code = function.__code__
        if not _inside_lib_dist(code):
            raise ValueError(f"{reference} is defined in {code.co_filename}, outside lib_dist")
        found.setdefault(code.co_filename, {})[function.__qualname__] = reference.replace(":", ".")
    return found


def _inside_lib_dist(code: types.CodeType) -> bool:
    return Path(code.co_filename).resolve().is_relative_to(SOURCE)


def stubbed(source: str, names: dict[str, str], lab: str) -> str:
    """`source` with the body of each function whose qualified name is in `names` replaced by
    a raise of AskedToWrite."""
    tree = ast.parse(source)
    done = set()
    for qualname, node in _definitions(tree.body, ""):
        if qualname in names:
            node.body = _raising(names[qualname], lab)
            done.add(qualname)
    if missing := set(names) - done:
        raise ValueError(f"no definition of {sorted(missing)} in the source")
    return ast.unparse(tree) + "\n"


def _definitions(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, Function]]:
    """(qualified name, node) of every function defined in `body`, at any depth, named as
    Python's `__qualname__` names them."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualname = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield qualname, node
            inner = qualname + ("." if isinstance(node, ast.ClassDef) else ".<locals>.")
            yield from _definitions(node.body, inner)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # `if TYPE_CHECKING:` and the like
            yield from _definitions([*node.body, *getattr(node, "orelse", [])], prefix)


def _raising(dotted: str, lab: str) -> list[ast.stmt]:
    message = (f"{lab} asks you to write this yourself: {dotted} is lib_dist's own version, "
               f"which is not part of the lab")
    return ast.parse(f"raise __import__('lib_dist.integrity.stubs', fromlist=['AskedToWrite'])"
                     f".AskedToWrite({message!r})").body


def _fingerprint(lab: str) -> str:
    digest = hashlib.sha256(lab.encode())
    for path in sorted(SOURCE.rglob("*.py")):
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]

