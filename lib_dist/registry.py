"""Students' answers as what lib_dist uses: a registry of their implementations.

A student who has written lab03's `ring_all_reduce` and lab04's `ShardSampler` and
`DataParallel` can make them what lib_dist runs on, from then on, in that process:

    from lib_dist.registry import use_my_answers
    use_my_answers("~/labs")              # <folder>/<lab>/<lab>.ipynb, or <folder>/<lab>.ipynb
    comm.all_reduce(t, "sum", algorithm="mine")      # lab03's ring_all_reduce runs
    from lib_dist.data_parallel import DataParallel  # lab04's DataParallel, not lib_dist's

`use_my_answers` loads each answer with `lib_dist.definitions` (nothing else of the notebook
runs) and registers it: `ring_all_reduce` as the all-reduce algorithm named "mine" (and
"ring_all_reduce"), which every communicator's `all_reduce(..., algorithm=...)` accepts beside
lib_dist's own (`lib_dist.comm.algorithms.ALGORITHMS`); a class or function as the
implementation of its name, which `implementation(name)` returns (lib_dist's reference where
none is registered) and which replaces lib_dist's in the modules that export it (`HOMES`: a
later `from lib_dist.data_parallel import DataParallel`, as modules 07 and 09 do, gets it;
lab05's `split_model` and `one_f_one_b_step` and lab06's `ParallelMLP` and `ParallelAttention`
likewise, which module 6's `ParallelBlock` is built of).
A missing answer (no notebook, the name undefined or unanswered) raises `MissingAnswer`, naming
the lab and the notebook that writes it. `forget()` undoes it all.

A later lab takes the earlier answers it builds on with `earlier_answers("..", *names)`: lib_dist's
reference, or the student's where registered; in the student edition (`lib_dist/integrity/
edition.py`: STUDENT), which has no reference, the student's own, loaded from their notebooks.

The grader's judge registers a student's earlier answers the same way, with `register`, when
the instructor grades with `python -m grader autograde --own-answers` (`Lab.uses` in
`lib_dist.extend.LABS`); there `prefer_all_reduce` makes the student's ring the default of
`Communicator.all_reduce` too. Nothing here is rebound after import: the registry's tables are
changed in place (the judge's guard watches which object every module name is bound to).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .references import lookup

# what use_my_answers registers by default: name -> the reference, as "module:qualname"
HOMES: dict[str, str] = {
    "ring_all_reduce": "lib_dist.comm.algorithms:ring",
    "ShardSampler": "lib_dist.data_parallel:ShardSampler",
    "DataParallel": "lib_dist.data_parallel:DataParallel",
    "split_model": "lib_dist.pipeline:split_model",
    "one_f_one_b_step": "lib_dist.pipeline:one_f_one_b_step",
    "ParallelMLP": "lib_dist.tensor_parallel:ParallelMLP",
    "ParallelAttention": "lib_dist.tensor_parallel:ParallelAttention",
}
MINE = "mine"  # the name of the student's all-reduce among the algorithms
ALL_REDUCE_ANSWERS = ("ring_all_reduce",)  # answers that are all-reduce algorithms

AllReduceFn = Callable[[Any, Any, str], Any]  # (comm, tensor, op) -> tensor, in place

_implementations: dict[str, Any] = {}  # name -> the student's
_algorithms: dict[str, AllReduceFn] = {}  # algorithm name -> (comm, tensor, op)
_preferred: list[str] = []  # the default all-reduce algorithm, when one is set
_rebound: dict[str, Any] = {}  # "module:attr" -> what it was before use_my_answers


class MissingAnswer(LookupError):
    """An answer lib_dist was asked to use is not there: names the lab that writes it."""


def lab_of(name: str) -> str:
    """The first lab (`lib_dist.extend.LABS`) that asks students to write `name`."""
    from .extend import LABS

    for lab, spec in LABS.items():
        if name in spec.asks:
            return lab
    raise KeyError(f"no lab asks for {name!r}")


def register(name: str, value: Any) -> None:
    """Make `value` the implementation of `name` in this process; an all-reduce answer
    (`ring_all_reduce`) becomes the algorithms "mine" and `name` as well."""
    _implementations[name] = value
    if name in ALL_REDUCE_ANSWERS:
        register_all_reduce(MINE, value)
        register_all_reduce(name, value)


def register_all_reduce(name: str, fn: AllReduceFn) -> None:
    """`fn(comm, tensor, op)` becomes selectable as `comm.all_reduce(t, op, algorithm=name)`."""
    from .comm.algorithms import ALGORITHMS

    if name in ALGORITHMS or name in ("auto", "native", "shared_memory"):
        raise ValueError(f"{name!r} is one of lib_dist's own all-reduce algorithms; register "
                         f"yours under another name")
    _algorithms[name] = fn


def prefer_all_reduce(name: str | None) -> None:
    """Make the registered algorithm `name` what `Communicator.all_reduce` runs when no
    algorithm is named (None: lib_dist's default again)."""
    if name is not None and name not in _algorithms:
        raise KeyError(f"no all-reduce registered as {name!r} (registered: "
                       f"{', '.join(sorted(_algorithms)) or 'none'})")
    _preferred[:] = [name] if name else []


def all_reduce_algorithm(name: str) -> AllReduceFn | None:
    """The registered all-reduce `name`, or None."""
    return _algorithms.get(name)


def registered_all_reduces() -> list[str]:
    """The names of the registered all-reduce algorithms."""
    return sorted(_algorithms)


def preferred_all_reduce() -> str | None:
    """The registered algorithm `Communicator.all_reduce` runs by default, if any."""
    return _preferred[0] if _preferred else None


def unknown_algorithm(name: str, own: Iterable[str]) -> ValueError:
    """The error for an all-reduce algorithm nobody knows, listing the known ones."""
    known = [*own, *registered_all_reduces()]
    return ValueError(f"unknown all-reduce algorithm {name!r}; known: {', '.join(known)}"
                      + ("" if _algorithms else f" (and {MINE!r} once "
                         f"lib_dist.registry.use_my_answers has loaded lab03's ring_all_reduce)"))


def implementation(name: str) -> Any:
    """The student's registered `name`, else lib_dist's reference (`HOMES`)."""
    if name in _implementations:
        return _implementations[name]
    if name not in HOMES:
        raise MissingAnswer(f"no implementation of {name!r} is registered, and lib_dist has "
                            f"no reference of it (its references: {', '.join(sorted(HOMES))})")
    return lookup(HOMES[name])


def is_registered(name: str) -> bool:
    """Whether the student's `name` is registered."""
    return name in _implementations


def notebook_for(lab: str, where: str | Path | Iterable[str | Path]) -> Path | None:
    """The notebook of `lab` in `where`: a folder holding <lab>/<lab>.ipynb or <lab>.ipynb, or
    a list of notebook paths (matched by file name)."""
    if isinstance(where, (str, Path)):
        folder = Path(where).expanduser()
        if folder.is_file() and folder.stem == lab:
            return folder
        for path in (folder / lab / f"{lab}.ipynb", folder / f"{lab}.ipynb"):
            if path.is_file():
                return path
        return None
    for item in where:
        found = notebook_for(lab, item)
        if found is not None:
            return found
    return None


def _from_notebook(lab: str, wanted: list[str], where: str | Path | Iterable[str | Path]
                   ) -> dict[str, Any]:
    """`wanted`, names of `lab`, as the student's notebook of it in `where` defines them, loaded
    together; `MissingAnswer` if the notebook or an answer is not there."""
    from .definitions import definitions

    said = ", ".join(wanted) + (" is" if len(wanted) == 1 else " are")
    notebook = notebook_for(lab, where)
    if notebook is None:
        raise MissingAnswer(f"{said} written in {lab} ({lab}/{lab}.ipynb), and {where} holds "
                            f"no {lab}.ipynb: do {lab} first, or point use_my_answers at it")
    try:
        found = definitions(notebook, *wanted)
    except LookupError as e:
        raise MissingAnswer(f"{said} written in {lab} ({notebook}), which does not answer "
                            f"it yet: {e}") from None
    return {name: found[name] for name in wanted}


def earlier_answers(where: str | Path | Iterable[str | Path], *names: str) -> tuple[Any, ...]:
    """What a lab runs for `names`, earlier labs' answers it builds on, in order: the student's
    where registered (`use_my_answers`, or the judge's `--own-answers`), else lib_dist's
    reference; in the student edition, which has none, the student's own from their notebooks
    in `where`, registered from then on (`MissingAnswer` names the lab still to do)."""
    from .integrity.edition import STUDENT

    missing = [name for name in names if name not in _implementations]
    if STUDENT and missing:
        use_my_answers(where, *missing)
    return tuple(implementation(name) for name in names)


def load_answers(names: Iterable[str], where: str | Path | Iterable[str | Path]
                 ) -> dict[str, Any]:
    """`names` as the student's lab notebooks in `where` define them, each lab's names loaded
    together (so that lab06's ParallelAttention and ParallelMLP share its ColumnParallelLinear)."""
    by_lab: dict[str, list[str]] = {}
    for name in names:
        by_lab.setdefault(lab_of(name), []).append(name)
    loaded: dict[str, Any] = {}
    for lab, wanted in by_lab.items():
        loaded.update(_from_notebook(lab, wanted, where))
    return loaded


def use_my_answers(where: str | Path | Iterable[str | Path], *names: str,
                   default_all_reduce: bool = False) -> dict[str, Any]:
    """Load `names` (default: every name of `HOMES`) from the student's lab notebooks in
    `where` and make them what lib_dist uses from now on in this process (module docstring).
    All are loaded before any is registered: a `MissingAnswer` leaves lib_dist as it was.
    `default_all_reduce`: the student's ring also becomes `all_reduce`'s default."""
    loaded = load_answers(names or tuple(HOMES), where)
    for name, value in loaded.items():
        register(name, value)
        if name in HOMES and name not in ALL_REDUCE_ANSWERS:
            reference = HOMES[name]
            _rebound.setdefault(name, lookup(reference))
            module, _, attr = reference.partition(":")
            setattr(importlib.import_module(module), attr, value)
    if default_all_reduce and "ring_all_reduce" in loaded:
        prefer_all_reduce(MINE)
    return loaded


def forget() -> None:
    """Undo `register` and `use_my_answers`: lib_dist's references everywhere again."""
    for name, value in _rebound.items():
        module, _, attr = HOMES[name].partition(":")
        setattr(importlib.import_module(module), attr, value)
    _rebound.clear()
    _implementations.clear()
    _algorithms.clear()
    _preferred.clear()





__all__ = ["HOMES", "MINE", "MissingAnswer", "all_reduce_algorithm", "earlier_answers", "forget",
           "implementation", "is_registered", "lab_of", "load_answers",
           "notebook_for", "prefer_all_reduce",
           "register", "register_all_reduce", "registered_all_reduces", "use_my_answers"]
