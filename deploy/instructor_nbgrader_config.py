"""nbgrader's settings for the instructor's course folder on the hub: copy it there as nbgrader_config.py.

The folder is laid out as the grader's (`grader.course`): solutions/ (nbgrader's source),
labs/ (the release), instructor/ (submitted, autograded, feedback, gradebook.db). nbgrader's
own commands run in it (release_assignment, collect, release_feedback), and so does the grader:
`python -m grader --root . release | autograde instructor/submitted | feedback`."""

from pathlib import Path

from grader.course import Course, put_own_scripts_on_path

c = get_config()  # noqa: F821 - Jupyter's config loader defines it
c.merge(Course(Path(__file__).resolve().parent).config())
put_own_scripts_on_path()
