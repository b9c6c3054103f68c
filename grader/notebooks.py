"""Execute the course's notebooks and store their outputs; tell when stored outputs are stale.

    python -m grader.notebooks [PATH ...]          # default: course/ and solutions/, all of them
    python -m grader.notebooks --check [PATH ...]  # only report stale notebooks (no kernel)

`make notebooks` runs the first. Self-study readers see the results on GitHub because the lecture
notebooks (course/) and the instructor's notebooks (solutions/) are stored executed: each runs in
a fresh kernel, in its own folder, top to bottom, and its outputs are written back into the file.
The student release (labs/) stays output-free: nbgrader's release clears outputs (it keeps the
notebook's metadata, so labs/ is released again after the solutions are executed: `make
notebooks` does both).

A stored notebook is *stale* when its outputs no longer come from its code. Executing records, in
the notebook's metadata under `lib_dist_executed`, a SHA-256 of its code cells' sources;
`problems(path)` recomputes it (reading JSON only, no kernel) and also reports code cells not run,
run out of order, or holding an error. Markdown edits do not make a notebook stale.

Executing takes minutes while other people may edit the same files, so the notebook is read
again just before writing: its outputs go into the current file, cell by cell, and only if the
code cells there are still the ones that ran (otherwise nothing is written and the notebook is
named as changed while it ran). The notebook's own metadata is kept as it was, apart from the
record: no kernel or Python version creeps into the solutions, and from there into labs/.
Widget outputs (tqdm's live progress bars in a kernel with ipywidgets) are not stored: without
the live kernel they show nothing, or a bar stuck at 0%.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
KEY = "lib_dist_executed"
WIDGET = "application/vnd.jupyter.widget-view+json"  # live progress bars: nothing once stored
CELL_TIMEOUT = 900  # seconds; course 03 measures all-reduces of up to 64 MiB on 4 engines


def default_notebooks(root: Path = REPO) -> list[Path]:
    """Every lecture notebook, then every lab's source notebook, in course order."""
    course = sorted((root / "course").glob("*.ipynb"))
    labs = sorted(p for p in (root / "solutions").glob("*/*.ipynb") if p.stem == p.parent.name)
    return course + labs


def code_hash(nb) -> str:
    """SHA-256 of the sources of the notebook's code cells, in order."""
    sources = [_text(c.source) for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def problems(path: Path) -> list[str]:
    """Why the stored outputs of `path` are not those of a top-to-bottom run of its current
    code: an empty list when they are. Reads the file only."""
    nb = nbformat.read(path, as_version=4)
    found = []
    recorded = nb.metadata.get(KEY, {}).get("code_sha256")
    if recorded is None:
        found.append("it was never executed by `make notebooks` (no record in its metadata)")
    elif recorded != code_hash(nb):
        found.append("its code changed since it was executed")
    counts, not_run = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not _text(cell.source).strip():
            continue
        if cell.get("execution_count") is None:
            not_run.append(i + 1)
        else:
            counts.append(cell.execution_count)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {i + 1} holds an error: {out.get('ename')}: "
                             f"{str(out.get('evalue', ''))[:200]}")
    if not_run:
        found.append(f"cell {not_run[0]} was not run" if len(not_run) == 1 else
                     f"cells {', '.join(map(str, not_run))} were not run")
    if counts != list(range(1, len(counts) + 1)) and counts:
        found.append(f"its cells were not run once each, top to bottom, in one kernel "
                     f"(execution counts {counts})")
    return found


def execute(path: Path, timeout: int = CELL_TIMEOUT) -> float:
    """Run `path` in a fresh kernel in its folder and store its outputs; return the seconds.

    Raises nbclient's CellExecutionError (naming the cell) on an error, and RuntimeError when the
    notebook's code changed while it ran; in both cases the file is left as it was."""
    from nbclient import NotebookClient

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    ran = code_hash(nb)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=["--HistoryManager.hist_file=:memory:",
                                             "--log-level=ERROR"])
    start = time.monotonic()
    client.execute()
    seconds = time.monotonic() - start
    _store(path, nb, ran)
    return seconds


def _store(path: Path, executed, ran: str) -> None:
    """Put the outputs of `executed` into the notebook as it is on disk now, and write it."""
    current = nbformat.read(path, as_version=4)
    if code_hash(current) != ran or len(current.cells) != len(executed.cells):
        raise RuntimeError(f"{path} changed while it ran; run it again")
    for mine, done in zip(current.cells, executed.cells):
        if mine.cell_type == "code":
            mine.outputs = [o for o in done.outputs if WIDGET not in o.get("data", {})]
            mine.execution_count = done.execution_count
    current.metadata[KEY] = {"code_sha256": ran}
    tmp = path.with_name(f".{path.name}.tmp")
    nbformat.write(current, tmp)
    os.replace(tmp, path)


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.notebooks",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:4]))
    p.add_argument("paths", nargs="*", type=Path,
                   help="notebooks (default: course/*.ipynb and solutions/<lab>/<lab>.ipynb)")
    p.add_argument("--check", action="store_true", help="only list stale notebooks")
    p.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds per cell")
    args = p.parse_args(argv)
    paths = args.paths or default_notebooks()
    if args.check:
        stale = {path: problems(path) for path in paths}
        for path, found in stale.items():
            for problem in found:
                print(f"{_shown(path)}: {problem}")
        print(f"{sum(bool(f) for f in stale.values())} of {len(paths)} notebooks stale")
        return 1 if any(stale.values()) else 0
    begin, failed = time.monotonic(), []
    for path in paths:
        print(f"{_shown(path)} ...", end="", flush=True)
        try:
            seconds = execute(path, args.timeout)
        except Exception as e:  # noqa: BLE001 - report it, go on with the next notebook
            failed.append(path)
            first = str(e).strip().splitlines()
            print(f" FAILED ({type(e).__name__}), not stored:\n" + "\n".join(first[-15:]),
                  flush=True)
            continue
        print(f" {_minutes(seconds)}", flush=True)
    total = time.monotonic() - begin
    print(f"executed {len(paths) - len(failed)} of {len(paths)} notebooks in {_minutes(total)}"
          + (f"; failed: {', '.join(_shown(p) for p in failed)}" if failed else ""))
    return 1 if failed else 0


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


if __name__ == "__main__":
    sys.exit(main())
