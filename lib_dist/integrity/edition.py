"""The lab this copy of lib_dist is judged for: None here, in the instructor's edition.

The grader's judged edition of lib_dist (`grader.edition`) names its lab here, so that lib_dist
guards that lab's oracles wherever it is imported in a graded sandbox (the judge, its engines).
"""

LAB: str | None = None
STUDENT = False  # True in the student edition: no lab's references in it at all
