"""loopd-es: an event-sourced engine for background AI work.

Every goal, command and identity change is an event on an append-only log (NDJSON or SQLite);
current state is folded from events by pure reducers.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of `--help`); mypy knows the name

if TYPE_CHECKING:
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

_EXPORTS = {
    "ConflictError": "errors",
    "CorruptLogError": "errors",
    "DomainError": "errors",
    "LoopdError": "errors",
    "StorageError": "errors",
    "UsageError": "errors",
    "WrongExpectedVersionError": "errors",
    "ANY": "events.envelope",
    "EXISTS": "events.envelope",
    "NO_STREAM": "events.envelope",
    "Envelope": "events.envelope",
    "NewEvent": "events.envelope",
    "LogStore": "log",
    "open_store": "log",
}


def __getattr__(name: str) -> object:
    """The re-exports and ``__version__``, imported on first use rather than with the package: every
    ``loopd-es`` command imports ``loopd_es``, and ``--help`` needs neither msgspec nor the log (a third of
    its start-up time)."""
    if name == "__version__":
        from .version import version

        return version()
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    globals()[name] = found = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    return found


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("_"))})


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
