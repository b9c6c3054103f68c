"""pyproject.toml and environment.yml must declare the same dependencies."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent

# PyPI name -> conda-forge name, where they differ (normalised form).
CONDA_NAMES = {"torch": "pytorch"}
# Conda-only entries that have no pyproject counterpart.
CONDA_ONLY = {"python", "pip", "c-compiler"}  # c-compiler: what pip takes from the system


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_deps() -> dict[str, SpecifierSet]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    deps = {}
    for line in lines:
        req = Requirement(line)
        name = normalise(req.name)
        name = CONDA_NAMES.get(name, name)
        assert name not in deps, f"duplicate dependency in pyproject.toml: {req.name}"
        deps[name] = req.specifier
    return deps


def conda_deps() -> dict[str, SpecifierSet]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"], env["channels"]
    deps = {}
    for entry in env["dependencies"]:
        if isinstance(entry, dict) and list(entry) == ["pip"]:  # PyPI-only, by conda's pip
            for line in entry["pip"]:
                req = Requirement(line)
                assert normalise(req.name) not in deps, f"duplicate in environment.yml: {line}"
                deps[normalise(req.name)] = req.specifier
            continue
        assert isinstance(entry, str), f"only conda packages expected, got {entry!r}"
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*", entry)
        assert match, f"cannot parse environment.yml entry {entry!r}"
        name, spec = normalise(match.group(1)), match.group(2)
        assert name not in deps, f"duplicate dependency in environment.yml: {name}"
        if name in CONDA_ONLY:
            continue
        deps[name] = SpecifierSet(spec.replace(" ", ""))
    return deps


def test_environment_yml_matches_pyproject():
    py, conda = pyproject_deps(), conda_deps()
    missing = sorted(set(py) - set(conda))
    extra = sorted(set(conda) - set(py))
    assert not missing, f"in pyproject.toml but not environment.yml: {missing}"
    assert not extra, f"in environment.yml but not pyproject.toml: {extra}"
    mismatched = {n: (str(py[n]), str(conda[n])) for n in py if py[n] != conda[n]}
    assert not mismatched, f"version specifiers differ (pyproject, conda): {mismatched}"
