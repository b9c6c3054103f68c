"""Lab integrity: a graded result comes from the student's own code, compared with oracles the
student's code did not touch, and judged where the student's code cannot reach the verdict.

Switched on by the grader, none of it needed by students:
- `judge`: the process a graded lab's tests run in (started by `grader.judge`), into which only
  the student's answers are loaded; it signs each test's verdict with a key no student code
  sees, and `lockdown` closes the interpreter's ways into its frames and code.
- `stubs` and `edition`: lib_dist's own version of each thing the lab asks students to write
  (declared once, in `lib_dist.extend.LABS`) raises `AskedToWrite`; the grader's judged edition
  of lib_dist carries no body for them at all. A new lab gets this by declaring its names there.
- `guard` (with `answers`, `snapshot` and `seal`): locked cells run in a namespace of their own
  that sees only the lab's declared answers, and any change to torch, builtins, numpy, lib_dist
  or the lab's helpers made while a test runs fails that test with a message naming what
  changed; what answers return must be plain data.
- `oracles`: what the tests compare an answer with (declared in `LABS` too) refuses to be built
  or called from inside the student's answers, in the judge and on every engine, and works as
  before for the tests.
"""

from .stubs import GRADED_LAB, AskedToWrite, switch_off_references

__all__ = ["GRADED_LAB", "AskedToWrite", "switch_off_references"]
