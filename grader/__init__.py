"""Instructor tooling: nbgrader configuration and the grading CLI (to come)."""
