"""Numbers loopd takes as any JSON number where loopd-es keeps whole ones.

loopd's tools take ``maxTurns``, ``timeoutMs``, ``scheduleEveryMs`` and the like as plain numbers and store them
as given, so a ``state.json`` may hold ``2.5`` or ``1500.5``. Each such fraction is imported as the whole number
with the same effect in loopd's own arithmetic, and the import report lists the field with how it was read
(:func:`rules`), so nothing is refused and nothing changes silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

_UP: Final = (
    "not a whole number: imported rounded up, which sets the same limit (loopd compares whole counts with "
    "`>=`, or `<` for maxRuns, so 2.5 acts as 3)"
)
_DOWN: Final = (
    "not a whole number of ms: imported rounded down, as loopd's own times drop the fraction (it writes "
    "`now + ms` as an ISO time with whole ms)"
)
_EVERY: Final = (
    "not a whole number: imported as the first turn count for which loopd's `runCount % compactEvery === 0` "
    "holds (2.5 compacts every 5 turns; a decimal such as 2.3 is not exact in binary and never does)"
)

_FIELDS: Final[dict[tuple[str, ...], tuple[Callable[[float], int], str]]] = {
    ("tokenBudget",): (math.ceil, _UP),
    ("config", "maxTurns"): (math.ceil, _UP),
    ("config", "maxNoProgress"): (math.ceil, _UP),
    ("config", "maxFailures"): (math.ceil, _UP),
    ("config", "maxEvaluatorRejections"): (math.ceil, _UP),
    ("config", "schedule", "maxRuns"): (math.ceil, _UP),
    ("config", "timeoutMs"): (math.floor, _DOWN),
    ("config", "schedule", "everyMs"): (math.floor, _DOWN),
    ("config", "compactEvery"): (lambda v: Fraction(v).numerator, _EVERY),
}
"""Where in a goal record, how a fraction is read, and what the report says of it."""


def _parent(goal: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = goal
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _fraction(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and not value.is_integer()


def whole_numbers(doc: dict[str, Any]) -> None:
    """Replace, in place, every number of :data:`_FIELDS` given as a float by its whole reading."""
    for goal in doc.get("goals", []):
        if not isinstance(goal, dict):
            continue
        for path, (read, _) in _FIELDS.items():
            parent = _parent(goal, path)
            value = None if parent is None else parent.get(path[-1])
            if parent is not None and isinstance(value, float) and math.isfinite(value):
                parent[path[-1]] = int(value) if value.is_integer() else read(value)


def rules() -> dict[str, Callable[[dict[str, Any], dict[str, Any], Any], str | None]]:
    """:mod:`.fields` rules: a goal field of :data:`_FIELDS` holding a fraction is reported, else kept."""

    def rule(
        path: tuple[str, ...], reason: str
    ) -> Callable[[dict[str, Any], dict[str, Any], Any], str | None]:
        def check(record: dict[str, Any], goal: dict[str, Any], source: Any) -> str | None:
            parent = _parent(record, path)
            return reason if parent is not None and _fraction(parent.get(path[-1])) else None

        return check

    return {"goals[]." + ".".join(path): rule(path, reason) for path, (_, reason) in _FIELDS.items()}
