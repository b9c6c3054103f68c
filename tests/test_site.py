"""`make site`: the course website, built from the stored notebooks and read in a browser.

The site is built once (site/build.py, as `make site` does) into a temporary folder; every
page's links are followed on disk, and headless Chromium opens each module's lecture, lab and
solution pages: their figures load, the numbers the notebooks stored are on the page (the site
shows the stored outputs, it does not execute anything), and each lab's student notebook can
be downloaded and is the release (no solution in it).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from browser import chromium, served

REPO = Path(__file__).resolve().parent.parent


def load_site_build():
    """site/build.py as a module (the site's folder is no package, and a module named `build`
    on sys.path would shadow PyPI's)."""
    spec = importlib.util.spec_from_file_location("site_build", REPO / "site" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


site = load_site_build()

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.browser]
MODULES = site.modules()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run([sys.executable, str(REPO / "site" / "build.py"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(MODULES)} modules built" in done.stdout
    return out


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [v for k, v in attrs if k in ("href", "src") and v]


def local_targets(page: Path) -> list[str]:
    parser = Links()
    parser.feed(page.read_text())
    return [link for link in parser.found
            if not urlsplit(link).scheme and not link.startswith(("#", "//", "mailto:"))]


def test_every_module_has_a_lecture_a_lab_and_a_solution_page(built):
    assert [m.number for m in MODULES] == [f"{i:02d}" for i in range(len(MODULES))]
    assert len(MODULES) >= 9
    for m in MODULES:
        pages = [f"labs/{m.lab}.html", f"solutions/{m.lab}.html"]
        pages += [f"course/{m.lecture}.html"] if m.lecture else []
        for page in pages:
            assert (built / page).is_file(), f"module {m.number}: no {page}"
    index = (built / "index.html").read_text()
    for m in MODULES:  # the table of contents, module by module
        assert site.title(m) in index, f"the index has no section for module {m.number}"


def test_no_page_links_to_a_missing_file(built):
    pages = sorted(built.rglob("*.html"))
    assert len(pages) > 3 * len(MODULES) - 2
    missing = []
    for page in pages:
        for link in local_targets(page):
            target = (page.parent / unquote(urlsplit(link).path)).resolve()
            if not target.exists():
                missing.append(f"{page.relative_to(built)} -> {link}")
    assert not missing, "links to missing files:\n" + "\n".join(missing[:20])


def image_outputs(notebook: Path) -> int:
    nb = nbformat.read(notebook, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)


def first_printed_line(notebook: Path) -> str:
    """A line a cell printed when the notebook was executed and stored."""
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                lines = [line.strip() for line in output["text"].splitlines() if line.strip()]
                if lines and any(ch.isdigit() for ch in lines[0]):
                    return lines[0]
    return ""


@pytest.mark.parametrize("module", [m for m in MODULES if m.lecture], ids=lambda m: m.number)
def test_a_lecture_page_shows_its_figures_and_stored_numbers(built, browser, module, tmp_path):
    notebook = REPO / "course" / f"{module.lecture}.ipynb"
    with served(built) as base:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(f"{base}/course/{module.lecture}.html", wait_until="load")
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.getAttribute('src'), e.complete && e.naturalWidth])")
        text = page.inner_text("body")
        page.screenshot(path=str(tmp_path / f"{module.lecture}.png"))
        page.close()
    expected = image_outputs(notebook)
    assert expected > 0, f"{notebook.name} stores no figure"
    assert len(images) >= expected, f"{len(images)} images on the page, {expected} stored"
    broken = [src for src, width in images if not width]
    assert not broken, f"figures that did not load: {broken}"
    line = first_printed_line(notebook)
    assert line and " ".join(line.split()) in " ".join(text.split()), (
        f"{module.lecture}: the page does not show the stored output {line!r}")


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.lab)
def test_a_lab_page_links_the_student_notebook_and_the_solution(built, browser, module):
    with served(built) as base:
        page = browser.new_page()
        page.goto(f"{base}/labs/{module.lab}.html", wait_until="load")
        download = page.get_attribute("a.download", "href")
        assert download and download.endswith(f"{module.lab}.ipynb"), download
        response = page.request.get(page.url.rsplit("/", 1)[0] + "/" + download)
        assert response.status == 200
        nb = json.loads(response.body())
        page.click(f"text={module.lab} solved")
        page.wait_for_load_state("load")
        assert page.url.endswith(f"/solutions/{module.lab}.html")
        solved_text = page.inner_text("body")
        page.close()
    sources = ["".join(c["source"]) for c in nb["cells"]]
    assert any(c["metadata"].get("nbgrader") for c in nb["cells"])
    assert not any("### BEGIN SOLUTION" in s for s in sources), "the download holds the solution"
    assert json.loads((REPO / "labs" / module.lab / f"{module.lab}.ipynb").read_text()) == nb
    solution = REPO / "solutions" / module.lab / f"{module.lab}.ipynb"
    line = first_printed_line(solution)
    if line:
        assert " ".join(line.split()) in " ".join(solved_text.split())
