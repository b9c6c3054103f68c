"""The layout rules of DEVELOPERS.md that a machine can check: small files, and a library
that depends on nothing in the grader."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE = ["lib_dist", "grader", "benchmarks", "deploy", "site"]  # what students and staff read


def python_files(*folders: str) -> list[Path]:
    return sorted(f for folder in folders for f in (REPO / folder).rglob("*.py"))


def test_every_file_of_the_code_is_under_300_lines():
    files = python_files(*CODE)
    assert len(files) > 50
    long = {str(f.relative_to(REPO)): n for f in files
            if (n := len(f.read_text().splitlines())) >= 300}
    assert long == {}, f"split these by concept: {long}"


def imported_modules(file: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_lib_dist_imports_nothing_from_the_grader():
    uses = {str(f.relative_to(REPO)): sorted(m for m in imported_modules(f)
                                             if m.split(".")[0] == "grader")
            for f in python_files("lib_dist")}
    assert {f: m for f, m in uses.items() if m} == {}
    assert "torch" in imported_modules(REPO / "lib_dist/cluster/cluster.py")  # it sees imports
