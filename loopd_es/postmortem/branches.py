"""The branches of a goal's timeline (where it was forked from, the forks made of it) and ``loopd-es compare``
shown as text: a fork is a goal of its own, so its history names its source and the source names its forks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .history import show

if TYPE_CHECKING:
    from ..app.compare import Comparison
    from .history import History


def branches(history: History) -> list[dict[str, Any]]:
    """``{"kind": "forked_from" | "fork", "goal_id", "position", "changed"}`` for each fork fact of the goal."""
    out: list[dict[str, Any]] = []
    for e in history.entries:
        kind = {"goal.forked_from": "forked_from", "goal.forked": "fork"}.get(e.envelope.type)
        if not e.own or kind is None:
            continue
        data = e.data()
        other = data.get("source_goal_id") if kind == "forked_from" else data.get("fork_goal_id")
        out.append(
            {
                "kind": kind,
                "goal_id": other,
                "position": data.get("at_position"),
                "changed": list(data.get("changed") or ()),
            }
        )
    return out


def branch_lines(history: History) -> list[str]:
    """One line per branch, for the head of ``history``'s text."""
    lines = []
    for b in branches(history):
        changed = f" (changed: {', '.join(b['changed'])})" if b["changed"] else ""
        if b["kind"] == "forked_from":
            lines.append(f"  ⑂ forked from goal {b['goal_id']} at #{b['position']}{changed}")
        else:
            lines.append(f"  ⑂ fork {b['goal_id']} made at #{b['position']}{changed}")
    return lines


_RELATION = {
    "fork": "B was forked from A at #{at}",
    "source": "A was forked from B at #{at}",
    "siblings": "A and B were both forked from one goal (first at #{at})",
    "unrelated": "A and B share no fork point",
}


def compare_text(result: Comparison) -> list[str]:
    """The comparison as a table: field, A, B, and ``≠`` where they differ."""
    a, b = result.a, result.b
    lines = [
        f"A {a.goal_id} {a.name!r}",
        f"B {b.goal_id} {b.name!r}",
        _RELATION[result.relation].format(at=result.shared_at),
        "",
    ]
    width = max(len(r.field) for r in result.rows)
    for r in result.rows:
        mark = " " if r.same else "≠"
        lines.append(f"{mark} {r.field:<{width}}  {show(r.a, 36):<36}  {show(r.b, 36)}")
    lines.append("")
    since = "since the fork point" if result.relation != "unrelated" else "in all"
    for label, side in (("A", a), ("B", b)):
        types = ", ".join(f"{t} ×{n}" for t, n in side.types_after.items()) or "none"
        lines.append(f"{label}: {side.events_after} events {since}: {types}")
    return lines
