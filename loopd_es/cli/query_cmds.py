"""Queries from the read models: ``goals``, ``goal show``, ``commands``, ``identities GOAL``.

A query answers from the read database, never by folding the log itself, so it stays fast on a large log.
First it brings the read models up to date (``Projector.run_once``: only what they have not seen yet); with
``--no-catch-up`` it answers from what they hold and says on stderr how far behind the log they are.
Readable tables by default; ``--json`` prints one JSON document for machines.

``goal show`` lives under the ``goal`` command of :mod:`.saga_cmds`; :func:`add_goal_show` adds it there.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec

from ..clock import display, parse_or_none, stamped_builtins
from ..domain.state import GoalState
from ..domain.streams import short_ids as short_ids  # re-exported: `identities` tests use it here
from ..errors import EXIT_OK
from ..ids import resolve_goal_id
from ..postmortem.who import CALLER_COLUMNS, who_lines
from ..text_safe import display_width, fit, pad, term_line
from .read_models import read_models
from .terminal import parent_parser

if TYPE_CHECKING:
    pass

T = TypeVar("T")
Row = dict[str, Any]

STATUSES: Final = ("active", "paused", "blocked", "budget_limited", "usage_limited", "complete", "cleared")


# -- the command tree -------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = parent_parser()
    common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "--read-db", type=Path, default=None, metavar="PATH",
        help="the read database (default: read.db beside the log, e.g. .loopd/read.db)",
    )  # fmt: skip
    common.add_argument(
        "--no-catch-up", action="store_true",
        help="answer from the read models as they are, saying how far behind the log they are",
    )  # fmt: skip
    return common


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``goals``, ``commands``, ``identities`` and ``goal show`` to the ``loopd-es`` parser."""
    common = _common()
    p = sub.add_parser(
        "goals", parents=[common], help="list goals: status, phase, model, budgets",
        description="Every goal with its status, phase, identity and budgets, from the read models. "
        "Cleared goals are left out unless --all or --status cleared.",
    )  # fmt: skip
    p.add_argument("--status", choices=STATUSES, metavar="S", help=f"only this status: {', '.join(STATUSES)}")
    p.add_argument("--owner", metavar="O", help="only goals of this owner session")
    p.add_argument("--all", action="store_true", help="include cleared goals")
    p.set_defaults(handler=_goals, loopless=True)

    p = sub.add_parser(
        "commands", parents=[common], help="list command sessions: status, end reason, exit code, watch",
        description="Every command session with its status, end reason, exit code, watch state and linked "
        "goal, from the read models. Removed commands are left out unless --all.",
    )  # fmt: skip
    p.add_argument("--all", action="store_true", help="include removed commands")
    p.set_defaults(handler=_commands, loopless=True)

    p = sub.add_parser(
        "identities", parents=[common], help="a goal's identity switches: who asked, why, how they ended",
        description="Every identity switch of a goal (requested, deferred, applied, failed, rolled back...) "
        "with who requested it and why, and the switch sagas' host calls, in log order.",
    )  # fmt: skip
    p.add_argument("goal", metavar="GOAL", help="the goal id, or a unique prefix of it")
    p.set_defaults(handler=_identities, loopless=True)

    goal = sub.choices.get("goal")
    if goal is None:
        goal = sub.add_parser("goal", help="goals: show one", description="One goal, from the read models.")
        actions = goal.add_subparsers(dest="goal_command", metavar="ACTION", required=True)
    else:
        found = [a for a in goal._actions if isinstance(a, argparse._SubParsersAction)]
        if not found:
            return
        actions = found[0]
    if "show" not in actions.choices:
        add_goal_show(actions)


def add_goal_show(
    goal_subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``show`` to the ``goal`` command's subparsers (called by whichever module builds ``goal``)."""
    p = goal_subparsers.add_parser(
        "show", parents=[_common()], help="one goal: status, identity, budgets, runs, switches, commands",
        description="One goal from the read models: status and why, identity and pending switches, budgets "
        "used and limits, last progress, its runs, identity switches, fallback state, commands and awaits.",
    )  # fmt: skip
    p.add_argument("goal", metavar="GOAL", help="the goal id, or a unique prefix of it")
    p.set_defaults(handler=_goal_show, loopless=True)
    return p


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    return [_callers(dict(row)) for row in conn.execute(sql, params)]


def _callers(row: Row) -> Row:
    """The read models' tool calls (who created, ended, started or last changed a goal or command), stored as
    JSON text: shown as objects."""
    for key in CALLER_COLUMNS:
        if row.get(key) is not None:
            row[key] = msgspec.json.decode(row[key])
    return row


def resolve_goal(conn: sqlite3.Connection, text: str) -> Row:
    """The ``goals`` row whose id is ``text`` or the one id starting with it.

    :raises UsageError: when no goal or several goals match.
    """
    exact = _rows(conn, "SELECT * FROM goals WHERE goal_id = ?", (text,))
    if exact:
        return exact[0]
    found = _rows(
        conn, "SELECT * FROM goals WHERE substr(goal_id, 1, ?) = ? ORDER BY goal_id", (len(text), text)
    )
    goal_id = resolve_goal_id(text, [r["goal_id"] for r in found])
    return next(r for r in found if r["goal_id"] == goal_id)


def _list_goals(conn: sqlite3.Connection, status: str | None, owner: str | None, all_: bool) -> list[Row]:
    where, params = [], []
    if status == "cleared":
        where.append("cleared = 1")
    elif status is not None:
        where += ["status = ?", "cleared = 0"]
        params.append(status)
    elif not all_:
        where.append("cleared = 0")
    if owner is not None:
        where.append("owner = ?")
        params.append(owner)
    sql = (
        "SELECT * FROM goals"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + " ORDER BY created_at, goal_id"
    )
    return [_with_options(row) for row in _rows(conn, sql, params)]


def _with_options(row: Row) -> Row:
    """A ``goals`` row as queries show it: its options (stored as JSON, named as ``loopd_create_goal`` names
    them) decoded, and a cleared goal's status ``cleared``, its status before the clear kept beside it (the
    JSON used to say ``active`` where the text said ``cleared``)."""
    shown = row | {"options": msgspec.json.decode(row["options"])}
    if row["cleared"]:
        shown |= {"status": "cleared", "status_before_clear": row["status"]}
    return shown


def _show_goal(conn: sqlite3.Connection, text: str) -> Row:
    goal = _with_options(resolve_goal(conn, text))
    gid = goal["goal_id"]
    fallback = _rows(conn, "SELECT * FROM provider_fallbacks WHERE goal_id = ?", (gid,))
    if fallback:
        fallback[0]["fallback_models"] = msgspec.json.decode(fallback[0]["fallback_models"])
        fallback[0]["attempted"] = msgspec.json.decode(fallback[0]["attempted"])
    return {
        "goal": goal,
        "kept": _kept(conn, gid),
        "runs": _rows(conn, "SELECT * FROM runs WHERE goal_id = ? ORDER BY started_position", (gid,)),
        "switches": _rows(
            conn, "SELECT * FROM identity_switches WHERE goal_id = ? ORDER BY last_position", (gid,)
        ),
        "fallback": fallback[0] if fallback else None,
        "provider_limits": _rows(
            conn, "SELECT * FROM provider_limit_observations WHERE goal_id = ? ORDER BY position", (gid,)
        ),
        "commands": _rows(
            conn, "SELECT * FROM commands WHERE goal_id = ? ORDER BY started_at, command_id", (gid,)
        ),
        "awaits": _rows(
            conn,
            "SELECT a.*, c.title AS command_title FROM awaits a LEFT JOIN commands c USING (command_id) "
            "WHERE a.goal_id = ? ORDER BY a.await_id",
            (gid,),
        ),
    }


KEPT_FIELDS: Final = (
    "native_parent_id", "schedule_run_count", "next_run_at", "last_schedule_at", "last_run_at", "turn_started_at",
    "last_worker_status", "active_tool_call_ids", "last_compact_at", "last_parent_notified_at",
    "last_parent_notified_for", "verification_attempts",
)  # fmt: skip
"""Folded fields no ``goals`` column holds: loopd's bookkeeping an import carried over, and schedule times."""


def _kept(conn: sqlite3.Connection, goal_id: str) -> Row:
    """:data:`KEPT_FIELDS` from the goal's fold (the ``goals`` read model keeps it in ``goals_fold``)."""
    found = conn.execute("SELECT state FROM goals_fold WHERE goal_id = ?", (goal_id,)).fetchone()
    if found is None:
        return {}

    state = msgspec.msgpack.decode(found[0], type=GoalState)
    return {k: stamped_builtins(getattr(state, k)) for k in KEPT_FIELDS}


def _goal_identities(conn: sqlite3.Connection, text: str) -> Row:
    goal = resolve_goal(conn, text)
    gid = goal["goal_id"]
    return {
        "goal": {k: goal[k] for k in ("goal_id", "name", "status", "model", "agent", "pending_switch")},
        "switches": _rows(
            conn, "SELECT * FROM identity_switches WHERE goal_id = ? ORDER BY requested_at, switch_id", (gid,)
        ),
        "history": _rows(conn, "SELECT * FROM identity_history WHERE goal_id = ? ORDER BY position", (gid,)),
    }


# -- handlers ---------------------------------------------------------------------------------------------


async def _goals(args: argparse.Namespace) -> int:
    rows = await read_models(args, lambda c: _list_goals(c, args.status, args.owner, args.all))
    if args.json:
        return _json({"goals": rows})
    if not rows:
        _say("no goals" + (" match" if args.status or args.owner else ""))
        return EXIT_OK
    ids = short_ids([r["goal_id"] for r in rows])
    _say(
        *table(
            ("ID", "NAME", "STATUS", "PHASE", "MODEL", "TURNS", "TOKENS", "COST", "OWNER", "UPDATED"),
            [
                (
                    ids[r["goal_id"]],
                    r["name"],
                    r["status"],
                    r["phase"],
                    r["model"],
                    _of(r["turns_used"], r["max_turns"]),
                    _of(r["tokens_used"], r["token_budget"]),
                    _cost(r["cost_used"], r["cost_budget"]),
                    r["owner"],
                    _time(r["updated_at"]),
                )
                for r in rows
            ],
        )  # fmt: skip
    )
    return EXIT_OK


async def _goal_show(args: argparse.Namespace) -> int:
    doc = await read_models(args, lambda c: _show_goal(c, args.goal))
    if args.json:
        return _json(doc)
    _say(*render_goal(doc))
    return EXIT_OK


async def _commands(args: argparse.Namespace) -> int:
    where = "" if args.all else " WHERE removed = 0"
    rows = await read_models(
        args, lambda c: _rows(c, f"SELECT * FROM commands{where} ORDER BY started_at, command_id")
    )
    if args.json:
        return _json({"commands": rows})
    if not rows:
        _say("no commands")
        return EXIT_OK
    _say(*command_rows(rows))
    return EXIT_OK


async def _identities(args: argparse.Namespace) -> int:
    doc = await read_models(args, lambda c: _goal_identities(c, args.goal))
    if args.json:
        return _json(doc)
    _say(*render_identities(doc))
    return EXIT_OK


# -- rendering ----------------------------------------------------------------------------------------


def _option_lines(options: dict[str, Any]) -> list[str]:
    """``goal show``'s options: those set, by the name ``loopd_create_goal`` gives them, two or three a line."""
    shown = ("model", "agent", "interactive", "artifactDir")  # on lines of their own above, or too long
    words = [
        f"{k} {', '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in options.items()
        if k not in shown and v not in (None, [], "")
    ]
    return [
        f"  {'options' if i == 0 else '':<11} {'   '.join(words[i : i + 3])}" for i in range(0, len(words), 3)
    ]


def _json(doc: Any) -> int:
    sys.stdout.buffer.write(msgspec.json.encode(doc) + b"\n")
    sys.stdout.flush()
    return EXIT_OK


def _say(*lines: str) -> None:
    """Print lines; each goes through the terminal sanitiser (names and errors come from outside)."""
    sys.stdout.write("".join(f"{term_line(line)}\n" for line in lines))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int = 40) -> list[str]:
    """Left-aligned columns, ``-`` for nothing, cells cut to ``width`` columns (a terminal's: CJK and most
    emoji take two)."""
    cells = [[_cell(v, width) for v in row] for row in rows]
    widths = [max([display_width(h), *(display_width(r[k]) for r in cells)]) for k, h in enumerate(headers)]
    return [
        "  ".join(pad(v, w) for v, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *cells]
    ]


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None or value == "" else term_line(str(value).replace("\n", " "))
    return fit(text, width)


def _of(used: Any, limit: Any) -> str:
    return f"{used}/{limit if limit else '-'}"


def _cost(used: float, limit: float | None) -> str:
    """``$0.0123/$5.00``: a budget in cents, or as many places as it has (``$0.0005`` is not ``$0.00``)."""
    return f"${used:.4f}" + (f"/${_dollars(limit)}" if limit else "")


def _dollars(amount: float) -> str:
    if abs(amount - round(amount, 2)) < 1e-9:
        return f"{amount:.2f}"
    text = f"{amount:.8f}".rstrip("0")
    return text if float(text) else f"{amount:.2e}"


def _time(stamp: str | None) -> str:
    """``2026-12-02T13:00:01.123456Z`` (or the same instant at any offset) -> ``2026-12-02 13:00:01`` (UTC)."""
    moment = parse_or_none(stamp)
    return display(moment) if moment is not None else stamp or "-"


def command_rows(rows: Sequence[Row]) -> list[str]:
    """The ``commands`` table: one line per command session."""
    return table(
        ("ID", "TITLE", "STATUS", "END", "EXIT", "WATCH", "AWAITS", "GOAL", "STARTED"),
        [
            (r["command_id"], r["title"], r["status"] + (" (removed)" if r["removed"] else ""), r["end_reason"],
             r["exit_code"] if r["signal"] is None else f"{r['exit_code'] if r['exit_code'] is not None else '-'}"
             f" {r['signal']}", r["watch_state"], r["awaits"], r["goal_id"], _time(r["started_at"]))
            for r in rows
        ],
    )  # fmt: skip


def render_goal(doc: Row) -> list[str]:
    """``goal show``: the goal's facts, then its runs, switches, provider limits, commands and awaits."""
    g = doc["goal"]
    status = (
        f"cleared (was {g['status_before_clear']})" if g["cleared"] else f"{g['status']}, phase {g['phase']}"
    )
    lines = [f"goal {g['goal_id']}  {g['name']!r}", f"  status      {status}"]
    if g["blocker_reason"]:
        kind = f" [{g['blocker_kind']}]" if g["blocker_kind"] else ""
        lines.append(f"  blocker     {g['blocker_reason']}{kind} — needed: {g['blocker_needed']}")
    lines += [
        f"  objective   {_cell(g['objective'], 100)}",
        f"  owner       {g['owner']}   worker session {g['worker_session_id'] or '-'}   "
        f"interactive {'yes' if g['interactive'] else 'no'}",
        f"  identity    model {g['model'] or '-'}  agent {g['agent'] or '-'}   pending {g['pending_switch'] or '-'}"
        + (f"   in flight {g['switch_in_flight']}" if g["switch_in_flight"] else ""),
        f"  budgets     turns {_of(g['turns_used'], g['max_turns'])}   tokens {_of(g['tokens_used'], g['token_budget'])}"
        f"   cost {_cost(g['cost_used'], g['cost_budget'])}   time {g['time_used_seconds']:.1f}s"
        + (f"/{g['timeout_ms'] / 1000:g}s" if g["timeout_ms"] else ""),
    ]
    lines += _option_lines(g["options"])
    if g["last_progress"]:
        nxt = f" (next: {g['last_progress_next']})" if g["last_progress_next"] else ""
        lines.append(
            f"  progress    {_cell(g['last_progress'], 100)}{nxt}  at {_time(g['last_progress_at'])}"
        )
    if g["last_error"]:
        lines.append(f"  last error  {_cell(g['last_error'], 100)}")
    fb = doc["fallback"]
    if fb and (fb["status"] or fb["observations"] or fb["fallback_models"]):
        prepared = f" {fb['prepared_model']}" if fb["prepared_model"] else ""
        tried = f", attempted {', '.join(fb['attempted'])}" if fb["attempted"] else ""
        seen = (
            f"; {fb['observations']} provider limit(s), last {fb['last_kind']} on {fb['last_model'] or '-'}"
            f" at {_time(fb['last_observed_at'])}"
            if fb["observations"]
            else ""
        )
        order = ", ".join(fb["fallback_models"]) or "none"
        lines.append(f"  fallback    {fb['status'] or 'not needed'}{prepared}{tried}{seen} (order: {order})")
    lines += _kept_lines(doc.get("kept") or {})
    lines.append(
        f"  created     {_time(g['created_at'])}   updated {_time(g['updated_at'])}   version {g['version']}"
    )
    lines += [f"  by          {said}" for said in who_lines(g)]
    if doc["runs"]:
        lines += ["", f"runs ({len(doc['runs'])}):"]
        lines += _indent(table(
            ("TURN", "GEN", "KIND", "STATUS", "ENDED BY", "TOKENS", "STARTED", "ENDED", "ERROR"),
            [(r["turn"], r["generation"], r["kind"], r["status"], r["end_event"], r["tokens"],
              _time(r["started_at"]), _time(r["ended_at"]), r["error"]) for r in doc["runs"][-20:]],
        ))  # fmt: skip
    attempts = (doc.get("kept") or {}).get("verification_attempts") or []
    if attempts:
        lines += ["", f"verification attempts ({len(attempts)}):"]
        lines += _indent(table(
            ("ATTEMPT", "SEQ", "GEN", "STATUS", "STARTED", "COMPLETED", "FAILED CHECKS"),
            [(a["attempt_id"], a["sequence"], a["run_generation"], a["status"], _time(a["started_at"]),
              _time(a["completed_at"]), ", ".join(a["failed_checks"])) for a in attempts],
        ))  # fmt: skip
    if doc["switches"]:
        lines += ["", "identity switches:", *_indent(_switch_rows(doc["switches"]))]
    if doc["commands"]:
        lines += ["", "commands:", *_indent(command_rows(doc["commands"]))]
    if doc["awaits"]:
        lines += ["", "awaits:"]
        lines += _indent(table(
            ("COMMAND", "TITLE", "STATUS", "UNTIL", "EXIT", "OWNER", "REQUESTED", "ENDED"),
            [(a["command_id"], a["command_title"], a["status"] + (" (immediate)" if a["immediate"] else ""),
              a["until"], a["exit_code"], a["owner_session_id"], _time(a["requested_at"]), _time(a["ended_at"]))
             for a in doc["awaits"]],
        ))  # fmt: skip
    return lines


def _kept_lines(k: Row) -> list[str]:
    """Schedule, run and notification bookkeeping (what an import of loopd carried over), when there is any."""
    lines = []
    if k.get("schedule_run_count") or k.get("next_run_at") or k.get("last_schedule_at"):
        lines.append(
            f"  schedule    runs {k['schedule_run_count']}   next {_time(k['next_run_at'])}"
            f"   last tick {_time(k['last_schedule_at'])}"
        )
    runs = [
        (label, k.get(key))
        for label, key in (
            ("last run", "last_run_at"), ("turn started", "turn_started_at"), ("worker", "last_worker_status"),
            ("compacted", "last_compact_at"), ("native parent", "native_parent_id"),
        )
    ]  # fmt: skip
    shown = [f"{label} {_time(v) if 'T' in str(v) else v}" for label, v in runs if v]
    if k.get("active_tool_call_ids"):
        shown.append("tool calls in flight " + ", ".join(k["active_tool_call_ids"]))
    if shown:
        lines.append("  runtime     " + "   ".join(shown))
    if k.get("last_parent_notified_at"):
        lines.append(
            f"  notified    owner at {_time(k['last_parent_notified_at'])}"
            f" ({k.get('last_parent_notified_for') or '-'})"
        )
    return lines


def _switch_rows(switches: Sequence[Row]) -> list[str]:
    ids = short_ids([s["switch_id"] for s in switches])
    return table(
        ("SWITCH", "STATUS", "TARGET", "MODEL", "AGENT", "BY", "WHY", "REQUESTED"),
        [(ids[s["switch_id"]], s["status"] + (f" → {s['continued_as'][:13]}" if s["continued_as"] else ""), s["target"],
          s["model"], s["agent"], s["requested_by"], s["reason"], _time(s["requested_at"])) for s in switches],
    )  # fmt: skip


def render_identities(doc: Row) -> list[str]:
    """``identities GOAL``: the switches, then every identity and saga event in log order."""
    g = doc["goal"]
    lines = [
        f"goal {g['goal_id']}  {g['name']!r}: {g['status']}, model {g['model'] or '-'}, agent {g['agent'] or '-'},"
        f" pending {g['pending_switch'] or '-'}"
    ]
    if not doc["switches"]:
        return [*lines, "no identity switches"]
    lines += ["", "switches:", *_indent(_switch_rows(doc["switches"])), "", "history:"]
    ids = short_ids([s["switch_id"] for s in doc["switches"]])
    lines += _indent(table(
        ("POSITION", "AT", "SWITCH", "EVENT", "MODEL", "AGENT", "BY", "WHY", "DETAIL"),
        [(h["position"], _time(h["at"]), ids.get(h["switch_id"], h["switch_id"]), h["event"], h["model"], h["agent"], h["requested_by"],
          h["reason"], h["detail"]) for h in doc["history"]],
        width=60,
    ))  # fmt: skip
    return lines


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"  {line}" for line in lines]
