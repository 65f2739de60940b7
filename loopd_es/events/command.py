"""Command-session and command-await events: one stream per command, ``command-<id>``.

Awaits live in their command's stream (not the goal's) so that a terminal transition and the firing of
every outstanding await land in one atomic, version-checked append: a second firer (a duplicate exit
signal, a concurrent reconciler) finds the stream moved on, re-reads it and sees nothing left to fire.

Type strings follow the reference ledger (docs/reference/loopd.md#s4-1) where one exists; the others
(``command.spawned``, ``command.watch-set``, ``command.signal-sent``, ``command.input-written``,
``command.resized``, ``command.removed``) record transitions the reference kept only in ``state.json``.
Environment *values* are never recorded: only their key names.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from .base import Caller, Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc

Status = Literal["running", "exited", "terminated", "missing"]
EndReason = Literal["exit", "terminate", "timeout", "until", "missing"]
UntilAction = Literal["stop", "keep"]
SignalName = Literal["SIGINT", "SIGTERM", "SIGKILL"]
SignalReason = Literal["interrupt", "terminate", "kill", "timeout", "until"]

STREAM_PREFIX: Final = "command-"


def command_stream(command_id: str) -> str:
    """The stream that holds one command's lifecycle and its awaits."""
    return f"{STREAM_PREFIX}{command_id}"


class WatchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A watch: ``filter`` selects lines to push, ``until`` ends the watch (and, with ``stop``, the command)."""

    filter: str = ""
    until: str = ""
    ignore_case: bool = False
    until_action: UntilAction = "stop"

    @property
    def empty(self) -> bool:
        return not self.filter and not self.until


@event("command.started", version=2)
class CommandStarted(Event, frozen=True, kw_only=True):
    """A command was accepted and its owner (supervisor) launched; the process is ``running`` from here."""

    command_id: str
    title: str
    command: str
    args: list[str] = msgspec.field(default_factory=list)
    cwd: str
    shell: bool = False
    env_keys: list[str] = msgspec.field(default_factory=list)
    timeout_seconds: int | None = None
    deadline_at: UtcTime | None = None
    cols: int = 80
    rows: int = 24
    watch: WatchSpec | None = None
    goal_id: str | None = None
    notify_on_exit: bool | None = None
    started_at: UtcTime | None
    owner_session_id: str | None = None
    """The OpenCode session that started it with ``loopd_command_start`` (the reference's ``ownerSessionID``):
    the only session its command tools may touch. ``None`` for a command started from the CLI."""
    machine: str = ""
    """The machine it runs on (the id kept in that machine's command directory): only that machine can tell
    whether its owner is alive. ``""`` for commands recorded before 0.4, judged by whoever looks."""
    called_by: Caller | None = None
    """The OpenCode tool call that started it (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.spawned")
class CommandSpawned(Event, frozen=True, kw_only=True):
    """The owner spawned the process in its PTY (observability: pids are never used for identity)."""

    command_id: str
    pid: int
    supervisor_pid: int


@event("command.watch-set")
class WatchSet(Event, frozen=True, kw_only=True):
    """A watch was set or replaced on a running command; counters reset to ``active``."""

    command_id: str
    watch: WatchSpec
    called_by: Caller | None = None
    """The OpenCode tool call that set the watch (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.watch-matched")
class WatchMatched(Event, frozen=True, kw_only=True):
    """A watch push (coalesced matched lines), or the until-line match; ``text`` is the pushed message."""

    command_id: str
    lines: int
    matches: int
    pushes: int
    until: str | None = None
    at_exit: bool = False
    text: str = ""


@event("command.watch-suspended")
class WatchSuspended(Event, frozen=True, kw_only=True):
    """A watch stopped pushing: push ``budget`` spent, output ``flood``, or ``cleared`` by the user."""

    command_id: str
    reason: Literal["budget", "flood", "cleared"]
    pushes: int = 0
    dropped: int = 0
    at_exit: bool = False
    text: str = ""
    called_by: Caller | None = None
    """The OpenCode tool call that cleared the watch (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.until-stopped")
class UntilStopped(Event, frozen=True, kw_only=True):
    """The until pattern matched with action ``stop``: the command is being terminated, end reason ``until``."""

    command_id: str
    until: str


@event("command.signal-sent")
class SignalSent(Event, frozen=True, kw_only=True):
    """A signal was delivered; SIGTERM/SIGKILL are termination claims, SIGINT is not."""

    command_id: str
    signal: SignalName
    reason: SignalReason
    called_by: Caller | None = None
    """The OpenCode tool call that asked for the signal (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.input-written")
class InputWritten(Event, frozen=True, kw_only=True):
    """Bytes were written to the command's terminal (their count only: input may hold secrets)."""

    command_id: str
    bytes: int
    called_by: Caller | None = None
    """The OpenCode tool call that wrote the input (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.resized")
class CommandResized(Event, frozen=True, kw_only=True):
    """The terminal size was stored and applied to the PTY."""

    command_id: str
    cols: int
    rows: int
    called_by: Caller | None = None
    """The OpenCode tool call that resized it (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.exited", version=2)
class CommandExited(Event, frozen=True, kw_only=True):
    """The command reached its one terminal status (``missing`` included); never followed by another."""

    command_id: str
    status: Status
    end_reason: EndReason
    exit_code: int | None = None
    signal: str | None = None
    last_error: str | None = None
    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    ended_at: UtcTime | None
    owner_notified_at: UtcTime | None = None
    """When the owner was told of the exit (the reference's exactly-once ``ownerNotifiedAt``), if known."""
    watch_dropped_lines: int | None = None
    """A suspended watch's dropped lines at the exit (it counts every line after its suspension); ``None``
    when there was no suspended watch, or in a log written before 0.6."""


@event("command.removed")
class CommandRemoved(Event, frozen=True, kw_only=True):
    """The command's record and output log were removed; its stream stays as history."""

    command_id: str
    called_by: Caller | None = None
    """The OpenCode tool call that removed it (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.await-requested", version=2)
class AwaitRequested(Event, frozen=True, kw_only=True):
    """A goal now waits for this command's exit, or for its first line matching ``until``."""

    goal_id: str
    command_id: str
    until: str | None = None
    ignore_case: bool = False
    owner_session_id: str | None = None
    """The session that asked to wait (the reference's ``commandAwaits[].ownerSessionID``), if known."""
    at: UtcTime | None = None
    """When the await was asked for (an import's ``commandAwaits[].createdAt``); ``None``: the envelope's time."""
    called_by: Caller | None = None
    """The OpenCode tool call that asked for the await (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.await-fired")
class AwaitFired(Event, frozen=True, kw_only=True):
    """An await was consumed (exactly once) with its evidence, at most 4 KiB of output tail included."""

    goal_id: str
    command_id: str
    status: Status
    exit_code: int | None = None
    signal: str | None = None
    until: str | None = None
    matched_lines: list[str] = msgspec.field(default_factory=list)
    immediate: bool = False
    evidence: str = ""
    called_by: Caller | None = None
    """The OpenCode tool call that asked for an await that fired at once (``loopd_command_*``); ``None`` from the CLI, the dashboard, the
    owner process itself, or a log written before 0.5."""


@event("command.await-discarded")
class AwaitDiscarded(Event, frozen=True, kw_only=True):
    """An await was dropped because its goal or command record is gone."""

    goal_id: str
    command_id: str
    reason: str


@event("command.await-cancelled")
class AwaitCancelled(Event, frozen=True, kw_only=True):
    """An await was cancelled: its goal was paused or cleared, or its command removed."""

    goal_id: str
    command_id: str
    reason: str


CommandEvent = (
    CommandStarted
    | CommandSpawned
    | WatchSet
    | WatchMatched
    | WatchSuspended
    | UntilStopped
    | SignalSent
    | InputWritten
    | CommandResized
    | CommandExited
    | CommandRemoved
    | AwaitRequested
    | AwaitFired
    | AwaitDiscarded
    | AwaitCancelled
)
"""Every payload that may appear in a ``command-<id>`` stream."""

COMMAND_EVENT_TYPES: Final[tuple[type[Event], ...]] = (
    CommandStarted,
    CommandSpawned,
    WatchSet,
    WatchMatched,
    WatchSuspended,
    UntilStopped,
    SignalSent,
    InputWritten,
    CommandResized,
    CommandExited,
    CommandRemoved,
    AwaitRequested,
    AwaitFired,
    AwaitDiscarded,
    AwaitCancelled,
)

register_upcaster("command.started", 1, times_to_utc("deadline_at", "started_at"))
register_upcaster("command.exited", 1, times_to_utc("ended_at", "owner_notified_at"))
register_upcaster("command.await-requested", 1, times_to_utc("at"))
