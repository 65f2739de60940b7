"""One error root, one family per layer, one exit code per family.

Every message says what was wrong, what was expected and where, and what to do about it,
because the CLI prints it as a single line on stderr and exits with the family's code:

====  =========================================================================
code  meaning
====  =========================================================================
0     success
1     an unexpected internal error (a bug: please report it with ``--verbose``)
2     bad usage or invalid input (JSON, option, expected version, missing stream, invalid event)
3     a conflict: wrong expected version, a reused event id, a domain rule violated
4     a storage problem: corrupt or torn log, unwritable path, lock timeout
====  =========================================================================
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: `loopd-es --help` loads this module and does without typing
if TYPE_CHECKING:
    from typing import ClassVar

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_STORAGE = 4


class LoopdError(Exception):
    """Raised for every failure loopd-es expects and can explain; the root of all our errors."""

    exit_code: ClassVar[int] = EXIT_INTERNAL
    hint: ClassVar[str] = ""
    """What to do next, added by the CLI after a message that must stay word for word (the reference's)."""


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error a task group failed with, as one task would raise it: its first :class:`LoopdError` (which says
    what to do), else its first error, however deeply groups nest."""
    chosen = group.subgroup(lambda e: isinstance(e, LoopdError)) or group
    error: BaseException = chosen
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


# -- usage / input (exit 2) -----------------------------------------------------------------------


class UsageError(LoopdError):
    """Raised when an argument or an input document is invalid; nothing was changed."""

    exit_code: ClassVar[int] = EXIT_USAGE


class StreamNotFoundError(UsageError):
    """Raised when a stream that must exist has no events."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        super().__init__(
            f"stream {stream!r} does not exist; `loopd-es streams` lists the streams in this log"
        )


class LogNotFoundError(UsageError):
    """Raised when a command that only reads is pointed at a log that does not exist."""

    def __init__(self, where: str, hint: str = "append an event first") -> None:
        super().__init__(f"no log at {where}; check --store (or $LOOPD_ES_STORE), or {hint}")


class InvalidEventError(UsageError):
    """Raised when an event's type or payload does not match the catalogue."""


# -- conflicts (exit 3) ----------------------------------------------------------------------------


class ConflictError(LoopdError):
    """Raised when a write was refused because the log or the domain is not in the expected state."""

    exit_code: ClassVar[int] = EXIT_CONFLICT


class WrongExpectedVersionError(ConflictError):
    """Raised when an append's expected version does not match the stream's actual version."""

    def __init__(self, stream: str, expected: int | str, actual: int) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        shown_actual = "no stream" if actual == 0 else f"version {actual}"
        super().__init__(
            f"version conflict on stream {stream!r}: expected {_describe_expected(expected)}, "
            f"the stream is at {shown_actual}; read the stream again and retry with "
            f"--expected-version {actual if actual else 'no_stream'}"
        )


class DuplicateEventIdError(ConflictError):
    """Raised when an event id already in the log is appended again with different content."""

    def __init__(self, event_id: str, position: int, stream: str, why: str = "different content") -> None:
        self.event_id = event_id
        self.position = position
        super().__init__(
            f"event id {event_id} is already recorded at position {position} (stream {stream!r}) with {why}; "
            "use a new event id for a new event, or resend the original batch unchanged to retry it"
        )


class DomainError(ConflictError):
    """Raised when a command breaks a domain rule; the message is the reference system's own text."""


# -- storage (exit 4) ------------------------------------------------------------------------------


class StorageError(LoopdError):
    """Raised when the log cannot be read or written as it should."""

    exit_code: ClassVar[int] = EXIT_STORAGE


class CorruptLogError(StorageError):
    """Raised when a complete line or row of the log cannot be decoded or breaks the log's invariants."""

    def __init__(self, where: str, line: int | None, problem: str) -> None:
        self.where = where
        self.line = line
        loc = f"line {line} of {where}" if line is not None else where
        super().__init__(
            f"corrupt log: {loc}: {problem}; the log was not changed - inspect it with `loopd-es verify` "
            "(a corrupt complete event is never skipped or repaired automatically)"
        )


class TornTailError(StorageError):
    """Raised when the log ends in an incomplete write and this operation may not repair it."""

    def __init__(self, where: str, offset: int, size: int) -> None:
        self.offset = offset
        self.size = size
        super().__init__(
            f"torn tail in {where}: {size} bytes from byte offset {offset} are an incomplete write; "
            "run `loopd-es verify --repair` (or any append) to truncate them; no acknowledged event is ever dropped"
        )


class LockTimeoutError(StorageError):
    """Raised when the writer lock could not be taken in time."""

    def __init__(self, where: str, seconds: float) -> None:
        super().__init__(
            f"could not take the writer lock on {where} within {seconds:g} s; another process is writing "
            "or hung - find it with `fuser` or retry later"
        )


class StoreUnavailableError(StorageError):
    """Raised when the store cannot be opened or written (path, permissions, disk, URL)."""


class NotALogError(StoreUnavailableError):
    """Raised when ``--store`` points at a file that is not a loopd-es log; the file is left untouched."""

    def __init__(self, where: str, why: str) -> None:
        self.where = where
        super().__init__(
            f"{where} is not a loopd-es log ({why}); it was not changed - point --store at a loopd-es log "
            "or at a new path"
        )


def _describe_expected(expected: int | str) -> str:
    if isinstance(expected, int):
        return "no stream" if expected == 0 else f"version {expected}"
    return {"no_stream": "no stream", "exists": "an existing stream", "any": "any version"}.get(
        expected, str(expected)
    )
