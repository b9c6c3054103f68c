"""Instructor tooling: nbgrader configuration and the grading CLI (`python -m grader`)."""
