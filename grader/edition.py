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

The student edition (`student_edition`, built by `python -m grader release` into
`labs/student_edition/`) is the same copy with every lab's references stubbed at once, each
naming the first lab that asks for it, and no oracle guarded: what a student's environment
is to import, so that opening lib_dist's source shows no answer. Where every lab calls a
reference (lab01's losses, lab03's collectives), it calls a stand-in (`lib_dist.stand_ins`).
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
from lib_dist.stand_ins import KEPT, STAND_INS

SOURCE = Path(lib_dist.__file__).resolve().parent
Function = ast.FunctionDef | ast.AsyncFunctionDef
MARKER = Path("integrity") / "edition.py"
STUDENT = "student"  # the student edition, among the editions' names
LECTURES_KERNEL = "Python 3 (lib_dist lectures)"  # the kernel of the lecture edition (grader.lectures)


def judged_edition(folder: Path, lab: str) -> Path:
    """The folder holding `lib_dist/` as `lab` is judged with, built under `folder` unless
    it is there already (its name carries a hash of lib_dist's source and the lab)."""
    if lab not in LABS:
        raise KeyError(f"lib_dist declares no lab {lab!r} (known: {', '.join(sorted(LABS))})")
    home = Path(folder) / f"{lab}-{_fingerprint(lab)}"
    if (home / "lib_dist" / MARKER).is_file():
        return home
    scratch = scratch_beside(home)
    _build(scratch / "lib_dist", judged=lab)
    return publish(scratch, home, family=lab)


def scratch_beside(folder: Path) -> Path:
    """A new empty folder beside `folder`, readable by everyone (mkdtemp's are its owner's
    alone): editions are read by students and by other users' releases."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    scratch.chmod(0o755)
    return scratch


def copy_of_source(target: Path) -> None:
    """lib_dist's source copied to `target` (no caches, no extension modules), readable by
    everyone whatever the source's own modes: a deployment keeps the repository's lib_dist its
    staff's alone (README), while the editions built from it are for students."""
    shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
                    copy_function=shutil.copyfile)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def publish(scratch: Path, home: Path, family: str) -> Path:
    """`scratch`, built, renamed to `home` (atomic: builders working at once each build, one
    wins), and the other builds of `family` beside it (from an older lib_dist) removed."""
    try:
        os.rename(scratch, home)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
    for stale in home.parent.glob(f"{family}-*"):
        if stale != home:
            shutil.rmtree(stale, ignore_errors=True)
    return home


def replace(folder: Path, new: Path) -> Path:
    """Put the folder `new` where `folder` is, moving the old one aside first."""
    if folder.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{folder.name}-stale-", dir=folder.parent))
        os.rename(folder, stale / folder.name)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(new, folder)
    return folder


def student_edition(folder: Path) -> Path:
    """`folder`, holding `lib_dist/` as students get it: the reference of everything any lab
    asks for is a stub naming the first lab that asks for it, and no oracle is guarded (a
    student may run torch's DistributedDataParallel in their own notebook). Rebuilt when
    lib_dist's source has changed since (`SOURCE_HASH` in it says from which source)."""
    folder = Path(folder)
    stamp, wanted = folder / "SOURCE_HASH", _fingerprint(STUDENT)
    if stamp.is_file() and stamp.read_text() == wanted and (folder / "lib_dist" / MARKER).is_file():
        return folder
    scratch = scratch_beside(folder)
    _build(scratch / "lib_dist", judged=None)
    (scratch / "SOURCE_HASH").write_text(wanted)
    return replace(folder, scratch)


def _build(target: Path, judged: str | None) -> None:
    """lib_dist copied to `target`: judged for the lab `judged` (its references stubbed, its
    oracles guarded on import), or the student edition (None: every lab's references stubbed)."""
    copy_of_source(target)
    kept = () if judged else KEPT  # the student edition's collectives run (comm.stand_ins)
    for path, names in _references_by_file([judged] if judged else sorted(LABS), kept).items():
        copy = target / Path(path).relative_to(SOURCE)
        copy.write_text(stubbed(Path(path).read_text(encoding="utf-8"), names,
                                student=judged is None), encoding="utf-8")
    what = ("The lab this copy of lib_dist is judged for (grader.edition)." if judged else
            "None: the student edition of lib_dist (grader.edition), no lab's references in it.")
    (target / MARKER).write_text(f'"""{what}"""\n\nLAB = {judged!r}\nSTUDENT = {judged is None}\n',
                                 encoding="utf-8")
    compileall.compile_dir(target, quiet=2)


def _references_by_file(labs: list[str], kept: tuple[str, ...] = ()
                        ) -> dict[str, dict[str, tuple[str, str]]]:
    """source file -> {qualified name of the definition: (reference, lab)} of each reference
    of `labs` but those `kept`; one that several labs declare names the first of them."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for lab in labs:
        for reference in set(LABS[lab].references) - set(kept):
            function = resolve(reference)
            while not _inside_lib_dist(function.__code__) and hasattr(function, "__wrapped__"):
                function = function.__wrapped__  # under a decorator of torch's (`@torch.no_grad()`)
            code = function.__code__
            if not _inside_lib_dist(code):
                raise ValueError(f"{reference} is defined in {code.co_filename}, outside lib_dist")
            found.setdefault(code.co_filename, {}).setdefault(
                function.__qualname__, (reference, lab))
    return found


def _inside_lib_dist(code: types.CodeType) -> bool:
    return Path(code.co_filename).resolve().is_relative_to(SOURCE)


def stubbed(source: str, names: dict[str, tuple[str, str]], student: bool = False) -> str:
    """`source` with the body of each function whose qualified name is in `names` replaced by
    a raise of AskedToWrite naming the lab that asks for it (`names`: qualname -> (reference,
    lab)). `student`: the student edition's, whose message also says which kernel runs
    lectures, and whose losses and collectives call their stand-ins (`lib_dist.stand_ins`)."""
    tree = ast.parse(source)
    done = set()
    for qualname, node in _definitions(tree.body, ""):
        if qualname in names:
            reference, lab = names[qualname]
            node.body = (_standing_in(STAND_INS[reference], node.args)
                         if student and reference in STAND_INS
                         else _raising(reference.replace(":", "."), lab, student))
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


def _standing_in(target: str, args: ast.arguments) -> list[ast.stmt]:
    """`return <target, "module:name">(<the function's own arguments>)`."""
    module, name = target.split(":")
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    passed = positional + ([f"*{args.vararg.arg}"] if args.vararg else [])
    passed += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    passed += [f"**{args.kwarg.arg}"] if args.kwarg else []
    return ast.parse(f"return __import__({module!r}, fromlist=[{name!r}])"
                     f".{name}({', '.join(passed)})").body


def _raising(dotted: str, lab: str, lectures_hint: bool) -> list[ast.stmt]:
    message = (f"{lab} asks you to write this yourself: {dotted} is lib_dist's own version, "
               f"which is not part of the lab")
    if lectures_hint:  # a lecture run in the labs' kernel stops here
        message += (f" (running a lecture? Choose the kernel '{LECTURES_KERNEL}', "
                    "which runs lib_dist's own)")
    return ast.parse(f"raise __import__('lib_dist.integrity.stubs', fromlist=['AskedToWrite'])"
                     f".AskedToWrite({message!r})").body


def _fingerprint(lab: str) -> str:
    digest = hashlib.sha256(lab.encode())
    for path in sorted(SOURCE.rglob("*.py")):
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]

