"""The ``commands`` and ``awaits`` read models: status, end, watch and linked goal; every wait and its end."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.domain.command import fold
from loopd_es.events.catalogue import decode_payload
from loopd_es.log import open_store

from .test_projections_base import A, B, T, built, rows

pytestmark = pytest.mark.anyio
__all__ = ("built",)


async def test_command_rows_match_the_command_fold(built: Path, tmp_path: Path) -> None:
    found = {r["command_id"]: r for r in rows(built, "SELECT * FROM commands")}
    c1, c2 = found["c1"], found["c2"]
    assert {k: c1[k] for k in ("title", "command_line", "cwd", "goal_id", "status", "end_reason", "exit_code",
                                "signal", "claim", "watch_filter", "watch_until", "watch_state", "watch_pushes",
                                "watch_matches", "awaits", "pid", "removed", "started_at", "ended_at")} == {
        "title": "build", "command_line": "make all", "cwd": "/w", "goal_id": A, "status": "terminated",
        "end_reason": "until", "exit_code": 143, "signal": "SIGTERM", "claim": "until", "watch_filter": "ERROR",
        "watch_until": "done", "watch_state": "until-matched", "watch_pushes": 1, "watch_matches": 2,
        "awaits": 0, "pid": 42, "removed": 0, "started_at": T, "ended_at": T,
    }  # fmt: skip
    assert (c2["status"], c2["end_reason"], c2["exit_code"], c2["removed"], c2["goal_id"]) == (
        "exited", "exit", 0, 1, None,
    )  # fmt: skip
    assert (c2["watch_filter"], c2["watch_state"]) == ("GET", "flood-suspended")
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        envs = [e async for e in log.read_stream("command-c1")]
    state = fold(decode_payload(e) for e in envs)
    assert state is not None and c1["version"] == len(envs) == state.version


async def test_awaits_from_request_to_end(built: Path) -> None:
    found = rows(
        built,
        "SELECT command_id, goal_id, until, status, immediate, command_status, exit_code, matched_lines, reason "
        "FROM awaits ORDER BY await_id",
    )
    assert [(a["command_id"], a["goal_id"], a["status"], a["reason"]) for a in found] == [
        ("c1", A, "fired", None),  # the second request while waiting made no row
        ("c2", A, "cancelled", "goal paused"),
        ("c2", B, "discarded", "goal gone"),
        ("c2", A, "cancelled", "command removed"),  # still waiting when the command was removed
        ("c2", B, "fired", None),  # fired at once: no request before it
    ]
    assert (found[0]["until"], found[0]["command_status"], found[0]["exit_code"], found[0]["matched_lines"]) == (
        "done", "terminated", 143, '["done"]',
    )  # fmt: skip
    assert [a["immediate"] for a in found] == [0, 0, 0, 0, 1]


async def test_a_waiting_await_is_counted_on_its_command(tmp_path: Path) -> None:
    from loopd_es.projector import Projector
    from projections import Awaits, Commands

    from .test_projections_base import append_story, story

    (c1,) = [step for step in story() if step[0] == "command-c1"]
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await append_story(log, [(c1[0], c1[1][:3])])  # started, spawned, await requested
        async with await Projector.open(log, [Commands(), Awaits()], tmp_path / "read.db") as projector:
            await projector.run_once()
    assert rows(tmp_path / "read.db", "SELECT status, awaits FROM commands") == [
        {"status": "running", "awaits": 1}
    ]
    assert rows(tmp_path / "read.db", "SELECT status FROM awaits") == [{"status": "waiting"}]
