"""An offline, deterministic text corpus: the docstrings of Python's own standard library.

Every Python installation carries the source of its standard library, and its docstrings are
about 220 kB of English prose and examples (on Python 3.11). `build_corpus()` reads the files
in `CORPUS_FILES` from the running interpreter's standard library, parses each with `ast`
(nothing is imported or run), and joins, in file order and source order:

1. The Zen of Python, decoded from `this.py`, where it is stored ROT13-encoded;
2. every module, class and function docstring of the other files.

Characters outside printable ASCII are dropped and tabs become spaces, so the vocabulary has at
most 96 characters. The same Python version always gives the same text, byte for byte (its
SHA-256 is in `Corpus.sha256`); another version gives a similar but not identical text, since
docstrings change between releases. Files missing from an installation are skipped and listed in
`Corpus.missing`.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Pure-Python modules, stable across 3.10-3.13, in the order they enter the corpus.
CORPUS_FILES = (
    "this.py", "textwrap.py", "string.py", "json/__init__.py", "argparse.py", "functools.py",
    "collections/__init__.py", "random.py", "statistics.py", "fractions.py", "heapq.py",
    "difflib.py", "typing.py", "dataclasses.py", "enum.py", "inspect.py",
    "logging/__init__.py", "contextlib.py", "shutil.py", "calendar.py", "csv.py", "bisect.py",
)
_PRINTABLE = frozenset(chr(c) for c in range(32, 127)) | {"\n"}


@dataclass
class Corpus:
    """The text, and where it came from."""

    text: str
    files: list[str] = field(default_factory=list)    # the files read, relative to the stdlib
    missing: list[str] = field(default_factory=list)  # files of CORPUS_FILES not found

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.text)


def build_corpus(stdlib: str | Path | None = None) -> Corpus:
    """The corpus of the standard library at `stdlib` (default: the running interpreter's)."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    parts, files, missing = [], [], []
    for name in CORPUS_FILES:
        path = root / name
        if not path.is_file():
            missing.append(name)
            continue
        source = path.read_text(encoding="utf-8")
        parts += [_zen(source)] if name == "this.py" else list(_docstrings(ast.parse(source)))
        files.append(name)
    if not parts:
        raise FileNotFoundError(f"none of the corpus files were found under {root}")
    return Corpus(_normalise("\n\n".join(p for p in parts if p)), files, missing)


def _docstrings(node: ast.AST) -> Iterator[str]:
    """Docstrings of the module, classes and functions under `node`, in source order."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(node):
        yield from _docstrings(child)


def _zen(source: str) -> str:
    """this.py keeps the Zen of Python in a ROT13-encoded string assigned to `s`."""
    for stmt in ast.parse(source).body:
        if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["s"]
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
            return codecs.decode(stmt.value.value, "rot13").strip()
    return ""


def _normalise(text: str) -> str:
    return "".join(ch for ch in text.replace("\t", "    ") if ch in _PRINTABLE)
