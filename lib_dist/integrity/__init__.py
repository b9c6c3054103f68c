"""Lab integrity: a graded result comes from the student's own code, compared with oracles the
student's code did not touch.

Three mechanisms, all switched on by the grader and none needed by students:
- `stubs`: while a lab is graded, lib_dist's own version of each thing the lab asks students to
  write (declared once, in `lib_dist.extend.LABS`) raises `AskedToWrite`, in the kernel and on
  every engine. A new lab gets this by declaring its names there.
- `guard`: locked cells run in a namespace of their own that sees only the lab's declared
  answers, and any change to torch, builtins, numpy, lib_dist or the lab's helpers made while
  a test runs fails that test with a message naming what changed.
- `oracles`: what the tests compare an answer with (declared in `LABS` too) refuses to be built
  or called from inside the student's answers, in the kernel and on every engine, and works as
  before for the tests.
"""

from .stubs import GRADED_LAB, AskedToWrite, switch_off_references

__all__ = ["GRADED_LAB", "AskedToWrite", "switch_off_references"]
