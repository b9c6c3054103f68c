"""lib_dist: the library behind the course on training large models across many devices.

Students program against `lib_dist.comm.Communicator`; `lib_dist.cluster.Cluster` hosts
one rank of a torch.distributed group on each ipyparallel engine. Single-device training lives
in `losses`, `models`, `data`, `optim` and `train`; `lib_dist.extend` lists every extension
point and what each lab asks students to write, and `lib_dist.definitions` loads a student's
definitions from their notebooks. `lib_dist.integrity` keeps graded runs honest.
"""

import os as _os

__version__ = "0.1.0"

from .integrity.edition import LAB as _JUDGED_LAB

_graded = _JUDGED_LAB or _os.environ.get("LIB_DIST_GRADED_LAB")
if _graded:  # in a judged edition's processes (grader.edition), or where a test asks for it
    from .integrity.oracles import guard_oracles as _guard_oracles
    from .integrity.stubs import switch_off_references as _switch_off

    _switch_off(_graded)  # what the lab asks for: switched off (the edition has no body left)
    _guard_oracles(_graded)  # what it is compared with: not inside answers
