"""The lecture edition of lib_dist: the reference, compiled, so lectures run and show no answer.

The student edition (`grader.edition`) has every answer a lab asks for reduced to a stub, so
a lecture that trains with `DataParallel` or draws a pipeline's schedule would stop at the
stub of a lab the student has not done yet. The lecture edition is lib_dist whole, except
that each file holding a reference is compiled by Cython into an extension module: a lecture
runs it at full speed and gets the same results, while neither the file's source nor its
bytecode is anywhere in the edition (only machine code, which `inspect` cannot show).

Students get it from `python -m grader release` in `labs/lecture_edition/`, and run lectures
in the kernel that puts it first on the path, "Python 3 (lib_dist lectures)", whose spec is in
the edition (`share/jupyter/kernels/lib_dist-lectures`: the hub's JUPYTER_PATH finds it).
Graded runs never see it: the sandbox mounts the judged edition of the lab where lib_dist is.
Its limit: machine code can be disassembled, which takes far more than the lab it would skip.

Building takes a C compiler and a minute or two (45 files); a build is kept in a cache per
state of lib_dist's source (`LIB_DIST_EDITIONS`, default this kit's `build/editions/`), so
releasing again, or into another course folder, copies it.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lib_dist.extend import LABS

from .course import REPO
from .edition import (LECTURES_KERNEL, MARKER, SOURCE, _fingerprint, _references_by_file,
                      copy_of_source, publish, replace, scratch_beside)

LECTURES = "lectures"  # the lecture edition, among the editions' names
# Its kernel, in the edition: a folder for JUPYTER_PATH (deploy/), or `jupyter kernelspec install`
KERNELS, KERNEL = Path("share/jupyter/kernels"), "lib_dist-lectures"
# Optimised a little: lectures run a small model, and -O2 takes twice as long to build.
CFLAGS = "-O1 -g0"


def lecture_edition(folder: Path) -> Path:
    """`folder`, holding `lib_dist/` as lectures run it: whole, each file that holds a lab's
    reference compiled by Cython (no `.py`, `.pyc` or `.c` of it left). Rebuilt, or copied from
    the cache, when lib_dist's source has changed since (`SOURCE_HASH` says from which)."""
    folder = Path(folder)
    stamp, wanted = folder / "SOURCE_HASH", _fingerprint(LECTURES)
    if stamp.is_file() and stamp.read_text() == wanted:
        return folder
    scratch = scratch_beside(folder)
    shutil.copytree(_cached_build(wanted), scratch, dirs_exist_ok=True)
    _write_kernel(scratch / KERNELS / KERNEL, folder)
    return replace(folder, scratch)


def _write_kernel(where: Path, edition: Path) -> None:
    """The Jupyter kernel that runs lectures on the edition at `edition` (once it is there):
    this Python, with the edition first on its path, and so on its engines' too."""
    where.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": LECTURES_KERNEL, "language": "python",
            "env": {"PYTHONPATH": str(edition.resolve())}}
    (where / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")


def compiled_files() -> list[Path]:
    """lib_dist's files that hold the reference of anything a lab asks for."""
    return sorted(Path(p) for p in _references_by_file(sorted(LABS)))


def _cached_build(fingerprint: str) -> Path:
    cache = Path(os.environ.get("LIB_DIST_EDITIONS", REPO / "build" / "editions"))
    home = cache / f"{LECTURES}-{fingerprint}"
    if (home / "SOURCE_HASH").is_file():
        return home
    scratch = scratch_beside(home)  # releases by other users (the hub's instructor) copy it
    _build(scratch / "lib_dist")
    (scratch / "SOURCE_HASH").write_text(fingerprint)
    return publish(scratch, home, family=LECTURES)


def _build(target: Path) -> None:
    copy_of_source(target)
    sources = [target / p.relative_to(SOURCE) for p in compiled_files()]
    (target / MARKER).write_text(
        '"""None: the lecture edition of lib_dist (grader.lectures), its references compiled."""'
        "\n\nLAB = None\n", encoding="utf-8")
    _cythonize(target.parent, sources)
    for source in sources:  # only the extension module is left
        source.unlink()
        source.with_suffix(".c").unlink(missing_ok=True)
    shutil.rmtree(target.parent / "build", ignore_errors=True)
    compileall.compile_dir(target, quiet=2)


def _cythonize(root: Path, sources: list[Path]) -> None:
    """Compile `sources` (inside the package under `root`) to extension modules in place, as
    `cythonize -i` does, on every core; a failure says what the compiler said."""
    command = [sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-3", "-q",
               "-j", str(os.cpu_count() or 1), *[str(s.relative_to(root)) for s in sources]]
    env = dict(os.environ, CFLAGS=CFLAGS)
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"Cython could not compile lib_dist's references for the lecture "
                           f"edition (a C compiler is needed: gcc or clang):\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")

