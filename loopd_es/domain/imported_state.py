"""The folded state of an import's own streams: ``import-<id>`` (what was read, what was left out) and
``control-<requestID>`` (one owner control request loopd handled).

Without these, ``replay --json`` showed an import stream and a control request as an event count only, so
the source's state version, revision and the import report could not be read back from the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from ..errors import InvalidEventError
from ..events.catalogue import decode_payload
from ..events.imported import (
    ControlCompleted,
    ControlRequested,
    DroppedField,
    ImportCompleted,
    ImportStarted,
    SkippedLine,
)

if TYPE_CHECKING:
    from ..events.base import Event
    from ..events.envelope import Foldable


class ImportState(msgspec.Struct, frozen=True, kw_only=True):
    """One import of a loopd project: the source files, and (once completed) its report."""

    import_id: str
    directory: str = ""
    state_version: int | None = None
    """The version ``state.json`` was written in."""
    migrated_version: int | None = None
    """The version it was read as, after loopd's own migrations."""
    state_revision: int | None = None
    state_sha256: str = ""
    ledger_lines: int = 0
    completed: bool = False
    streams: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: tuple[SkippedLine, ...] = ()
    needs_reconcile: tuple[str, ...] = ()
    dropped_fields: tuple[DroppedField, ...] = ()
    version: int = 0


class ControlState(msgspec.Struct, frozen=True, kw_only=True):
    """One owner control request (``state.commandLedger[]``): what was asked, when, and its outcome."""

    request_id: str
    command: str = ""
    goal_id: str | None = None
    requested_at: str = ""
    completed_at: str | None = None
    outcome: Literal["handled", "rejected"] | None = None
    reason: str | None = None
    version: int = 0


def _payload(env: Foldable) -> Event | None:
    try:
        return decode_payload(env)
    except InvalidEventError:
        return None  # a payload this version cannot read only moves the version


def import_step(state: ImportState, env: Foldable) -> ImportState:
    """Fold one event of an ``import-<id>`` stream (other payloads only count)."""
    e = _payload(env)
    if isinstance(e, ImportStarted):
        return msgspec.structs.replace(
            state,
            directory=e.directory,
            state_version=e.state_version,
            migrated_version=e.migrated_version,
            state_revision=e.state_revision,
            state_sha256=e.state_sha256,
            ledger_lines=e.ledger_lines,
            streams=e.streams,
            version=env.version,
        )
    if isinstance(e, ImportCompleted):
        return msgspec.structs.replace(
            state,
            completed=True,
            warnings=e.warnings,
            skipped=e.skipped,
            needs_reconcile=e.needs_reconcile,
            dropped_fields=e.dropped_fields,
            version=env.version,
        )
    return msgspec.structs.replace(state, version=env.version)


def control_step(state: ControlState, env: Foldable) -> ControlState:
    """Fold one event of a ``control-<requestID>`` stream."""
    e = _payload(env)
    if isinstance(e, ControlRequested):
        return msgspec.structs.replace(
            state, command=e.command, goal_id=e.goal_id, requested_at=e.at, version=env.version
        )
    if isinstance(e, ControlCompleted):
        return msgspec.structs.replace(
            state,
            command=state.command or e.command,
            goal_id=state.goal_id or e.goal_id,
            completed_at=e.at,
            outcome=e.outcome,
            reason=e.reason,
            version=env.version,
        )
    return msgspec.structs.replace(state, version=env.version)
