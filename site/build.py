"""Build the course website from the stored notebooks: `python site/build.py [OUT]`.

Assembles a Sphinx source tree beside OUT (OUT-src: an index whose table of contents goes module
by module, each module's lecture notebook, a page per lab that links the student notebook to
download and the solution's page, and the solutions) and builds it into OUT (build/site). The
notebooks are not executed here: the site shows the outputs `make notebooks` stored.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "site"
ROW = re.compile(r"^\| *(\d\d) *\| *`?([\w.]*)`? *\| *`(\w+)` *\| *(.*?) *\| *[^|]*\|$")
LAB_ROW = re.compile(r"^\| *`(\w+)` *\| *(.*?) *\| *(\d+) *\|$")


@dataclass
class Module:
    number: str
    lecture: str  # course/NAME.ipynb, or "" where the module has no lecture (module 00)
    lab: str
    teaches: str
    lab_asks: str = ""
    points: str = ""


def modules() -> list[Module]:
    """The modules, from the tables of course/README.md and labs/README.md."""
    found = [Module(m[1], m[2], m[3], m[4]) for line in
             (REPO / "course" / "README.md").read_text().splitlines() if (m := ROW.match(line))]
    labs = {m[1]: m for line in (REPO / "labs" / "README.md").read_text().splitlines()
            if (m := LAB_ROW.match(line))}
    for module in found:
        if module.lab in labs:
            module.lab_asks, module.points = labs[module.lab][2], labs[module.lab][3]
    if not found:
        sys.exit("site: no module found in course/README.md's table")
    return found


def title(module: Module) -> str:
    name = module.lecture or module.lab
    return f"{module.number} " + name.split("_", 1)[1].replace("_", " ")


def lab_page(module: Module) -> str:
    lab = module.lab
    return f"""# Lab {module.number}: `{lab}`

What you write: {module.lab_asks or "see the notebook"}. Worth {module.points or "?"} points,
graded by nbgrader on a cluster of engines.

- The student notebook: {{download}}`{lab}.ipynb <../downloads/{lab}.ipynb>` (or fetch it in
  JupyterHub's Assignments page). Its tests run as you work; the hidden ones when it is graded.
- The solution, executed: [{lab} solved](../solutions/{lab}.ipynb).
"""


def index_page(found: list[Module]) -> str:
    lines = ["# lib_dist", "",
             "How large language models are trained across many GPUs, taught in notebooks that "
             "run on a laptop's CPU. Each module has a lecture notebook, stored with the outputs "
             "of a real run, and a graded lab.", "",
             "| module | lecture | lab | what it teaches |", "| --- | --- | --- | --- |"]
    for m in found:
        lecture = f"[{m.lecture}](course/{m.lecture}.ipynb)" if m.lecture else ""
        teaches = m.teaches if len(m.teaches) < 240 else m.teaches[:237].rsplit(" ", 1)[0] + " ..."
        lines.append(f"| {m.number} | {lecture} | [{m.lab}](labs/{m.lab}.md) | {teaches} |")
    for m in found:
        entries = ([f"course/{m.lecture}"] if m.lecture else []) + [f"labs/{m.lab}",
                                                                     f"solutions/{m.lab}"]
        lines += ["", "```{toctree}", f":caption: {title(m)}", ":maxdepth: 1", "",
                  *entries, "```"]
    return "\n".join(lines) + "\n"


def assemble(found: list[Module], source: Path) -> None:
    """Write the Sphinx sources of `found` into `source`."""
    shutil.rmtree(source, ignore_errors=True)
    for folder in ("course", "labs", "solutions", "downloads"):
        (source / folder).mkdir(parents=True)
    shutil.copy(REPO / "site" / "conf.py", source / "conf.py")
    (source / "index.md").write_text(index_page(found))
    for m in found:
        if m.lecture:
            shutil.copy(REPO / "course" / f"{m.lecture}.ipynb", source / "course")
        shutil.copy(REPO / "solutions" / m.lab / f"{m.lab}.ipynb", source / "solutions")
        shutil.copy(REPO / "labs" / m.lab / f"{m.lab}.ipynb", source / "downloads")
        (source / "labs" / f"{m.lab}.md").write_text(lab_page(m))


def build(found: list[Module], out: Path = OUT) -> Path:
    """Assemble and build the site of `found`; the path of its index.html."""
    source = out.with_name(out.name + "-src")
    assemble(found, source)
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "2",
                           "-D", "exclude_patterns=downloads/*", str(source), str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"site: sphinx-build failed:\n{done.stderr[-3000:]}")
    if done.stderr.strip():
        print(done.stderr.strip(), file=sys.stderr)
    return out / "index.html"


def main() -> None:
    start = time.monotonic()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    found = modules()
    index = build(found, out)
    print(f"site: {len(found)} modules built into {index} in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
