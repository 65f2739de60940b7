"""Command sessions and awaits, pure: decide what happens next to a command folded from its stream.

Nothing here does I/O or reads a clock: the owner (``loopd_es.procs``) reads the world (exit status, the
output tail, the time) and passes it in; the deciders return the events to append. Exactly-once rests on
two things: a decider returns nothing for a transition that already happened (a second exit, a consumed
await), and the caller appends at the stream version it folded, re-folding and re-deciding on conflict.

Messages are the reference system's own (docs/reference/loopd.md#s3-17, #s3-18), so users of the plugin
recognise them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import msgspec

from ..clock import stamp
from ..errors import UsageError
from ..events.command import (
    AwaitCancelled,
    AwaitDiscarded,
    AwaitFired,
    AwaitRequested,
    CommandExited,
    CommandRemoved,
    CommandResized,
    EndReason,
    InputWritten,
    SignalName,
    SignalReason,
    SignalSent,
    Status,
    UntilStopped,
    WatchSet,
    WatchSpec,
    WatchSuspended,
)
from .command_checks import (
    compile_read_pattern,
    compile_watch_regex,
    is_dangerous_regex,
    validate_process,
    validate_size,
    validate_start,
    validate_watch,
)
from .command_state import (
    EXIT_CODE_KILL,
    EXIT_CODE_TERMINATE,
    MAX_AWAIT_TAIL_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_UNTIL_EVIDENCE_LINES,
    TERMINATE_GRACE_S,
    AwaitState,
    CommandNotFoundError,
    CommandState,
    CommandStateError,
    argv_text,
    evolve,
    fold,
)

if TYPE_CHECKING:
    from ..events.base import Event

__all__ = [
    "EXIT_CODE_KILL",
    "EXIT_CODE_TERMINATE",
    "MAX_AWAIT_TAIL_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_UNTIL_EVIDENCE_LINES",
    "TERMINATE_GRACE_S",
    "AwaitState",
    "CommandNotFoundError",
    "CommandState",
    "CommandStateError",
    "OutputFacts",
    "argv_text",
    "cap_utf8",
    "compile_read_pattern",
    "compile_watch_regex",
    "deadline_for",
    "decide_await",
    "decide_cancel_goal_awaits",
    "decide_discard",
    "decide_exit",
    "decide_fire_outstanding",
    "decide_missing",
    "decide_remove",
    "decide_resize",
    "decide_signal",
    "decide_until_fired",
    "decide_until_stop",
    "decide_watch",
    "decide_write",
    "evolve",
    "exit_evidence",
    "fold",
    "is_dangerous_regex",
    "until_evidence",
    "validate_size",
    "validate_process",
    "validate_start",
    "validate_watch",
]
"""The state and the checks live in :mod:`.command_state` and :mod:`.command_checks`; this module re-exports
them so callers keep one import for the command domain."""

_replace = msgspec.structs.replace


# -- decisions ------------------------------------------------------------------------------------


class OutputFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the owner knows of the output when it decides: sizes and a sanitised tail (≤ 4 KiB)."""

    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    tail: str = ""


def deadline_for(started: datetime, timeout_seconds: int | None) -> datetime | None:
    return None if timeout_seconds is None else started + timedelta(seconds=timeout_seconds)


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
    watch_dropped: int | None = None,
) -> list[Event]:
    """The process exited: its one terminal event plus every outstanding await fired, or ``[]`` if recorded.

    ``watch_dropped``: a suspended watch's count of dropped lines, recorded when it grew since the suspension.

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
        ended_at=now,
        watch_dropped_lines=watch_dropped if watch_dropped != s.watch_dropped_lines else None,
    )
    return [exited, *_fire_exit(s, status, code, sig, output.tail, goal_gone)]


def decide_fire_outstanding(s: CommandState, *, output: OutputFacts) -> list[Event]:
    """Fire the awaits still outstanding on a command that has already ended (an await raced its exit)."""
    if s.running:
        return []
    return _fire_exit(s, s.status, s.exit_code, s.signal, output.tail, frozenset())


def decide_missing(s: CommandState, *, now: datetime, output: OutputFacts) -> list[Event]:
    """Reconcile: recorded running, but no owner is alive. End reason ``missing`` either way, as in the reference
    (docs/reference/loopd.md#s2-4); a deadline already passed is said in ``last_error``."""
    if not s.running:
        return []
    base = "Host restarted or handle lost — no live execution found"
    reason: EndReason = "missing"
    if s.deadline_at is not None and s.deadline_at <= now:
        msg = (
            f"{base} (timeoutSeconds={s.timeout_seconds}s deadline {stamp(s.deadline_at)} already passed; treated as "
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
        ended_at=now,
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


def decide_resize(s: CommandState | None, cols: int, rows: int) -> list[Event]:
    """Store a terminal size, running or not (docs/reference/loopd.md#s3-17: "size always stored").

    :raises CommandNotFoundError: when there is no such command; :raises UsageError: for a size no terminal has.
    """
    if s is None or s.removed:
        raise CommandNotFoundError()
    validate_size(cols, rows)
    return [CommandResized(command_id=s.id, cols=cols, rows=rows)]


def decide_write(s: CommandState | None, size: int) -> list[Event]:
    """:raises CommandNotFoundError, CommandStateError: with the reference's messages."""
    if s is None or s.removed:
        raise CommandNotFoundError()
    if not s.running:
        raise CommandStateError(f"Command is {s.status}; only running commands accept input.")
    return [InputWritten(command_id=s.id, bytes=size)]


def decide_watch(s: CommandState, spec: WatchSpec, *, clear: bool = False) -> list[Event]:
    """Set or replace (counters reset) a running command's watch, or ``clear`` it (docs/reference/loopd.md#s3-17).

    As in the reference, the spec is checked first, even for a clear, and only ``clear`` clears: a spec with
    neither filter nor until replaces the watch with one that watches nothing.

    :raises CommandStateError: when it is not running; :raises UsageError: for a bad spec.
    """
    if not s.running:
        raise CommandStateError(f"Command is {s.status}; watch is meaningless after exit.")
    validate_watch(spec)
    if clear:
        return [WatchSuspended(command_id=s.id, reason="cleared", pushes=s.watch_pushes)]
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
    owner_session_id: str | None = None,
    goal_name: str | None = None,
) -> tuple[list[Event], str]:
    """Register an await, or fire it at once when its condition already holds.

    ``matched`` are retained-log lines matching ``until`` (the owner scans the log; ``None`` = not scanned).
    ``raced`` says the command ended while this request was being registered. ``goal_name`` is how the
    messages name the goal (its id when not given); ``owner_session_id`` is recorded as the requester.

    :raises CommandNotFoundError, UsageError: with the reference's messages; nothing is recorded.
    """
    if s is None or s.removed:
        raise CommandNotFoundError()
    if until is not None:
        if until == "":
            raise UsageError("Await 'until' must be a non-empty regex.")
        compile_watch_regex("until", until, ignore_case)
    name = goal_name or goal_id
    if s.await_for(goal_id) is not None:
        return [], f'Already awaiting "{s.title}" for goal "{name}".'
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
                f'Command "{s.title}" exited while registering; wake-up delivered to goal "{name}".',
            )
        return fired, f'Command "{s.title}" already {s.status}; wake-up delivered to goal "{name}".'
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
        ], f'Pattern "{until}" already present in "{s.title}" output; wake-up delivered to goal "{name}".'
    req = AwaitRequested(
        goal_id=goal_id,
        command_id=s.id,
        until=until,
        ignore_case=ignore_case,
        owner_session_id=owner_session_id,
    )
    if until is not None:
        return [req], (
            f'Goal "{name}" now awaits pattern "{until}" in "{s.title}" (fires once on first match; '
            "the command keeps running)."
        )
    return [req], f'Goal "{name}" now awaits "{s.title}" (fires once on exit).'


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
