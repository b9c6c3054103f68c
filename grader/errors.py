"""Errors the grader reports to the instructor."""


class GradingError(RuntimeError):
    """Bad input from the instructor: the message names the file and what to do."""
