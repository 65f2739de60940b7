"""The branches of a goal's history: the fork facts (``goal.forked_from``, ``goal.forked``) it records, for
``history``'s head, its JSON and the HTML timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
                "position": data.get("at_position") or None,  # 0: a fork point a bundle does not hold
                "changed": list(data.get("changed") or ()),
            }
        )
    return out


def branch_lines(history: History) -> list[str]:
    """One line per branch, for the head of ``history``'s text."""
    lines = []
    for b in branches(history):
        changed = f" (changed: {', '.join(b['changed'])})" if b["changed"] else ""
        at = f"#{b['position']}" if b["position"] else "an event this bundle does not hold"
        if b["kind"] == "forked_from":
            lines.append(f"  ⑂ forked from goal {b['goal_id']} at {at}{changed}")
        else:
            lines.append(f"  ⑂ fork {b['goal_id']} made at {at}{changed}")
    return lines
