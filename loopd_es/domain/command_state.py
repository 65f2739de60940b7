"""A command session folded from its ``command-<id>`` stream: state, ``evolve``, ``fold`` (pure).

The fold applies facts as recorded, with one rule of its own: a ``timeout`` or ``until`` termination claim is
never overwritten, neither by a later claim nor by the end reason of the exit that follows it
(docs/reference/loopd.md#s3-17).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import DomainError, UsageError
from ..events.base import Caller
from ..events.command import (
    AwaitCancelled,
    AwaitDiscarded,
    AwaitFired,
    AwaitRequested,
    CommandExited,
    CommandRemoved,
    CommandResized,
    CommandSpawned,
    CommandStarted,
    EndReason,
    InputWritten,
    SignalReason,
    SignalSent,
    Status,
    UntilStopped,
    WatchMatched,
    WatchSet,
    WatchSpec,
    WatchSuspended,
)

if TYPE_CHECKING:
    from ..events.base import Event

MAX_OUTPUT_BYTES: Final = 512 * 1024
MAX_AWAIT_TAIL_BYTES: Final = 4096
MAX_UNTIL_EVIDENCE_LINES: Final = 20
MAX_PAST_AWAITS: Final = 20
TERMINATE_GRACE_S: Final = 3.0
EXIT_CODE_TERMINATE: Final = 143
EXIT_CODE_KILL: Final = 137


class CommandNotFoundError(UsageError):
    """Raised when a command id names no command (or a removed one)."""

    hint = "`loopd-es cmd list` lists the commands; ids may be shortened to a unique prefix"

    def __init__(self, message: str = "Command not found.") -> None:
        super().__init__(message)


class CommandStateError(DomainError):
    """Raised when an operation does not fit the command's status (e.g. write to an exited command)."""


# -- state ----------------------------------------------------------------------------------------


class AwaitState(msgspec.Struct, frozen=True, kw_only=True):
    """One outstanding await (at most one per goal and command)."""

    goal_id: str
    until: str | None = None
    ignore_case: bool = False
    owner_session_id: str | None = None
    """The session that asked (its evidence and wake-up go to that session's goal)."""
    requested_at: datetime | None = None
    requested_by: Caller | None = None
    """The ``loopd_command_await`` call that asked for it, when a tool did."""
    outcome: str = "waiting"
    """``waiting`` while outstanding; then the event type that ended it (``command.await-fired`` ...)."""


class CommandState(msgspec.Struct, frozen=True, kw_only=True):
    """A command folded from its stream: the reference's CommandSession (docs/reference/loopd.md#s1-7) plus
    its awaits."""

    id: str
    title: str
    command: str
    args: tuple[str, ...]
    cwd: str
    shell: bool
    env_keys: tuple[str, ...]
    timeout_seconds: int | None
    deadline_at: datetime | None
    cols: int
    rows: int
    watch: WatchSpec | None
    goal_id: str | None
    notify_on_exit: bool | None
    created_at: datetime | None
    owner_session_id: str | None = None
    machine: str = ""
    status: Status = "running"
    end_reason: EndReason | None = None
    claim: SignalReason | None = None
    exit_code: int | None = None
    signal: str | None = None
    pid: int | None = None
    supervisor_pid: int | None = None
    last_error: str | None = None
    ended_at: datetime | None = None
    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    watch_pushes: int = 0
    watch_matches: int = 0
    watch_state: str = "active"
    watch_dropped_lines: int = 0
    """Lines the watch dropped when it was suspended (output flood or push budget)."""
    input_bytes: int = 0
    removed: bool = False
    awaits: tuple[AwaitState, ...] = ()
    past_awaits: tuple[AwaitState, ...] = ()
    """The last :data:`MAX_PAST_AWAITS` awaits that ended, with who asked and how they ended."""
    version: int = 0
    owner_notified_at: datetime | None = None
    """Recorded on the exit when the owner was told already (imported history: the reference told it)."""
    started_by: Caller | None = None
    """The ``loopd_command_start`` call that started it (``None``: the CLI, or a log from before 0.5)."""
    controlled_by: Caller | None = None
    """The last tool call that acted on it (input, a signal, a resize, the watch, an await, its removal)."""
    updated_at: datetime | None = None
    """When its last event was recorded (the reference's ``updatedAt``); set by whoever folds envelopes."""

    @property
    def running(self) -> bool:
        return self.status == "running"

    def await_for(self, goal_id: str) -> AwaitState | None:
        return next((a for a in self.awaits if a.goal_id == goal_id), None)


_replace = msgspec.structs.replace


def evolve(state: CommandState | None, e: Event, version: int = 0) -> CommandState | None:
    """Apply one event; unknown payloads leave the state as it is (forward compatibility)."""
    if isinstance(e, CommandStarted):
        return CommandState(
            id=e.command_id,
            title=e.title,
            command=e.command,
            args=tuple(e.args),
            cwd=e.cwd,
            shell=e.shell,
            env_keys=tuple(e.env_keys),
            timeout_seconds=e.timeout_seconds,
            deadline_at=e.deadline_at,
            cols=e.cols,
            rows=e.rows,
            watch=None if e.watch is None or e.watch.empty else e.watch,
            goal_id=e.goal_id,
            notify_on_exit=e.notify_on_exit,
            created_at=e.started_at,
            owner_session_id=e.owner_session_id,
            machine=e.machine,
            version=version or 1,
            started_by=e.called_by,
        )
    if state is None:
        return None
    s = _evolve(state, e)
    caller = getattr(e, "called_by", None)
    if caller is not None:
        return _replace(s, version=version or s.version + 1, controlled_by=caller)
    return _replace(s, version=version or s.version + 1)


def _evolve(s: CommandState, e: Event) -> CommandState:
    if isinstance(e, CommandSpawned):
        return _replace(s, pid=e.pid, supervisor_pid=e.supervisor_pid)
    if isinstance(e, WatchSet):
        return _replace(  # a replaced watch starts afresh: {active, 0 matches, 0 pushes, 0 dropped lines}
            s,
            watch=None if e.watch.empty else e.watch,
            watch_state="active",
            watch_pushes=0,
            watch_matches=0,
            watch_dropped_lines=0,
        )
    if isinstance(e, WatchMatched):
        return _replace(
            s,
            watch_pushes=e.pushes,
            watch_matches=e.matches,
            watch_state="until-matched" if e.until is not None else s.watch_state,
        )
    if isinstance(e, WatchSuspended):
        if e.reason == "cleared":
            return _replace(
                s, watch=None, watch_state="active", watch_pushes=0, watch_matches=0, watch_dropped_lines=0
            )
        return _replace(
            s,
            watch_state="flood-suspended" if e.reason == "flood" else "budget-exhausted",
            watch_dropped_lines=e.dropped,
        )
    if isinstance(e, UntilStopped):
        return _replace(s, watch_state="until-matched")
    if isinstance(e, SignalSent):
        claim = s.claim
        if e.signal != "SIGINT" and claim not in ("timeout", "until"):
            claim = e.reason  # timeout/until are never overwritten by a later claim
        return _replace(s, signal=e.signal, claim=claim)
    if isinstance(e, InputWritten):
        return _replace(s, input_bytes=s.input_bytes + e.bytes)
    if isinstance(e, CommandResized):
        return _replace(s, cols=e.cols, rows=e.rows)
    if isinstance(e, CommandExited):
        if not s.running:
            return s  # one terminal transition per command; a stray second one changes nothing
        # the claim, not end_reason (still empty while the command runs): a timeout/until claim stays the reason
        reason = s.claim if s.claim in ("timeout", "until") else e.end_reason
        return _replace(
            s,
            status=e.status,
            end_reason=reason,
            exit_code=e.exit_code,
            signal=e.signal,
            last_error=e.last_error,
            ended_at=e.ended_at,
            output_bytes=e.output_bytes,
            stream_bytes=e.stream_bytes,
            truncated=e.truncated,
            owner_notified_at=e.owner_notified_at,
            watch_dropped_lines=s.watch_dropped_lines
            if e.watch_dropped_lines is None
            else e.watch_dropped_lines,
        )
    if isinstance(e, CommandRemoved):
        # awaits a removal left (one written without its cancellations, e.g. imported) stay visible until
        # reconcile discards them with a ledger line: dropping them here would lose them silently
        return _replace(s, removed=True)
    if isinstance(e, AwaitRequested):
        if s.await_for(e.goal_id) is not None:
            return s
        new = AwaitState(
            goal_id=e.goal_id,
            until=e.until,
            ignore_case=e.ignore_case,
            owner_session_id=e.owner_session_id,
            requested_at=e.at,
            requested_by=e.called_by,
        )
        return _replace(s, awaits=(*s.awaits, new))
    if isinstance(e, AwaitFired | AwaitDiscarded | AwaitCancelled):
        ended = tuple(_replace(a, outcome=e.event_type) for a in s.awaits if a.goal_id == e.goal_id)
        return _replace(
            s,
            awaits=tuple(a for a in s.awaits if a.goal_id != e.goal_id),
            past_awaits=(*s.past_awaits, *ended)[-MAX_PAST_AWAITS:],
        )
    return s


def fold(events: Iterable[Event], state: CommandState | None = None) -> CommandState | None:
    """Fold payloads in stream order (versions counted from the state's)."""
    for e in events:
        state = evolve(state, e)
    return state


def argv_text(s: CommandState) -> str:
    return " ".join((s.command, *s.args))
