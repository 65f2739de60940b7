"""Goal rules live in one place: in ``engine/`` and ``app/`` only the goal service appends to a goal's stream
(every change decided by ``decide``), and a fork's creation, which writes two goals' streams at once."""

from __future__ import annotations

import ast
from pathlib import Path

import loopd_es

PACKAGE = Path(loopd_es.__file__).parent
WRITERS = frozenset({"app/service.py", "app/fork.py"})
"""The files that may append to a goal stream (relative to the package)."""


def goal_appends(source: str) -> list[int]:
    """Lines of ``source`` that call ``append``/``append_many`` with ``goal_stream(...)`` among their arguments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("append", "append_many"):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and inner is not node:
                name = (
                    inner.func.attr
                    if isinstance(inner.func, ast.Attribute)
                    else getattr(inner.func, "id", "")
                )
                if name == "goal_stream":
                    found.append(node.lineno)
                    break
    return sorted(found)


def test_only_the_goal_service_appends_to_goal_streams_in_engine_and_app() -> None:
    bad = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for folder in ("engine", "app")
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in WRITERS
        for line in goal_appends(path.read_text())
    ]
    assert not bad, f"goal events appended by hand (decide a goal command through GoalService.execute): {bad}"


def test_the_check_sees_a_hand_built_goal_append() -> None:
    source = (
        "async def react(engine, goal_id, event):\n"
        "    await engine.store.append(goal_stream(goal_id), [event], 'any')\n"
        "    await store.append_many([(streams.goal_stream(goal_id), [event], 3)])\n"
        "    await store.append('notifications', [event])\n"
        "    items.append(goal_stream(goal_id))\n"
    )
    assert goal_appends(source) == [2, 3, 5]  # a list's append is caught too: rare enough to rename
