"""The concrete read models, one module each, and the registry the projector loads (``ALL``).

This package depends on ``loopd_es``, never the reverse: ``loopd-es project`` finds it by name
(:func:`loopd_es.projector.load_registry`). To add a read model, write a module with a class that has
``name``, ``version``, ``schema``, ``apply`` and ``reset`` (see :class:`loopd_es.projector.Projection`) and
add it to ``_MODELS`` below (its place there is its place in ``ALL``).

The query commands (``loopd-es goals``, ``goal show``, ``commands``, ``identities``) read the tables of
``goals``, ``runs``, ``identities``, ``provider_limits``, ``commands`` and ``awaits``; ``history`` and
``explain`` find a goal's streams through ``goal_links``, which they get from :func:`projection_named`
without importing the other read models (start-up time matters for a CLI that agents call many times).
``ALL`` and the classes are therefore imported on first use (a module ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from loopd_es.projector import Projection

    from .awaits import Awaits as Awaits
    from .commands import Commands as Commands
    from .goal_links import GoalLinks as GoalLinks
    from .goals import Goals as Goals
    from .identities import Identities as Identities
    from .loops import Loops as Loops
    from .notifications import Notifications as Notifications
    from .provider_limits import ProviderLimits as ProviderLimits
    from .runs import Runs as Runs
    from .stream_stats import StreamStats as StreamStats

    ALL: list[Projection]

_MODELS: Final[tuple[tuple[str, str, str], ...]] = (
    # (projection name, module, class), in the order of ALL
    ("stream_stats", "stream_stats", "StreamStats"),
    ("goals", "goals", "Goals"),
    ("runs", "runs", "Runs"),
    ("identities", "identities", "Identities"),
    ("provider_limits", "provider_limits", "ProviderLimits"),
    ("commands", "commands", "Commands"),
    ("awaits", "awaits", "Awaits"),
    ("goal_links", "goal_links", "GoalLinks"),
    ("notifications", "notifications", "Notifications"),
    ("loops", "loops", "Loops"),
)
_CLASSES: Final = {cls: module for _, module, cls in _MODELS}
_INSTANCES: dict[str, Projection] = {}

__all__ = (
    "ALL",
    "Awaits",
    "Commands",
    "GoalLinks",
    "Goals",
    "Identities",
    "Notifications",
    "Loops",
    "ProviderLimits",
    "Runs",
    "StreamStats",
)


def projection_named(name: str) -> Projection | None:
    """The instance of ``ALL`` called ``name`` (``None`` if there is none), importing only its module."""
    found = _INSTANCES.get(name)
    if found is None:
        for model, module, cls in _MODELS:
            if model == name:
                found = _INSTANCES[name] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)()
                break
    return found


def __getattr__(name: str) -> Any:
    if name == "ALL":
        value: Any = [projection_named(model) for model, _, _ in _MODELS]
    elif name in _CLASSES:
        value = getattr(importlib.import_module(f"{__name__}.{_CLASSES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
