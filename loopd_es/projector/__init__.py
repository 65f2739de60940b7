"""Read-model machinery: catch-up and live tail of the log into a SQLite read database.

The concrete read models live in the top-level ``projections`` package, which depends on this one and
never the reverse; :func:`load_registry` finds them by module name at run time. This is the only package
that imports watchfiles.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..errors import UsageError
from .base import BatchProjection as BatchProjection
from .base import Projection as Projection
from .base import ProjectionError as ProjectionError
from .base import UnknownProjectionError as UnknownProjectionError
from .paths import default_read_db as default_read_db

if TYPE_CHECKING:
    from .readdb import BatchResult as BatchResult
    from .readdb import ProjectionStatus as ProjectionStatus
    from .runner import Projector as Projector

DEFAULT_REGISTRY = "projections"

_LAZY: Final = {"BatchResult": "readdb", "ProjectionStatus": "readdb", "Projector": "runner"}
"""Re-exports imported on first use: a command that only reads a read model (``history``) need not load
the projector's machinery."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def load_registry(module: str = DEFAULT_REGISTRY) -> Sequence[Projection]:
    """The ``ALL`` list of the registry module (``projections`` by default).

    :raises UsageError: when the module cannot be imported or has no ``ALL`` list of projections.
    """
    try:
        found = importlib.import_module(module)
    except (
        ModuleNotFoundError,
        ValueError,
        TypeError,
    ) as e:  # '' and '.x' are ValueErrors, not missing modules
        raise UsageError(f"cannot import the projection registry {module!r}: {e}") from e
    registry = getattr(found, "ALL", None)
    if not isinstance(registry, list | tuple) or not all(isinstance(p, Projection) for p in registry):
        raise UsageError(f"{module}.ALL must be a list of projections (name, version, schema, apply, reset)")
    return list(registry)


__all__ = (
    "DEFAULT_REGISTRY",
    "BatchProjection",
    "BatchResult",
    "Projection",
    "ProjectionError",
    "ProjectionStatus",
    "Projector",
    "UnknownProjectionError",
    "default_read_db",
    "load_registry",
)
