"""Owner control requests of a loopd project: ``state.commandLedger`` and the ``command.accepted/rejected`` lines.

Each request becomes a ``control-<requestID>`` stream (``control.requested``, then ``control.completed``), and
is named as the cause of what it did: a pause or resume (matched in :mod:`.goals`) or a ``cmd_start``'s
command (:func:`command_starters`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..clock import parse_rfc3339
from ..events.imported import ControlCompleted, ControlRequested
from .builder import Emitted, Report, from_line
from .ledger import LControl, typed

if TYPE_CHECKING:
    from pathlib import Path

    from .ledger import LedgerLine
    from .source import RefControl


def build_controls(
    entries: list[RefControl], lines: list[LedgerLine], where: Path, report: Report
) -> dict[str, list[Emitted]]:
    """One ``control-<requestID>`` stream per owner control request: requested, then its outcome.

    loopd keeps the last 100 handled requests in ``state.commandLedger`` (docs/reference/loopd.md#s1-9);
    ``command.accepted`` /
    ``command.rejected`` ledger lines (declared, not written by 1.12.2) add or complete them.
    """
    out: dict[str, list[Emitted]] = {}
    for e in entries:
        out[e.request_id] = [
            Emitted(
                ControlRequested(
                    request_id=e.request_id, command=e.command, goal_id=e.goal_id, at=e.accepted_at
                ),
                "state:commandLedger",
                e.accepted_at,
                "state:commandLedger.acceptedAt",
            ),
            Emitted(
                ControlCompleted(
                    request_id=e.request_id, command=e.command, goal_id=e.goal_id, at=e.completed_at
                ),
                "state:commandLedger",
                e.completed_at,
                "state:commandLedger.completedAt",
                0,
            ),
        ]
    for line in lines:
        fields = typed(line, LControl, where)
        items = out.setdefault(fields.request_id, [])
        goal = line.goal_id
        if line.type == "command.accepted":
            if items:
                report.skip(
                    f"control request {fields.request_id}", line, "already in state.json's commandLedger"
                )
                continue
            items.append(
                Emitted(
                    ControlRequested(
                        request_id=fields.request_id, command=fields.command, goal_id=goal, at=line.timestamp
                    ),
                    **from_line(line),
                )
            )
        else:
            items.append(
                Emitted(
                    ControlCompleted(
                        request_id=fields.request_id,
                        command=fields.command,
                        goal_id=goal,
                        outcome="rejected",
                        reason=fields.reason,
                        at=line.timestamp,
                    ),
                    **from_line(line),
                    cause=0 if items else None,
                )
            )
    return {rid: items for rid, items in out.items() if items}


def command_starters(
    entries: list[RefControl], lines: list[LedgerLine], control_ids: dict[str, str]
) -> dict[str, str]:
    """Command id -> the ``cmd_start`` control request handled just before its ``command.started`` line."""
    found: dict[str, str] = {}
    starts = [e for e in entries if e.command == "cmd_start"]
    for line in lines:
        if line.type != "command.started" or not line.command_id:
            continue
        try:
            ts = parse_rfc3339(line.timestamp)
        except ValueError:
            continue
        for e in starts:
            try:
                accepted, completed = parse_rfc3339(e.accepted_at), parse_rfc3339(e.completed_at)
            except ValueError:
                continue
            if accepted <= ts <= completed and e.goal_id == line.fields.get("goalID"):
                found[line.command_id] = control_ids[e.request_id]
    return found
