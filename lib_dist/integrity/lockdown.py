"""What the judge forbids in its own process once the student's answers may run there.

The judge (`judge`) runs the lab's tests in a process into which only the student's answers
were loaded, and sends each test's verdict to the grader signed with a key that no student code
may read. The answers run in the same process, so the judge closes the ways Python offers to
reach another function's state or to change code that is already running, with an audit hook
(PEP 578: a hook cannot be removed, and one that raises stops the operation):

- frames: a frame of the judge's own code or of a locked cell (whose locals hold what a test
  compares with) is not handed out by `sys._getframe`, a traceback's `tb_frame` or a
  generator's frame, and `sys._current_frames` not at all. The refusal is also a `ValueError`,
  which is what the standard library's own callers of `sys._getframe` (`namedtuple`,
  `typing`, `enum`, `logging`) expect when there is no frame to be had. Python 3.11 raises no
  audit event for a frame's `f_back`, so the judge replaces that attribute of the frame type
  with one that asks the hook, which alone holds the interpreter's own: walking up from a
  frame of one's own ends (None) where the judge's or a test's frames begin;
- the garbage collector's views of every object (`gc.get_objects`, `get_referrers`,
  `get_referents`), tracing and profiling hooks (`sys.settrace`, `sys.setprofile`), `ctypes`
  (which reads and writes memory), and `/proc/*/mem`;
- a function's `__code__`, written or deleted, for any function, and the `__defaults__` and
  `__kwdefaults__` of any function that existed when the judge locked down (torch's
  `assert_close` keeps its tolerances; `namedtuple` may still set those of what it makes);
- links (`os.symlink`, `os.link`), and opening any file named `mem` (`/proc/self/mem`,
  `/dev/mem`); the judge's process is also not dumpable, so no other process reads its memory.

Each refusal raises `Forbidden` in the student's code, whose test then fails. The judge reads
its own tracebacks with code the hook trusts by identity (`trusted`): no flag or function that
switches the hook off exists for a submission to find. What the guard (`guard`) watches, it still watches; this is
the floor under it.
"""

from __future__ import annotations

import builtins
import gc
import sys
import threading
import types
from collections.abc import Callable, Collection
from typing import Any

FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
F_BACK = "lib_dist.integrity.f_back"  # the event the frame type's f_back raises to ask the hook
DEFAULTS = frozenset({"__defaults__", "__kwdefaults__"})
ALWAYS = frozenset({"sys._current_frames", "gc.get_objects", "gc.get_referrers",
                    "gc.get_referents", "sys.settrace", "sys.setprofile", "os.symlink",
                    "os.link", "sys.addaudithook"})


class Forbidden(PermissionError, ValueError):
    """The student's code tried something the judge does not allow in its process."""


def lock_down(protected_files: Collection[str], trusted: Collection[types.CodeType]) -> None:
    """Install the judge's audit hook (see the module docstring). `protected_files`: the
    `co_filename`s of code whose frames are out of reach (the judge's modules and the locked
    cells' names, `<q1-test>`...); `trusted`: the code of the judge's own traceback readers,
    which may read those frames' code (`tb_frame`), and nothing a submission can rebind."""
    busy = threading.local()  # set while the hook runs on this thread; only the hook sees it
    existing = [f for f in gc.get_objects() if type(f) is types.FunctionType]  # kept alive
    original_f_back = _ask_the_hook_for_f_back()
    sys.addaudithook(_policy(frozenset(protected_files), busy, existing,
                             frozenset(id(code) for code in trusted), original_f_back))


def _ask_the_hook_for_f_back() -> Any:
    """Replace the frame type's `f_back` with a property that raises `F_BACK`; return the
    interpreter's own, which from then on only the hook holds."""
    import ctypes

    frame_dict = gc.get_referents(types.FrameType.__dict__)[0]  # the mappingproxy's dict
    original = frame_dict["f_back"]
    audit, list_ = sys.audit, list

    def f_back(frame: types.FrameType) -> types.FrameType | None:
        box: list[Any] = list_()
        audit(F_BACK, frame, box)
        return box[0] if box else None

    frame_dict["f_back"] = property(f_back, doc=original.__doc__)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(types.FrameType))
    return original


def _policy(protected: frozenset[str], busy: Any, existing: list[types.FunctionType],
            trusted: frozenset[int], original_f_back: Any
            ) -> Callable[[str, tuple[Any, ...]], None]:
    # What the hook calls is captured now: a submission may rebind builtins or `types` later.
    is_frame, decoded = types.FrameType.__instancecheck__, bytes.decode
    frame_type, list_, append, type_ = types.FrameType, list, list.append, builtins.type
    back_of, caller = original_f_back.__get__, sys._getframe
    getattr_, isinstance_, str_, bytes_ = builtins.getattr, builtins.isinstance, str, bytes
    function_type, forbidden = types.FunctionType, Forbidden
    always, frame_attributes, defaults = ALWAYS, FRAME_ATTRIBUTES, DEFAULTS
    id_, old_functions = builtins.id, frozenset(builtins.id(f) for f in existing)

    def protected_frame(frame: Any) -> bool:
        return is_frame(frame) and frame.f_code.co_filename in protected

    def refuse(what: str) -> None:
        raise forbidden(f"the judge does not allow {what} while a lab is graded: tests run "
                        f"in this process, so nothing here may reach into them")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if getattr_(busy, "on", False):
            return
        busy.on = True
        try:
            if event in always:
                refuse(event)
            elif event.startswith("ctypes."):
                refuse("ctypes")
            elif event == F_BACK:
                if len(args) == 2 and type_(args[0]) is frame_type and type_(args[1]) is list_:
                    back = back_of(args[0])
                    append(args[1], None if protected_frame(back) else back)
            elif event == "sys._getframe" and protected_frame(args[0]):
                refuse("sys._getframe into the judge's or a test's frame")
            elif event == "object.__getattr__" and args[1] in frame_attributes:
                # caller(1): the frame that asked (this hook's is 0), trusted by its code
                if (protected_frame(getattr_(args[0], args[1], None))
                        and id_(caller(1).f_code) not in trusted):
                    refuse(f"{args[1]} into the judge's or a test's frame")
            elif (event in ("object.__setattr__", "object.__delattr__")
                  and isinstance_(args[0], function_type)
                  and (args[1] == "__code__"
                       or (args[1] in defaults and id_(args[0]) in old_functions))):
                refuse(f"changing {args[1]} of {getattr_(args[0], '__qualname__', 'a function')}")
            elif event == "open" and isinstance_(args[0], (str_, bytes_)):
                path = decoded(args[0], "utf-8", "replace") if isinstance_(args[0], bytes_) \
                    else str_.__str__(args[0])
                if path.rstrip("/").rpartition("/")[2] == "mem":
                    refuse(f"opening {path}")
        finally:
            busy.on = False

    return hook


__all__ = ["Forbidden", "lock_down"]
