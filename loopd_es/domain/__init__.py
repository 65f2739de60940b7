"""The pure core: goal state, ``evolve`` (fold) and ``decide`` (rules); no I/O, no anyio, no log.

Reading a log and the snapshot files to fold it is :mod:`loopd_es.replay`'s job; the folds it feeds live here
(:mod:`.evolve`, :mod:`.reducers`).

The re-exports below are resolved on first use (a module ``__getattr__``): importing any submodule, such as
:mod:`.evolve` for a fold, runs this file, and a fold must not pay for importing the rules of ``decide``
(start-up time matters for a CLI that agents call many times).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .decide import decide as decide
    from .evolve import evolve as evolve
    from .evolve import fold as fold
    from .evolve import initial as initial
    from .state import REDUCER_VERSION as REDUCER_VERSION
    from .state import GoalState as GoalState

_EXPORTS: Final[dict[str, str]] = {
    "decide": "decide",
    "evolve": "evolve",
    "fold": "evolve",
    "initial": "evolve",
    "REDUCER_VERSION": "state",
    "GoalState": "state",
}

__all__ = ("REDUCER_VERSION", "GoalState", "decide", "evolve", "fold", "initial")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(ModuleType):
    """This package, keeping ``decide`` and ``evolve`` the functions once their modules are imported.

    The import system binds a submodule to its package's attribute of the same name after running it; here
    the function of that name wins, as it did when this file imported them eagerly.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
