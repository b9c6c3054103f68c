"""The layout rules of CONTRIBUTING.md that a machine can check: small files, a library that
depends on nothing in the grader, no import cycles, and the `comm/fast/` fence."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


def test_the_readme_layout_names_every_package_of_lib_dist():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Layout"):].split("\n## ")[0]
    packages = sorted(d.name for d in (REPO / "lib_dist").iterdir()
                      if (d / "__init__.py").is_file())
    assert len(packages) > 10 and "mixed_precision" in packages
    assert [p for p in packages if f"| `lib_dist/{p}/` |" not in table] == []


# -- the module graph ------------------------------------------------------------------------

def module_name(file: Path) -> str:
    parts = list(file.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at module level and inside functions, but not
    under `if TYPE_CHECKING:`."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo += ast.iter_child_nodes(node)


def import_graph(*folders: str) -> dict[str, set[str]]:
    """module -> the modules of `folders` it imports (`from package import submodule` names
    the submodule; `from module import name`, the module). Importing a submodule also runs its
    packages' `__init__`, which is not counted: a package re-exporting its modules is by design.
    """
    files = {module_name(f): f for f in python_files(*folders)}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, file in files.items():
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in runtime_imports(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                found |= {known(alias.name) for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in files else known(base)
                      for a in node.names}
        graph[name] = {m for m in found if m is not None and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_in_lib_dist_or_the_grader():
    """Imports inside functions count as much as those at the top of a module: an import put in
    a function so that two modules can import each other leaves the cycle where it was (each
    still needs the other, and which loads first decides what breaks), merely hidden until
    run time. Only `if TYPE_CHECKING:` imports are left out, since they never run. A cycle is
    broken by moving what both need into a module of its own, below both (CONTRIBUTING.md)."""
    graph = import_graph("lib_dist", "grader")
    assert len(graph) > 100 and "lib_dist.comm.point_to_point" in graph["lib_dist.comm.base"]
    assert cycles(graph) == []
    # the check finds a cycle, even one closed inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    inner = ast.parse("def f():\n    from . import x\nif TYPE_CHECKING:\n    import y\n")
    assert [type(n).__name__ for n in runtime_imports(inner)] == ["ImportFrom"]


def test_only_the_transport_factory_imports_the_fast_paths():
    """`lib_dist.comm.fast` (shared memory, the tuner) is an optimisation, not course material:
    the rest of lib_dist must work and read without it. One module reaches into it, the torch
    backend's transport factory (`lib_dist.comm.transport.connect`); everything else, the
    `TorchCommunicator` included, goes through that."""
    graph = import_graph("lib_dist")
    inside = {m for m in graph if m.startswith("lib_dist.comm.fast")}
    users = {m for m, imported in graph.items() if m not in inside and imported & inside}
    assert users == {"lib_dist.comm.transport"}
