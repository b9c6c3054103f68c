"""Copying shows: which students' answers are nearly the same, and which are nearly the
reference, found by copydetect (winnowed fingerprints of the tokenised code, as MOSS does).

For each lab the detector sees one file per student: the code of the cells nbgrader marks as
solution cells, cell after cell, and nothing else of the notebook. The release's own code (its
skeletons, helpers and tests) is copydetect's boilerplate, as MOSS's base file is: fingerprints
found there count for no one. Two references stand beside the students: the instructor's
solution cells, and lib_dist's own versions of what the lab asks for
(`lib_dist.extend.LABS[lab].references`).

A pair's score is the larger of copydetect's two fractions: the share of one answer's
fingerprinted tokens that the other holds too. Against a reference only the student's share
counts (lib_dist's source holds much that a lab never asks for). `THRESHOLD` is chosen from the
scores tests/test_similarity.py measures (README, "The similarity report").
"""

from __future__ import annotations

import csv
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat
from copydetect import CopyDetector

from .course import Course
from .synthetic import MARKERS

THRESHOLD = 0.62  # the middle of the gap measured: README, "The similarity report"
NOISE, GUARANTEE = 25, 25  # copydetect's defaults: k-grams of 25 filtered characters, all kept


@dataclass(frozen=True)
class Match:
    """Two answers of one lab and how much of each the other holds."""

    lab: str
    first: str  # a student
    second: str  # another student, or "[solution]" / "[lib_dist]"
    fractions: tuple[float, float]  # share of first's, second's fingerprinted tokens in the other
    tokens: int  # filtered characters the two have in common

    @property
    def reference(self) -> bool:
        return self.second.startswith("[")

    @property
    def score(self) -> float:
        return self.fractions[0] if self.reference else max(self.fractions)


def answer_code(nb: nbformat.NotebookNode) -> str:
    """The code of a notebook's solution cells, markers of nbgrader's solution regions left
    out: what the student wrote (with whatever of the release's skeleton they kept)."""
    cells = [MARKERS.sub("", c.source) for c in nb.cells if c.cell_type == "code"
             and c.metadata.get("nbgrader", {}).get("solution")]
    return "\n\n".join(cells) + "\n"


def release_code(nb: nbformat.NotebookNode) -> str:
    """The boilerplate: every code cell of the release, then its answer cells as
    `answer_code` joins them, so that an answer left as released matches at the seams
    between cells too."""
    cells = "\n\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return cells + "\n\n" + answer_code(nb)


def library_code(lab: str) -> str:
    """The source of lib_dist's own versions of what `lab` asks for, one after another (of a
    method, its whole class: a copy takes the class), then `stand_in_code(lab)`; empty for a
    lab that has none."""
    from lib_dist.extend import LABS
    from lib_dist.integrity.stubs import lookup

    sources: list[str] = []
    for name in LABS[lab].references if lab in LABS else ():
        module, _, qualname = name.partition(":")
        owner = qualname.rpartition(".")[0]
        obj = inspect.unwrap(lookup(f"{module}:{owner}" if owner else name))
        source = textwrap.dedent(inspect.getsource(obj))
        if source not in sources:
            sources.append(source)
    if stand_ins := stand_in_code(lab):
        sources.append(stand_ins)
    return "\n\n".join(sources) + "\n" if sources else ""


def stand_in_code(lab: str) -> str:
    """The modules whose stand-ins the student edition runs in place of `lab`'s references
    (lab01's losses, lab03's collectives): installed, so pasted as easily; empty for the rest."""
    from lib_dist.extend import LABS
    from lib_dist.stand_ins import STAND_INS

    modules = sorted({STAND_INS[name].split(":")[0] for name in LABS[lab].references
                      if name in STAND_INS} if lab in LABS else set())
    return "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in modules)


def submissions(course: Course, lab: str, folder: Path | None = None) -> dict[str, Path]:
    """student -> their notebook of `lab`: in `folder` (<student>/<lab>.ipynb or nbgrader's
    <student>/<lab>/<lab>.ipynb), by default the course's submitted/ folder."""
    folder = Path(folder) if folder else course.work / "submitted"
    found = {}
    for pattern in (f"*/{lab}.ipynb", f"*/{lab}/{lab}.ipynb"):
        for path in sorted(folder.glob(pattern)):
            found[path.relative_to(folder).parts[0]] = path
    return found


def prepare(course: Course, lab: str, students: dict[str, Path], out: Path) -> Path:
    """Write what the detector reads into out/<lab>/: students/<student>.py, references/
    (solution.py, lib_dist.py) and release.py. Returns that folder."""
    folder = out / lab
    for sub in ("students", "references"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for old in (folder / sub).glob("*.py"):
            old.unlink()
    for student, path in students.items():
        code = answer_code(nbformat.read(path, as_version=4))
        (folder / "students" / f"{student}.py").write_text(code)
    solution = answer_code(nbformat.read(course.source_notebook(lab), as_version=4))
    (folder / "references" / "solution.py").write_text(solution)
    if library := library_code(lab):
        (folder / "references" / "lib_dist.py").write_text(library)
    release = nbformat.read(course.released_notebook(lab), as_version=4)
    (folder / "release.py").write_text(release_code(release))
    return folder


def detect(folder: Path, threshold: float = THRESHOLD) -> tuple[CopyDetector, list[Match]]:
    """Run copydetect on a folder `prepare` wrote; every pair with its score, highest first."""
    detector = CopyDetector(
        test_dirs=[str(folder / "students")],
        ref_dirs=[str(folder / "students"), str(folder / "references")],
        boilerplate_dirs=[], extensions=["py"], noise_t=NOISE, guarantee_t=GUARANTEE,
        display_t=threshold, autoopen=False, silent=True, force_language="python",
        out_file=str(folder.parent / f"{folder.name}.html"))
    detector.add_file(str(folder / "release.py"), "boilerplate")
    detector.run()
    lab, matches = folder.name, []
    for i, test in enumerate(detector.test_files):
        for j, ref in enumerate(detector.ref_files):
            first, second = _owner(Path(test)), _owner(Path(ref))
            if first == second or (not second.startswith("[") and second < first):
                continue  # itself, or a pair of students already counted the other way
            sims = detector.similarity_matrix[i, j]
            if sims[0] < 0:  # not compared (copydetect skips a file it cannot read)
                continue
            tokens = int(detector.token_overlap_matrix[i, j])
            matches.append(Match(lab, first, second, (float(sims[0]), float(sims[1])), tokens))
    return detector, sorted(matches, key=lambda m: (-m.score, m.first, m.second))


def _owner(path: Path) -> str:
    return f"[{path.stem}]" if path.parent.name == "references" else path.stem


def similarity(course: Course, labs: list[str] | None = None, folder: Path | None = None,
               out: Path | None = None, threshold: float = THRESHOLD,
               ) -> dict[str, list[Match]]:
    """For each lab with submissions, every pair's `Match`, highest first; writes an HTML page
    per lab (copydetect's, the flagged pairs side by side) and similarity.csv into `out`
    (default: instructor/reports/similarity)."""
    out = Path(out or course.work / "reports" / "similarity")
    results = {}
    for lab in labs or course.lab_names():
        course.check_lab(lab)
        students = submissions(course, lab, folder)
        if not students:
            continue
        detector, matches = detect(prepare(course, lab, students, out), threshold)
        detector.generate_html_report()
        results[lab] = matches
    _write_csv(out / "similarity.csv", results)
    return results


def _write_csv(path: Path, results: dict[str, list[Match]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lab", "first", "second", "score", "first_share", "second_share",
                         "tokens"])
        for lab, matches in results.items():
            for m in matches:
                writer.writerow([lab, m.first, m.second, f"{m.score:.3f}",
                                 f"{m.fractions[0]:.3f}", f"{m.fractions[1]:.3f}", m.tokens])


def flagged(matches: list[Match], threshold: float = THRESHOLD) -> list[Match]:
    """The matches scoring above `threshold` (copydetect's display threshold is the same)."""
    return [m for m in matches if m.score > threshold]


def format_flagged(results: dict[str, list[Match]], threshold: float = THRESHOLD,
                   out: Path | None = None) -> str:
    """The flagged pairs, lab by lab, highest first, with each lab's page."""
    lines = [f"Similarity (copydetect): pairs scoring above {threshold:.2f}, the share of one "
             f"answer found in the other"]
    for lab, matches in results.items():
        found = flagged(matches, threshold)
        page = f"  {out / f'{lab}.html'}" if out else ""
        lines.append(f"{lab}: {len(found)} of {len(matches)} pairs flagged{page}")
        width = max((len(name) for m in found for name in (m.first, m.second)), default=0)
        lines += [f"  {m.score:4.2f}  {m.first:<{width}}  {m.second:<{width}}  "
                  f"({m.fractions[0]:.2f} / {m.fractions[1]:.2f} shared, {m.tokens} tokens)"
                  for m in found]
    if not results:
        lines.append("no submissions")
    return "\n".join(lines)


__all__ = ["THRESHOLD", "Match", "detect", "flagged", "format_flagged", "similarity"]
