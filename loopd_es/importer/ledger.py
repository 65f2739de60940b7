"""Read an ``opencode-loopd`` ledger (``events.ndjson``): one typed Struct per line kind the import maps.

Kept apart from :mod:`.source` (``state.json``) so each reader stays small; the same rules hold: a wrong
shape is refused naming the line and field, fields the import does not use are ignored.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from ..clock import utc_text
from ..events.command import Status
from ..events.goal import GoalStatus
from .segments import read_ledger_bytes
from .source import ImportSourceError, Stamp, ref_field, utc_times


class _L(msgspec.Struct, frozen=True, kw_only=True):
    pass


L = TypeVar("L", bound=_L)


# -- events.ndjson --------------------------------------------------------------------------------


class LedgerLine(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger line: its 1-based line number, type, timestamp and the whole object for the mapper."""

    line: int
    type: str
    timestamp: Stamp
    goal_id: str | None
    command_id: str | None
    event_id: str | None
    fields: dict[str, Any]


class LoadedLedger(msgspec.Struct, frozen=True, kw_only=True):
    """The ledger's complete lines, the number of lines read, and a torn last line if there was one."""

    path: Path
    lines: tuple[LedgerLine, ...]
    count: int
    sha256: str
    torn_line: int | None = None
    torn_offset: int | None = None
    """Byte offset of the torn line: the ledger's complete part is the bytes before it."""


def load_ledger(path: Path) -> LoadedLedger:
    """Read ``events.ndjson`` after its rotated segments (:mod:`.segments`); a missing file is an empty
    ledger, a torn last line is left out (and reported).

    A complete line that is not a JSON object with string ``type`` and ``timestamp`` is an error: the
    ledger is appended without a lock, so a bad line in the middle means the file was damaged, and
    guessing past it could misattribute history.

    :raises ImportSourceError: naming the line and what is wrong with it.
    """
    try:
        raw = read_ledger_bytes(path)  # with its rotated segments, oldest first
    except FileNotFoundError:
        return LoadedLedger(path=path, lines=(), count=0, sha256="")
    except OSError as e:
        raise ImportSourceError(path, f"cannot read it ({e.strerror or e})") from None
    chunks = raw.split(b"\n")
    torn: int | None = None
    torn_offset: int | None = None
    result: list[LedgerLine] = []
    offset = 0
    for number, chunk in enumerate(chunks, start=1):
        start, offset = offset, offset + len(chunk) + 1
        if not chunk.strip():
            continue
        last = number == len(chunks)  # no newline after it: the writer may have died mid-line
        try:
            obj = msgspec.json.decode(chunk)
        except msgspec.DecodeError as e:
            if last:
                torn, torn_offset = number, start
                continue
            raise ImportSourceError(path, f"line {number} is not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ImportSourceError(path, f"line {number}: expected a JSON object, got {type(obj).__name__}")
        type_, ts = obj.get("type"), obj.get("timestamp")
        if not isinstance(type_, str) or not isinstance(ts, str):
            raise ImportSourceError(path, f"line {number}: expected string `type` and `timestamp`")
        goal_id, command_id, event_id = obj.get("goalID"), obj.get("commandID"), obj.get("eventID")
        result.append(
            LedgerLine(
                line=number,
                type=type_,
                timestamp=utc_text(ts),
                goal_id=goal_id if isinstance(goal_id, str) else None,
                command_id=command_id if isinstance(command_id, str) else None,
                event_id=event_id if isinstance(event_id, str) else None,
                fields=obj,
            )
        )
    count = len(chunks) - (1 if chunks and not chunks[-1] else 0)
    return LoadedLedger(
        path=path,
        lines=tuple(result),
        count=count,
        sha256=hashlib.sha256(raw).hexdigest(),
        torn_line=torn,
        torn_offset=torn_offset,
    )


def typed(line: LedgerLine, cls: type[L], where: Path) -> L:
    """The line as its typed Struct.

    :raises ImportSourceError: when a field the import needs is missing or of the wrong type.
    """
    try:
        return utc_times(msgspec.convert(line.fields, cls))
    except msgspec.ValidationError as e:
        raise ImportSourceError(where, f"line {line.line} ({line.type}): {e}") from None


class LGoalCreated(_L, frozen=True):
    name: str
    objective: str
    owner_session_id: str = ref_field("ownerSessionID")


class LStatusChanged(_L, frozen=True):
    to: GoalStatus
    from_: GoalStatus = ref_field("from")


class LProgress(_L, frozen=True):
    summary: str
    next: str | None = None


class LCompleted(_L, frozen=True):
    summary: str
    evidence: str


class LBlocked(_L, frozen=True):
    reason: str
    needed: str


class LRejected(_L, frozen=True):
    attempt_id: str = ref_field("attemptID")
    rejection_count: int = ref_field("rejectionCount")
    failed_check_count: int = ref_field("failedCheckCount")
    failure_summary: str = ref_field("failureSummary")


class LInteractive(_L, frozen=True):
    interactive: bool


class LRun(_L, frozen=True):
    run_id: str = ref_field("runID")
    turn_count: int | None = ref_field("turnCount", None)
    error: str | None = None
    consecutive_failures: int | None = ref_field("consecutiveFailures", None)
    quiet_seconds: float | None = ref_field("quietSeconds", None)
    cleared_tool_calls: int | None = ref_field("clearedToolCalls", None)
    stuck_seconds: float | None = ref_field("stuckSeconds", None)


class LConfirmFailed(_L, frozen=True):
    reason: Literal["prompt-outside-window", "assistant-incomplete", "worker-active"]


class LCommand(_L, frozen=True):
    command_id: str = ref_field("commandID")
    title: str | None = None
    goal_id: str | None = ref_field("goalID", None)
    exit_code: int | None = ref_field("exitCode", None)
    lines: int = 0
    matches: int | None = None
    pushes: int = 0
    until: str | None = None
    at_exit: bool = ref_field("atExit", False)
    reason: str | None = None
    dropped: int = 0
    status: Status | None = None
    signal: str | None = None
    matched_lines: list[str] | int | None = ref_field("matchedLines", None)


class LControl(_L, frozen=True):
    request_id: str = ref_field("requestID")
    command: str = ""
    reason: str | None = None


class LAwaitCancelled(_L, frozen=True):
    goal_id: str = ref_field("goalID")
    reason: str = ""
    command_id: str | None = ref_field("commandID", None)
