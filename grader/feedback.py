"""HTML feedback per student: scores, outputs and errors, never the code of a hidden test."""

from __future__ import annotations

from pathlib import Path

from .course import Course
from .errors import GradingError


def generate(course: Course, lab: str, students: list[str] | None = None) -> list[Path]:
    """Write instructor/feedback/<student>/<lab>/<lab>.html for the autograded students."""
    course.check_lab(lab)
    graded = sorted(p.parent.parent.name for p in
                    (course.work / "autograded").glob(f"*/{lab}/{lab}.ipynb"))
    students = students or graded
    missing = sorted(set(students) - set(graded))
    if missing:
        raise GradingError(f"no autograded {lab} for {', '.join(missing)}: run autograde first")
    api = course.api()
    written = []
    for student in students:
        result = api.generate_feedback(lab, student, force=True)
        if not result["success"]:
            raise GradingError(f"feedback for {student}/{lab} failed:\n{result.get('error', '')}")
        written.append(course.work / "feedback" / student / lab / f"{lab}.html")
    return written
