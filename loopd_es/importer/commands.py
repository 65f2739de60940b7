"""Map loopd command sessions and awaits (``state.commands``, ``state.commandAwaits``, ``command.*`` lines).

Every command gets a ``command-<id>`` stream: ``command.started`` from the snapshot record (its ledger line
gives the time), the ledger's watch, until, exit and await lines in file order, then what the snapshot
says and the fold does not show yet (the terminal status of a reconciled ``missing`` command, the watch
counters, outstanding awaits). All commands are built side by side because loopd's pause cancels a
goal's awaits with one ledger line that names no command. Commands loopd has removed keep their id and
ledger history and end with ``command.removed``; their argv and cwd are unknown and recorded as empty.
A command the snapshot shows running was running when loopd last wrote: its process is not ours, so it
is listed as needing reconciliation (``import-loopd --reconcile`` settles it through
:func:`loopd_es.procs.service.reconcile`, which fires its awaits once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from ..clock import parse_or_none, parse_rfc3339
from ..domain import command as dc
from ..events import command as c
from .builder import Emitted, Report, Sourced, exact, from_line
from .ledger import LAwaitCancelled, LCommand, typed

if TYPE_CHECKING:
    from pathlib import Path

    from ..events.base import Event
    from .ledger import LedgerLine
    from .source import RefAwait, RefCommand

_WATCH_REASONS: Final[dict[str, Literal["budget", "flood", "cleared"]]] = {
    "budget": "budget",
    "flood": "flood",
    "cleared": "cleared",
}
_END_REASONS: Final[dict[str, c.EndReason]] = {
    "exited": "exit",
    "terminated": "terminate",
    "missing": "missing",
}


class _Cmd:
    def __init__(self, command_id: str, snap: RefCommand | None, report: Report) -> None:
        self.id = command_id
        self.snap = snap
        self.items: list[Emitted] = []
        self.state: dc.CommandState | None = None
        self.report = report
        self.awaits: dict[str, RefAwait] = {}
        """Goal id -> the snapshot's outstanding await on this command (``state.commandAwaits``)."""
        self.requests: dict[str, int] = {}
        """Goal id -> index of its outstanding ``command.await-requested`` (the cause of the await's end)."""

    def emit(
        self, payload: Event, source: str, *, at: str = "", at_from: str = "", cause: int | str | None = None
    ) -> int:
        self.state = dc.evolve(self.state, payload)
        when = at or (self.items[-1].at if self.items else "")
        self.items.append(Emitted(payload, source, when, at_from or (source if at else "previous"), cause))
        if isinstance(payload, c.AwaitRequested):
            self.requests[payload.goal_id] = len(self.items) - 1
        return len(self.items) - 1

    def skip(self, line: LedgerLine, reason: str) -> None:
        self.report.skip(f"command {self.id}", line, reason)

    def outstanding(self, goal_id: str) -> bool:
        return self.state is not None and self.state.await_for(goal_id) is not None


def build_commands(
    commands: list[RefCommand],
    awaits: list[RefAwait],
    lines: list[LedgerLine],
    ledger_path: Path,
    report: Report,
    starters: dict[str, str] | None = None,
    as_of: str = "",
) -> dict[str, list[Emitted]]:
    """The events of every command stream, by command id.

    ``starters`` maps a command id to the event id of the control request that started it, when known.
    ``as_of`` is the source's last write: a command loopd still shows running past its deadline by then
    had lost its host's timer, and ends ``missing`` with end reason ``timeout``, as loopd's reconciler says.
    """
    snaps = {cmd.id: cmd for cmd in commands}
    started = {ln.command_id: ln for ln in lines if ln.type == "command.started" and ln.command_id}
    builders: dict[str, _Cmd] = {}
    for cid in [*snaps, *(k for k in started if k not in snaps)]:
        b = builders[cid] = _Cmd(cid, snaps.get(cid), report)
        b.awaits = {a.goal_id: a for a in awaits if a.command_id == cid}
        _start(b, started.get(cid), ledger_path, (starters or {}).get(cid))
    for line in lines:
        if line.type == "command.started":
            if started.get(line.command_id or "") is not line:
                report.skip(
                    f"command {line.command_id}", line, "a second command.started for the same command id"
                )
            continue
        if line.type == "command.await-cancelled" and not line.command_id:
            cancel = typed(line, LAwaitCancelled, ledger_path)
            hit = False
            for b in builders.values():
                if b.outstanding(cancel.goal_id):
                    hit = True
                    b.emit(
                        c.AwaitCancelled(goal_id=cancel.goal_id, command_id=b.id, reason=cancel.reason),
                        cause=b.requests.get(cancel.goal_id),
                        **from_line(line),
                    )
            if not hit:
                report.skip(f"goal {cancel.goal_id}", line, "no await of that goal was outstanding to cancel")
            continue
        b_or_none = builders.get(line.command_id or "")
        if b_or_none is None:
            report.skip(
                f"command {line.command_id}",
                line,
                "names a command with no command.started line and no state.json record",
            )
            continue
        _ledger(b_or_none, line, ledger_path)
    report.warnings.extend(
        f"await of goal {a.goal_id} on command {a.command_id}: the command is in neither state.json nor the "
        "ledger; left out"
        for a in awaits
        if a.command_id not in builders
    )
    for b in builders.values():
        _reconcile(b, [a for a in awaits if a.command_id == b.id])
        _deadline(b, as_of)
    return {cid: b.items for cid, b in builders.items()}


def needs_reconcile(commands: list[RefCommand], built: dict[str, list[Emitted]]) -> tuple[str, ...]:
    """Commands the snapshot shows running and the import did not end: their process is a loopd host's."""
    return tuple(
        cmd.id
        for cmd in commands
        if cmd.status == "running"
        and not any(isinstance(item.payload, c.CommandExited) for item in built.get(cmd.id, ()))
    )


def past(deadline: str | None, as_of: str) -> bool:
    """True when ``deadline`` is at or before ``as_of`` (False when either is missing or unreadable)."""
    if not deadline or not as_of:
        return False
    try:
        return parse_rfc3339(deadline) <= parse_rfc3339(as_of)
    except ValueError:
        return False


def _deadline(b: _Cmd, as_of: str) -> None:
    snap, s = b.snap, b.state
    if snap is None or s is None or not s.running or not past(snap.deadline_at, as_of):
        return
    b.emit(
        c.CommandExited(
            command_id=b.id,
            status="missing",
            end_reason="timeout",
            last_error=(
                f"Host restarted or handle lost — no live execution found (timeoutSeconds="
                f"{snap.timeout_seconds}s deadline {snap.deadline_at} already passed; treated as missing, "
                "timeout elapsed). Output log retained; remove to clean up."
            ),
            output_bytes=snap.output_bytes,
            stream_bytes=snap.stream_bytes,
            truncated=snap.truncated,
            ended_at=parse_or_none(snap.deadline_at),
        ),
        "state:command.deadlineAt",
        at=snap.deadline_at or "",
        at_from="state:command.deadlineAt",
        cause=0,
    )
    for waiting in s.awaits:
        b.emit(
            c.AwaitFired(goal_id=waiting.goal_id, command_id=b.id, status="missing", until=waiting.until),
            "state:command.deadlineAt",
            cause=b.requests.get(waiting.goal_id),
        )


def _start(b: _Cmd, line: LedgerLine | None, where: Path, starter: str | None) -> None:
    snap = b.snap
    kw: Sourced = (
        exact(line, snap.created_at if snap else None, "state:command.createdAt")
        if line is not None
        else {
            "source": "state:command",
            "at": snap.created_at if snap else "",
            "at_from": "state:command.createdAt",
        }
    )
    at = kw["at"]
    if snap is None:
        assert line is not None
        fields = typed(line, LCommand, where)
        b.emit(
            c.CommandStarted(
                command_id=b.id,
                title=fields.title or "",
                command="",
                cwd="",
                goal_id=fields.goal_id,
                started_at=parse_or_none(at),
            ),
            cause=starter,
            **kw,
        )
        return
    watch = None
    if snap.watch_filter or snap.watch_until:
        watch = c.WatchSpec(
            filter=snap.watch_filter or "",
            until=snap.watch_until or "",
            ignore_case=bool(snap.watch_ignore_case),
            until_action=snap.watch_until_action or "stop",
        )
    b.emit(
        c.CommandStarted(
            command_id=b.id,
            title=snap.title,
            command=snap.command,
            args=list(snap.args),
            cwd=snap.cwd,
            shell=bool(snap.shell),
            env_keys=list(snap.env_keys),
            timeout_seconds=snap.timeout_seconds,
            deadline_at=parse_or_none(snap.deadline_at),
            cols=snap.cols or 80,
            rows=snap.rows or 24,
            watch=watch,
            goal_id=snap.goal_id,
            notify_on_exit=snap.notify_on_exit,
            started_at=parse_or_none(at),
            owner_session_id=snap.owner_session_id or None,
        ),
        cause=starter,
        **kw,
    )


def _ledger(b: _Cmd, line: LedgerLine, where: Path) -> None:
    t, cid = line.type, b.id
    f = typed(line, LCommand, where)
    s = b.state
    assert s is not None
    kw = from_line(line)
    if t == "command.watch-matched":
        b.emit(
            c.WatchMatched(
                command_id=cid,
                lines=f.lines,
                matches=f.matches or 0,
                pushes=f.pushes,
                until=f.until,
                at_exit=f.at_exit,
            ),
            cause=0,
            **kw,
        )
    elif t == "command.watch-suspended":
        reason = _WATCH_REASONS.get(f.reason or "")
        if reason is None:
            b.skip(line, f"watch suspension reason {f.reason!r} is not budget, flood or cleared")
            return
        b.emit(
            c.WatchSuspended(
                command_id=cid, reason=reason, pushes=f.pushes, dropped=f.dropped, at_exit=f.at_exit
            ),
            cause=0,
            **kw,
        )
    elif t == "command.until-stopped":
        b.emit(c.UntilStopped(command_id=cid, until=f.until or ""), cause=0, **kw)
    elif t == "command.exited":
        if not s.running:
            # loopd appends one per host exit report, also after a terminal write
            # (docs/reference/loopd.md#s4-1); the first one counts
            b.skip(line, "a repeated exit report: the command had already ended")
            return
        snap = b.snap
        if snap is not None and snap.status == "running":
            b.skip(line, "state.json has the command running (state.json wins)")
            return
        kw = exact(line, snap.ended_at if snap is not None else None, "state:command.endedAt")
        b.emit(_exited(b.id, snap, f.exit_code, line.timestamp), cause=0, **kw)
    elif t == "command.await-requested":
        snap_await = b.awaits.get(f.goal_id or "")  # the snapshot's record of it has the owner and case flag
        b.emit(
            c.AwaitRequested(
                goal_id=f.goal_id or "",
                command_id=cid,
                until=f.until,
                ignore_case=bool(snap_await.ignore_case) if snap_await else False,
                owner_session_id=snap_await.owner_session_id if snap_await else None,
                at=parse_or_none(_await_time(snap_await, line.timestamp)),
            ),
            cause=0,
            **kw,
        )
    elif t == "command.await-fired":
        matched = f.matched_lines if isinstance(f.matched_lines, list) else []
        b.emit(
            c.AwaitFired(
                goal_id=f.goal_id or "",
                command_id=cid,
                status=f.status or s.status,
                exit_code=f.exit_code,
                signal=f.signal,
                until=f.until,
                matched_lines=matched,
                immediate=not b.outstanding(f.goal_id or ""),
            ),
            cause=b.requests.get(f.goal_id or "") if b.outstanding(f.goal_id or "") else len(b.items) - 1,
            **kw,
        )
    elif t == "command.await-discarded":
        b.emit(
            c.AwaitDiscarded(goal_id=f.goal_id or "", command_id=cid, reason=f.reason or ""),
            cause=b.requests.get(f.goal_id or ""),
            **kw,
        )
    elif t == "command.await-cancelled":
        b.emit(
            c.AwaitCancelled(goal_id=f.goal_id or "", command_id=cid, reason=f.reason or ""),
            cause=b.requests.get(f.goal_id or ""),
            **kw,
        )
    else:
        b.skip(line, f"type {t!r} is not one this import knows")


def _await_time(snap: RefAwait | None, logged: str) -> str:
    """The request time: the snapshot's ``createdAt`` when that await is this line's (written within a
    second before it), else the line's own time."""
    if snap is None or not snap.created_at:
        return logged
    try:
        gap = (parse_rfc3339(logged) - parse_rfc3339(snap.created_at)).total_seconds()
    except ValueError:
        return logged
    return snap.created_at if 0 <= gap <= 1 else logged


def _exited(command_id: str, snap: RefCommand | None, exit_code: int | None, at: str) -> c.CommandExited:
    if snap is None or snap.status == "running":
        return c.CommandExited(
            command_id=command_id,
            status="exited",
            end_reason="exit",
            exit_code=exit_code,
            ended_at=parse_or_none(at),
        )
    return c.CommandExited(
        command_id=snap.id,
        status=snap.status,
        end_reason=snap.end_reason or _default_end(snap.status),
        exit_code=snap.exit_code if snap.exit_code is not None else exit_code,
        signal=snap.signal,
        last_error=snap.last_error,
        output_bytes=snap.output_bytes,
        stream_bytes=snap.stream_bytes,
        truncated=snap.truncated,
        ended_at=parse_or_none(snap.ended_at or at),  # the state's value: the ledger line is written after it
        owner_notified_at=parse_or_none(snap.owner_notified_at),
    )


def _default_end(status: c.Status) -> c.EndReason:
    return _END_REASONS.get(status, "exit")


def _reconcile(b: _Cmd, awaits: list[RefAwait]) -> None:
    snap, cid = b.snap, b.id
    if snap is not None:
        _watch(b, snap)
        wanted = {a.goal_id: a for a in awaits}
        for goal_id, a in wanted.items():
            if not b.outstanding(goal_id):
                b.emit(
                    c.AwaitRequested(
                        goal_id=goal_id,
                        command_id=cid,
                        until=a.until,
                        ignore_case=bool(a.ignore_case),
                        owner_session_id=a.owner_session_id,
                        at=parse_or_none(a.created_at),
                    ),
                    "state:commandAwaits",
                    at=a.created_at,
                    at_from="state:commandAwaits.createdAt" if a.created_at else "",
                    cause=0,
                )
        for held in b.state.awaits if b.state else ():
            if held.goal_id not in wanted:
                b.emit(
                    c.AwaitDiscarded(
                        goal_id=held.goal_id, command_id=cid, reason="not outstanding in state.json at import"
                    ),
                    "state:commandAwaits",
                    cause=b.requests.get(held.goal_id),
                )
        if snap.status != "running" and b.state is not None and b.state.running:
            b.emit(
                _exited(cid, snap, None, snap.ended_at or ""),
                "state:command.status",
                at=snap.ended_at or "",
                at_from="state:command.endedAt" if snap.ended_at else "",
                cause=0,
            )
    elif b.state is not None:  # removed in loopd: awaits left on it are discarded with a line each, reported
        left = dict.fromkeys([*(a.goal_id for a in b.state.awaits), *(a.goal_id for a in awaits)])
        for goal_id in left:
            b.emit(
                c.AwaitDiscarded(goal_id=goal_id, command_id=cid, reason="command removed"),
                "state:commandAwaits",
                cause=b.requests.get(goal_id),
            )
            b.report.warn(f"await of goal {goal_id} on removed command {cid}: discarded (command removed)")
        if not b.state.removed:
            b.emit(c.CommandRemoved(command_id=cid), "state:absent")


def _watch(b: _Cmd, snap: RefCommand) -> None:
    ws, s = snap.watch_state, b.state
    if ws is None or s is None or s.watch is None:
        return
    if (s.watch_state, s.watch_pushes, s.watch_matches) == (ws.state, ws.pushes, ws.matches):
        return
    src = "state:command.watchState"
    when = {"at": snap.updated_at, "at_from": "state:command.updatedAt"} if snap.updated_at else {}
    if ws.state in ("flood-suspended", "budget-exhausted"):
        reason: Literal["flood", "budget"] = "flood" if ws.state == "flood-suspended" else "budget"
        if s.watch_pushes != ws.pushes or s.watch_matches != ws.matches:
            b.emit(
                c.WatchMatched(command_id=b.id, lines=0, matches=ws.matches, pushes=ws.pushes), src, **when
            )
        b.emit(
            c.WatchSuspended(command_id=b.id, reason=reason, pushes=ws.pushes, dropped=ws.dropped_lines),
            src,
            **when,
        )
    else:
        until = snap.watch_until if ws.state == "until-matched" else None
        b.emit(
            c.WatchMatched(command_id=b.id, lines=0, matches=ws.matches, pushes=ws.pushes, until=until),
            src,
            **when,
        )
