"""Names of objects as the labs' tables write them: "package.module:Qual.name".

`lib_dist.labs.LABS` names oracles this way, `lib_dist.registry.HOMES` the references a
student's answer replaces; both the registry and the judge's guard turn such a name into the
object with `lookup`, which imports the module on the way.
"""

from __future__ import annotations

import importlib
from typing import Any


def lookup(reference: str) -> Any:
    """The object named by "package.module:Qual.name" (the module imported if need be)."""
    module_name, _, qualname = reference.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
