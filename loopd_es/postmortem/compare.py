"""``loopd-es compare`` shown as text: the two goals side by side, and what each did after their shared point."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .history import show

if TYPE_CHECKING:
    from ..app.compare import Comparison


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
