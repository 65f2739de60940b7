"""Command sessions and awaits, pure: fold a ``command-<id>`` stream into state, decide what happens next.

Nothing here does I/O or reads a clock: the owner (``loopd_es.procs``) reads the world (exit status, the
output tail, the time) and passes it in; the deciders return the events to append. Exactly-once rests on
two things: a decider returns nothing for a transition that already happened (a second exit, a consumed
await), and the caller appends at the stream version it folded, re-folding and re-deciding on conflict.

Messages are the reference system's own (``loopd-domain.md`` §3.17, §3.18), so users of the plugin
recognise them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import DomainError, UsageError
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
    SignalName,
    SignalReason,
    SignalSent,
    Status,
    UntilStopped,
    WatchMatched,
    WatchSet,
    WatchSpec,
    WatchSuspended,
)
from ..events.envelope import parse_rfc3339
from ..patterns import PatternError, UserPattern, compile_user_pattern

if TYPE_CHECKING:
    from ..events.base import Event

MAX_OUTPUT_BYTES: Final = 512 * 1024
MAX_AWAIT_TAIL_BYTES: Final = 4096
MAX_UNTIL_EVIDENCE_LINES: Final = 20
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


class CommandState(msgspec.Struct, frozen=True, kw_only=True):
    """A command folded from its stream: the reference's CommandSession (§1.7) plus its awaits."""

    id: str
    title: str
    command: str
    args: tuple[str, ...]
    cwd: str
    shell: bool
    env_keys: tuple[str, ...]
    timeout_seconds: int | None
    deadline_at: str | None
    cols: int
    rows: int
    watch: WatchSpec | None
    goal_id: str | None
    notify_on_exit: bool | None
    created_at: str
    status: Status = "running"
    end_reason: EndReason | None = None
    claim: SignalReason | None = None
    exit_code: int | None = None
    signal: str | None = None
    pid: int | None = None
    supervisor_pid: int | None = None
    last_error: str | None = None
    ended_at: str | None = None
    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    watch_pushes: int = 0
    watch_matches: int = 0
    watch_state: str = "active"
    input_bytes: int = 0
    removed: bool = False
    awaits: tuple[AwaitState, ...] = ()
    version: int = 0

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
            version=version or 1,
        )
    if state is None:
        return None
    s = _evolve(state, e)
    return _replace(s, version=version or s.version + 1)


def _evolve(s: CommandState, e: Event) -> CommandState:
    if isinstance(e, CommandSpawned):
        return _replace(s, pid=e.pid, supervisor_pid=e.supervisor_pid)
    if isinstance(e, WatchSet):
        return _replace(
            s, watch=None if e.watch.empty else e.watch, watch_state="active", watch_pushes=0, watch_matches=0
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
            return _replace(s, watch=None, watch_state="active")
        return _replace(s, watch_state="flood-suspended" if e.reason == "flood" else "budget-exhausted")
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
        reason = s.end_reason if s.end_reason in ("timeout", "until") else e.end_reason
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
        )
    if isinstance(e, CommandRemoved):
        return _replace(s, removed=True, awaits=())
    if isinstance(e, AwaitRequested):
        if s.await_for(e.goal_id) is not None:
            return s
        new = AwaitState(goal_id=e.goal_id, until=e.until, ignore_case=e.ignore_case)
        return _replace(s, awaits=(*s.awaits, new))
    if isinstance(e, AwaitFired | AwaitDiscarded | AwaitCancelled):
        return _replace(s, awaits=tuple(a for a in s.awaits if a.goal_id != e.goal_id))
    return s


def fold(events: Iterable[Event], state: CommandState | None = None) -> CommandState | None:
    """Fold payloads in stream order (versions counted from the state's)."""
    for e in events:
        state = evolve(state, e)
    return state


# -- validation (all before anything is spawned or appended) -----------------------------------------

_DANGEROUS: Final = tuple(  # on RE2 too: on Python's re these scans were quadratic in a long pattern's text
    compile_user_pattern(p)
    for p in (
        r"\(\?:.*\)\*.*\(\?:.*\)\*",
        r".*\(\.\*\?\)\{2,\}.*",
        r".*\(.*\|.*\)\{3,\}.*",
        r"\([^()]*[+*][^()]*\)[+*]",
        r"\([^()]*(\.\*.*\.\*|\.\+.*\.\+|\\w\+.*\\s\*|\\s\*.*\\w\+)[^()]*\)",
    )
)


def is_dangerous_regex(source: str) -> bool:
    """The reference's guard against catastrophic backtracking (``(a+)+``, ``(.*.*)``, ``(\\w+\\s*)+``)."""
    return any(p.search(source) for p in _DANGEROUS)


def compile_watch_regex(kind: str, source: str, ignore_case: bool = False) -> UserPattern:
    """Compile a watch/await regex (``kind`` is ``filter`` or ``until``) for linear-time matching (RE2).

    :raises UsageError: with the reference's message for an invalid or dangerous pattern.
    """
    try:
        pattern = compile_user_pattern(source, ignore_case)
    except PatternError as e:
        raise UsageError(f"Invalid watch {kind} regex '{source}': {e}") from None
    if is_dangerous_regex(source):
        raise UsageError(
            f"Potentially dangerous watch {kind} regex rejected: '{source}'. Please use a safer pattern."
        )
    return pattern


def compile_read_pattern(source: str, ignore_case: bool = False) -> UserPattern:
    """Compile a ``read --pattern`` regex for linear-time matching (RE2).

    :raises UsageError: with the reference's message for an invalid or dangerous pattern.
    """
    try:
        pattern = compile_user_pattern(source, ignore_case)
    except PatternError as e:
        raise UsageError(f"Invalid regex pattern '{source}': {e}") from None
    if is_dangerous_regex(source):
        raise UsageError(
            f"Potentially dangerous regex pattern rejected: '{source}'. Please use a safer pattern."
        )
    return pattern


def validate_watch(spec: WatchSpec) -> None:
    """:raises UsageError: for a bad until action or regex (the previous watch stays untouched)."""
    if spec.until_action not in ("stop", "keep"):
        raise UsageError(f'Invalid watch untilAction \'{spec.until_action}\': must be "stop" or "keep".')
    if spec.filter:
        compile_watch_regex("filter", spec.filter, spec.ignore_case)
    if spec.until:
        compile_watch_regex("until", spec.until, spec.ignore_case)


def validate_start(title: str, command: str, timeout_seconds: object, watch: WatchSpec | None) -> None:
    """The reference's start checks, in its order.

    :raises UsageError: naming the first problem.
    """
    if not title.strip():
        raise UsageError("title is required")
    if not command.strip():
        raise UsageError("command is required")
    if timeout_seconds is not None and (
        isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int) or timeout_seconds <= 0
    ):
        raise UsageError("timeoutSeconds must be a positive integer in seconds")
    if watch is not None:
        validate_watch(watch)


def validate_size(cols: int, rows: int) -> None:
    """:raises UsageError: for a non-positive size."""
    if cols <= 0 or rows <= 0:
        raise UsageError(f"Invalid size {cols}x{rows}: cols and rows must be positive integers.")


_SAFE_WORD: Final = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def shell_quote(word: str) -> str:
    """POSIX single-quote ``word`` unless it is plainly safe: ``it's`` → ``'it'\\''s'``."""
    if _SAFE_WORD.match(word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def shell_join(command: str, args: Iterable[str]) -> str:
    """The ``/bin/sh -c`` script for a shell command: every word quoted as needed."""
    return " ".join(shell_quote(w) for w in (command, *args))


def argv_text(s: CommandState) -> str:
    return " ".join((s.command, *s.args))


# -- decisions ------------------------------------------------------------------------------------


class OutputFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the owner knows of the output when it decides: sizes and a sanitised tail (≤ 4 KiB)."""

    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    tail: str = ""


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def deadline_for(started: datetime, timeout_seconds: int | None) -> str | None:
    return None if timeout_seconds is None else _iso(started + timedelta(seconds=timeout_seconds))


def exit_evidence(s: CommandState, status: str, exit_code: int | None, signal: str | None, tail: str) -> str:
    """The owner-notification format the reference also uses as exit-await evidence."""
    code = "unknown" if exit_code is None else str(exit_code)
    head = f'[command "{s.title}" ({argv_text(s)}) {status} {s.id[:8]}... exitCode={code} signal={signal or "none"}]'
    return f"{head}\n{tail}"


def until_evidence(s: CommandState, pattern: str, matched: list[str], tail: str) -> str:
    lines = cap_utf8("\n".join(matched[:MAX_UNTIL_EVIDENCE_LINES]), MAX_AWAIT_TAIL_BYTES, keep="head")
    head = f'[command "{s.title}" ({argv_text(s)}) {s.status} {s.id[:8]}... watch-until "{pattern}" matched]'
    return f"{head}\n{lines}\n--- tail ---\n{tail}"


def cap_utf8(text: str, limit: int, keep: str = "tail") -> str:
    """At most ``limit`` UTF-8 bytes of ``text``, cut on a character boundary."""
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = data[-limit:] if keep == "tail" else data[:limit]
    return cut.decode("utf-8", "ignore")


def _fire_exit(
    s: CommandState, status: Status, code: int | None, sig: str | None, tail: str, goal_gone: frozenset[str]
) -> list[Event]:
    out: list[Event] = []
    for a in s.awaits:
        if a.goal_id in goal_gone:
            out.append(AwaitDiscarded(goal_id=a.goal_id, command_id=s.id, reason="goal gone"))
            continue
        out.append(
            AwaitFired(
                goal_id=a.goal_id,
                command_id=s.id,
                status=status,
                exit_code=code,
                signal=sig,
                evidence=exit_evidence(s, status, code, sig, tail),
            )
        )
    return out


def decide_exit(
    s: CommandState,
    *,
    exit_code: int | None,
    signal: str | None,
    now: datetime,
    output: OutputFacts,
    goal_gone: frozenset[str] = frozenset(),
    error: str | None = None,
) -> list[Event]:
    """The process exited: its one terminal event plus every outstanding await fired, or ``[]`` if recorded.

    A termination claim (terminate, kill, timeout, until) makes it ``terminated``; otherwise ``exited``
    with the process's own code and signal (SIGINT included: an interrupt is no termination claim).
    """
    if not s.running:
        return []
    last_error = error
    if s.claim is None:
        status: Status = "exited"
        reason: EndReason = "exit"
        code, sig = exit_code, signal or (s.signal if s.signal == "SIGINT" else None)
    else:
        status, reason = "terminated", "terminate"
        if s.claim in ("timeout", "until"):
            reason = s.claim
        code = (
            exit_code
            if exit_code is not None
            else (EXIT_CODE_KILL if s.claim == "kill" else EXIT_CODE_TERMINATE)
        )
        sig = s.signal or signal or "SIGTERM"
        if s.claim == "timeout":
            last_error = (
                f"Command timed out after {s.timeout_seconds}s (timeoutSeconds deadline reached; "
                "terminated via the standard SIGTERM→SIGKILL path)."
            )
        elif s.claim == "until" and s.watch is not None:
            last_error = f'Watch until pattern "{s.watch.until}" matched; command stopped (untilAction=stop).'
    exited = CommandExited(
        command_id=s.id,
        status=status,
        end_reason=reason,
        exit_code=code,
        signal=sig,
        last_error=last_error,
        output_bytes=output.output_bytes,
        stream_bytes=output.stream_bytes,
        truncated=output.truncated,
        ended_at=_iso(now),
    )
    return [exited, *_fire_exit(s, status, code, sig, output.tail, goal_gone)]


def decide_fire_outstanding(s: CommandState, *, output: OutputFacts) -> list[Event]:
    """Fire the awaits still outstanding on a command that has already ended (an await raced its exit)."""
    if s.running:
        return []
    return _fire_exit(s, s.status, s.exit_code, s.signal, output.tail, frozenset())


def decide_missing(s: CommandState, *, now: datetime, output: OutputFacts) -> list[Event]:
    """Reconcile: recorded running, but no owner is alive. ``timeout`` when the deadline had passed."""
    if not s.running:
        return []
    base = "Host restarted or handle lost — no live execution found"
    reason: EndReason = "missing"
    if s.deadline_at is not None and parse_rfc3339(s.deadline_at) <= now:
        reason = "timeout"
        msg = (
            f"{base} (timeoutSeconds={s.timeout_seconds}s deadline {s.deadline_at} already passed; treated as "
            "missing, timeout elapsed). Output log retained; remove to clean up."
        )
    else:
        msg = f"{base}. Output log retained; remove to clean up."
    exited = CommandExited(
        command_id=s.id,
        status="missing",
        end_reason=reason,
        last_error=msg,
        output_bytes=output.output_bytes,
        stream_bytes=output.stream_bytes,
        truncated=output.truncated,
        ended_at=_iso(now),
    )
    return [exited, *_fire_exit(s, "missing", None, None, output.tail, frozenset())]


def decide_signal(s: CommandState, signal: SignalName, reason: SignalReason) -> list[Event]:
    """A signal claim on a running command (nothing once it has ended).

    :raises CommandStateError: with the reference's message when the command is not running.
    """
    if not s.running:
        what = {"interrupt": "nothing to interrupt", "kill": "nothing to kill"}.get(
            reason, "nothing to terminate"
        )
        raise CommandStateError(f"Command is {s.status}; {what}.")
    return [SignalSent(command_id=s.id, signal=signal, reason=reason)]


def decide_until_stop(s: CommandState) -> list[Event]:
    """The until line matched with action ``stop``: record it and claim the termination as ``until``."""
    if not s.running or s.watch is None or s.claim == "timeout":
        return []
    return [
        UntilStopped(command_id=s.id, until=s.watch.until),
        SignalSent(command_id=s.id, signal="SIGTERM", reason="until"),
    ]


def decide_remove(s: CommandState | None) -> list[Event]:
    """Remove a finished command and cancel the awaits that pointed at it.

    :raises CommandNotFoundError: when there is no such command.
    :raises CommandStateError: while it runs (terminate ≠ remove).
    """
    if s is None or s.removed:
        raise CommandNotFoundError()
    if s.running:
        raise CommandStateError(
            f'Command "{s.title}" is still running — terminate it first (terminate ≠ remove).'
        )
    cancelled: list[Event] = [
        AwaitCancelled(goal_id=a.goal_id, command_id=s.id, reason="command removed") for a in s.awaits
    ]
    return [*cancelled, CommandRemoved(command_id=s.id)]


def decide_write(s: CommandState | None, size: int) -> list[Event]:
    """:raises CommandNotFoundError, CommandStateError: with the reference's messages."""
    if s is None or s.removed:
        raise CommandNotFoundError()
    if not s.running:
        raise CommandStateError(f"Command is {s.status}; only running commands accept input.")
    return [InputWritten(command_id=s.id, bytes=size)]


def decide_watch(s: CommandState, spec: WatchSpec | None) -> list[Event]:
    """Set, replace (counters reset) or clear (``None``) a running command's watch.

    :raises CommandStateError: when it is not running; :raises UsageError: for a bad spec.
    """
    if not s.running:
        raise CommandStateError(f"Command is {s.status}; watch is meaningless after exit.")
    if spec is None or spec.empty:
        return [WatchSuspended(command_id=s.id, reason="cleared", pushes=s.watch_pushes)]
    validate_watch(spec)
    return [WatchSet(command_id=s.id, watch=spec)]


def decide_await(
    s: CommandState | None,
    *,
    goal_id: str,
    until: str | None,
    ignore_case: bool,
    output: OutputFacts,
    matched: list[str] | None = None,
    raced: bool = False,
) -> tuple[list[Event], str]:
    """Register an await, or fire it at once when its condition already holds.

    ``matched`` are retained-log lines matching ``until`` (the owner scans the log; ``None`` = not scanned).
    ``raced`` says the command ended while this request was being registered.

    :raises CommandNotFoundError, UsageError: with the reference's messages; nothing is recorded.
    """
    if s is None or s.removed:
        raise CommandNotFoundError()
    if until is not None:
        if until == "":
            raise UsageError("Await 'until' must be a non-empty regex.")
        compile_watch_regex("until", until, ignore_case)
    if s.await_for(goal_id) is not None:
        return [], f'Already awaiting "{s.title}" for goal "{goal_id}".'
    if not s.running:
        fired = _fire_exit(
            _replace(s, awaits=(AwaitState(goal_id=goal_id),)),
            s.status,
            s.exit_code,
            s.signal,
            output.tail,
            frozenset(),
        )
        fired = [
            msgspec.structs.replace(f, immediate=True) if isinstance(f, AwaitFired) else f for f in fired
        ]
        if raced:
            return (
                fired,
                f'Command "{s.title}" exited while registering; wake-up delivered to goal "{goal_id}".',
            )
        return fired, f'Command "{s.title}" already {s.status}; wake-up delivered to goal "{goal_id}".'
    if until is not None and matched:
        ev = AwaitFired(
            goal_id=goal_id,
            command_id=s.id,
            status=s.status,
            until=until,
            matched_lines=matched[:MAX_UNTIL_EVIDENCE_LINES],
            immediate=True,
            evidence=until_evidence(s, until, matched, output.tail),
        )
        return [
            ev
        ], f'Pattern "{until}" already present in "{s.title}" output; wake-up delivered to goal "{goal_id}".'
    req = AwaitRequested(goal_id=goal_id, command_id=s.id, until=until, ignore_case=ignore_case)
    if until is not None:
        return [req], (
            f'Goal "{goal_id}" now awaits pattern "{until}" in "{s.title}" (fires once on first match; '
            "the command keeps running)."
        )
    return [req], f'Goal "{goal_id}" now awaits "{s.title}" (fires once on exit).'


def decide_until_fired(s: CommandState, goal_id: str, matched: list[str], tail: str) -> list[Event]:
    """An until-await's line arrived: fire it, once (``[]`` if already consumed)."""
    a = s.await_for(goal_id)
    if a is None or a.until is None or not s.running:
        return []
    return [
        AwaitFired(
            goal_id=goal_id,
            command_id=s.id,
            status=s.status,
            until=a.until,
            matched_lines=matched[:MAX_UNTIL_EVIDENCE_LINES],
            evidence=until_evidence(s, a.until, matched, tail),
        )
    ]


def decide_cancel_goal_awaits(s: CommandState, goal_id: str, reason: str) -> list[Event]:
    """A goal was paused or cleared: its await on this command is cancelled (``[]`` if none)."""
    if s.await_for(goal_id) is None:
        return []
    return [AwaitCancelled(goal_id=goal_id, command_id=s.id, reason=reason)]


def decide_discard(s: CommandState, goal_id: str, reason: str) -> list[Event]:
    """An await whose goal is gone is discarded, not fired (``[]`` if none)."""
    if s.await_for(goal_id) is None:
        return []
    return [AwaitDiscarded(goal_id=goal_id, command_id=s.id, reason=reason)]
