"""The course directory and its nbgrader configuration: the repository is the course.

    solutions/<lab>/<lab>.ipynb   nbgrader's source: solutions and hidden tests
    labs/<lab>/<lab>.ipynb        nbgrader's release, what students get
    instructor/                   submitted/, autograded/, feedback/, reports, gradebook.db
                                  (ignored by git: student work never enters the repository)

Submissions run in a sandbox (`grader.sandbox`) unless `sandbox=False`.

The gradebook is nbgrader's SQLite file in `instructor/` unless `db_url` (or the environment
variable LIB_DIST_GRADEBOOK) names another SQLAlchemy URL, such as a PostgreSQL database that
several graders share: `postgresql://user:password@host/gradebook`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.apps import NbGraderAPI
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput,
                                    DeduplicateIds, GetGrades, LimitOutput, OverwriteCells,
                                    OverwriteKernelspec, SaveAutoGrades)
from traitlets.config import Config

from .execute import GradedExecute, TestStderrIsNotAFailure
from .integrity import ForgetForeignCells, RestoreLockedCells
from .redact import RedactHiddenTests
from .sandbox import Limits

REPO = Path(__file__).resolve().parent.parent
WORK = "instructor"
CELL_TIMEOUT = 120  # seconds per cell; nbgrader's default (30) is too short for a cluster


@dataclass
class Course:
    """A course directory laid out as above. `root` defaults to this repository."""

    root: Path = REPO
    db_url: str | None = None
    cell_timeout: int = CELL_TIMEOUT
    sandbox: bool = True
    judged: bool = True  # False: the notebook's own run gives the verdicts (benchmarks only)
    own_answers: bool = False  # True: later labs run on the student's earlier answers (Lab.uses)
    limits: Limits = Limits()
    course_id: str = "lib_dist"
    _api: NbGraderAPI | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.db_url = (self.db_url or os.environ.get("LIB_DIST_GRADEBOOK")
                       or f"sqlite:///{self.work / 'gradebook.db'}")

    @property
    def work(self) -> Path:
        return self.root / WORK

    @property
    def solutions(self) -> Path:
        return self.root / "solutions"

    @property
    def labs(self) -> Path:
        return self.root / "labs"

    @property
    def student_edition(self) -> Path:
        """Where `release` builds the student edition of lib_dist (`grader.edition`)."""
        return self.labs / "student_edition"

    @property
    def lecture_edition(self) -> Path:
        """Where `release` puts the lecture edition of lib_dist (`grader.lectures`)."""
        return self.labs / "lecture_edition"

    def lab_names(self) -> list[str]:
        """Every lab: a folder of solutions/ holding a notebook of the same name."""
        return sorted(p.parent.name for p in self.solutions.glob("*/*.ipynb")
                      if p.stem == p.parent.name)

    def source_notebook(self, lab: str) -> Path:
        return self.solutions / lab / f"{lab}.ipynb"

    def released_notebook(self, lab: str) -> Path:
        return self.labs / lab / f"{lab}.ipynb"

    def submitted_notebook(self, lab: str, student: str) -> Path:
        return self.work / "submitted" / student / lab / f"{lab}.ipynb"

    def autograded_notebook(self, lab: str, student: str) -> Path:
        return self.work / "autograded" / student / lab / f"{lab}.ipynb"

    def check_lab(self, lab: str) -> None:
        if lab not in self.lab_names():
            known = ", ".join(self.lab_names()) or "none"
            raise ValueError(f"unknown lab {lab!r}: no notebook {self.source_notebook(lab)} "
                             f"(labs in {self.solutions}: {known})")

    def config(self) -> Config:
        c = Config()
        c.CourseDirectory.root = str(self.root)
        c.CourseDirectory.course_id = self.course_id
        c.CourseDirectory.source_directory = "solutions"
        c.CourseDirectory.release_directory = "labs"
        for step in ("submitted", "autograded", "feedback"):
            setattr(c.CourseDirectory, f"{step}_directory", f"{WORK}/{step}")
        c.CourseDirectory.db_url = self.db_url
        c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "build"]
        c.RestoreLockedCells.release = str(self.labs)  # a deleted test is graded as shipped
        c.GradedExecute.release = str(self.labs)
        c.GradedExecute.editions = str(self.work / "editions")
        c.Execute.timeout = self.cell_timeout
        c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:", "--log-level=ERROR"]
        c.GradedExecute.sandbox = self.sandbox
        c.GradedExecute.judged = self.judged
        c.GradedExecute.own_answers = self.own_answers
        c.SandboxedKernelManager.hidden = sorted({str(self.root), str(REPO)})
        for name, value in asdict(self.limits).items():
            setattr(c.SandboxedKernelManager, name, value)
        c.Autograde.sanitize_preprocessors = [
            ClearOutput, DeduplicateIds, OverwriteKernelspec, ForgetForeignCells,
            RestoreLockedCells, OverwriteCells, CheckCellMetadata]
        c.Autograde.autograde_preprocessors = [
            GradedExecute, TestStderrIsNotAFailure, ClearMetadataPreprocessor, LimitOutput,
            SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
        c.GenerateFeedback.preprocessors = [RedactHiddenTests, GetGrades,
                                            CSSHTMLHeaderPreprocessor]
        c.RedactHiddenTests.solutions = str(self.solutions)
        return c

    def api(self) -> NbGraderAPI:
        if self._api is None:
            self.work.mkdir(parents=True, exist_ok=True)
            put_own_scripts_on_path()
            self._api = NbGraderAPI(config=self.config())
        return self._api


def put_own_scripts_on_path() -> None:
    """nbgrader runs `alembic` by name when it creates a gradebook: find ours, venv or not."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
