"""loopd-es: an event-sourced engine for background AI work.

Every goal, command and identity change is an event on an append-only log (NDJSON or SQLite);
current state is folded from events by pure reducers.
"""

from __future__ import annotations

from .errors import ConflictError as ConflictError
from .errors import CorruptLogError as CorruptLogError
from .errors import DomainError as DomainError
from .errors import LoopdError as LoopdError
from .errors import StorageError as StorageError
from .errors import UsageError as UsageError
from .errors import WrongExpectedVersionError as WrongExpectedVersionError
from .events.envelope import ANY as ANY
from .events.envelope import EXISTS as EXISTS
from .events.envelope import NO_STREAM as NO_STREAM
from .events.envelope import Envelope as Envelope
from .events.envelope import NewEvent as NewEvent
from .log import LogStore as LogStore
from .log import open_store as open_store


def __getattr__(name: str) -> str:
    """``__version__``, from the installed package's metadata (:mod:`loopd_es.version`), looked up on first
    use rather than on every import: the CLI's start-up time matters."""
    if name == "__version__":
        from .version import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = (
    "ANY",
    "EXISTS",
    "NO_STREAM",
    "ConflictError",
    "CorruptLogError",
    "DomainError",
    "Envelope",
    "LogStore",
    "LoopdError",
    "NewEvent",
    "StorageError",
    "UsageError",
    "WrongExpectedVersionError",
    "__version__",
    "open_store",
)
