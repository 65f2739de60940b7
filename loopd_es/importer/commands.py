"""Map loopd command sessions and awaits (``state.commands``, ``state.commandAwaits``, ``command.*`` lines).

Every command gets a ``command-<id>`` stream: ``command.started`` from the snapshot record (its ledger line
gives the time), the ledger's watch, until, exit and await lines in file order, then what the snapshot
says and the fold does not show yet (the terminal status of a reconciled ``missing`` command, the watch
counters, outstanding awaits). All commands are built side by side because loopd's pause cancels a
goal's awaits with one ledger line that names no command. Commands loopd has removed keep their ledger
history and end with ``command.removed``; their argv and cwd are unknown and recorded as empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from ..domain import command as dc
from ..events import command as c
from .builder import Emitted
from .source import LAwaitCancelled, LCommand, typed

if TYPE_CHECKING:
    from pathlib import Path

    from ..events.base import Event
    from .source import LedgerLine, RefAwait, RefCommand

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
    def __init__(self, command_id: str, snap: RefCommand | None, warnings: list[str]) -> None:
        self.id = command_id
        self.snap = snap
        self.items: list[Emitted] = []
        self.state: dc.CommandState | None = None
        self.warnings = warnings

    def emit(self, payload: Event, source: str) -> None:
        self.state = dc.evolve(self.state, payload)
        self.items.append(Emitted(payload, source))

    def outstanding(self, goal_id: str) -> bool:
        return self.state is not None and self.state.await_for(goal_id) is not None


def build_commands(
    commands: list[RefCommand],
    awaits: list[RefAwait],
    lines: list[LedgerLine],
    ledger_path: Path,
    warnings: list[str],
) -> dict[str, list[Emitted]]:
    """The events of every command stream, by command id."""
    snaps = {cmd.id: cmd for cmd in commands}
    started = {ln.command_id: ln for ln in lines if ln.type == "command.started" and ln.command_id}
    builders: dict[str, _Cmd] = {}
    for cid in [*snaps, *(k for k in started if k not in snaps)]:
        b = builders[cid] = _Cmd(cid, snaps.get(cid), warnings)
        _start(b, started.get(cid), ledger_path)
    for line in lines:
        if line.type == "command.started":
            continue
        if line.type == "command.await-cancelled" and not line.command_id:
            cancel = typed(line, LAwaitCancelled, ledger_path)
            for b in builders.values():
                if b.outstanding(cancel.goal_id):
                    b.emit(
                        c.AwaitCancelled(goal_id=cancel.goal_id, command_id=b.id, reason=cancel.reason),
                        f"ledger:{line.line}",
                    )
            continue
        b_or_none = builders.get(line.command_id or "")
        if b_or_none is None:
            warnings.append(
                f"command {line.command_id}: ledger line {line.line} ({line.type}) names a command "
                "with no command.started line and no state.json record; left out"
            )
            continue
        _ledger(b_or_none, line, ledger_path)
    warnings.extend(
        f"await of goal {a.goal_id} on command {a.command_id}: the command is in neither state.json nor the "
        "ledger; left out"
        for a in awaits
        if a.command_id not in builders
    )
    for b in builders.values():
        _reconcile(b, [a for a in awaits if a.command_id == b.id])
    return {cid: b.items for cid, b in builders.items()}


def _start(b: _Cmd, line: LedgerLine | None, where: Path) -> None:
    snap = b.snap
    at = line.timestamp if line is not None else (snap.created_at if snap else "")
    source = f"ledger:{line.line}" if line is not None else "state:command"
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
                started_at=at,
            ),
            source,
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
            deadline_at=snap.deadline_at,
            cols=snap.cols or 80,
            rows=snap.rows or 24,
            watch=watch,
            goal_id=snap.goal_id,
            notify_on_exit=snap.notify_on_exit,
            started_at=at,
        ),
        source,
    )


def _ledger(b: _Cmd, line: LedgerLine, where: Path) -> None:
    t, src, cid = line.type, f"ledger:{line.line}", b.id
    f = typed(line, LCommand, where)
    s = b.state
    assert s is not None
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
            src,
        )
    elif t == "command.watch-suspended" and (reason := _WATCH_REASONS.get(f.reason or "")) is not None:
        b.emit(
            c.WatchSuspended(
                command_id=cid,
                reason=reason,
                pushes=f.pushes,
                dropped=f.dropped,
                at_exit=f.at_exit,
            ),
            src,
        )
    elif t == "command.until-stopped":
        b.emit(c.UntilStopped(command_id=cid, until=f.until or ""), src)
    elif t == "command.exited":
        if not s.running:
            return  # loopd appends one per host exit report, also after a terminal write; the first one counts
        snap = b.snap
        if snap is not None and snap.status == "running":
            b.warnings.append(
                f"command {cid}: ledger line {line.line} says it exited but state.json has it "
                "running; state.json wins, line left out"
            )
            return
        b.emit(_exited(snap, f.exit_code, line.timestamp), src)
    elif t == "command.await-requested":
        b.emit(c.AwaitRequested(goal_id=f.goal_id or "", command_id=cid, until=f.until), src)
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
            src,
        )
    elif t == "command.await-discarded":
        b.emit(c.AwaitDiscarded(goal_id=f.goal_id or "", command_id=cid, reason=f.reason or ""), src)
    elif t == "command.await-cancelled":
        b.emit(c.AwaitCancelled(goal_id=f.goal_id or "", command_id=cid, reason=f.reason or ""), src)
    elif t not in ("command.accepted", "command.rejected"):
        b.warnings.append(
            f"command {cid}: ledger line {line.line} has type {t!r}, which this import does not "
            "know; left out"
        )


def _exited(snap: RefCommand | None, exit_code: int | None, at: str) -> c.CommandExited:
    if snap is None or snap.status == "running":
        return c.CommandExited(
            command_id=snap.id if snap else "",
            status="exited",
            end_reason="exit",
            exit_code=exit_code,
            ended_at=at,
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
        ended_at=at or snap.ended_at or "",
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
                        goal_id=goal_id, command_id=cid, until=a.until, ignore_case=bool(a.ignore_case)
                    ),
                    "state:commandAwaits",
                )
        for held in b.state.awaits if b.state else ():
            if held.goal_id not in wanted:
                b.emit(
                    c.AwaitDiscarded(
                        goal_id=held.goal_id, command_id=cid, reason="not outstanding in state.json at import"
                    ),
                    "state:commandAwaits",
                )
        if snap.status != "running" and b.state is not None and b.state.running:
            b.emit(_exited(snap, None, snap.ended_at or ""), "state:command.status")
    elif b.state is not None and not b.state.removed:
        b.emit(c.CommandRemoved(command_id=cid), "state:absent")


def _watch(b: _Cmd, snap: RefCommand) -> None:
    ws, s = snap.watch_state, b.state
    if ws is None or s is None or s.watch is None:
        return
    if (s.watch_state, s.watch_pushes, s.watch_matches) == (ws.state, ws.pushes, ws.matches):
        return
    src = "state:command.watchState"
    if ws.state in ("flood-suspended", "budget-exhausted"):
        reason: Literal["flood", "budget"] = "flood" if ws.state == "flood-suspended" else "budget"
        if s.watch_pushes != ws.pushes or s.watch_matches != ws.matches:
            b.emit(c.WatchMatched(command_id=b.id, lines=0, matches=ws.matches, pushes=ws.pushes), src)
        b.emit(
            c.WatchSuspended(command_id=b.id, reason=reason, pushes=ws.pushes, dropped=ws.dropped_lines), src
        )
    else:
        until = snap.watch_until if ws.state == "until-matched" else None
        b.emit(
            c.WatchMatched(command_id=b.id, lines=0, matches=ws.matches, pushes=ws.pushes, until=until), src
        )
