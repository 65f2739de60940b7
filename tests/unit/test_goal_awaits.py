"""Pausing or clearing a goal cancels what it waits for (docs/reference/loopd.md#s2-5), and says which event
caused it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.clock import parse_rfc3339
from loopd_es.events import command as cmd
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store

SCRIPT = {"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}]}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'events.db'}")
    monkeypatch.setenv("LOOPD_ES_HOST", f"sim:{tmp_path / 'host.json'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _waiting_command(url: str, goal_id: str) -> None:
    async def write() -> None:
        async with await open_store(url) as store:
            await store.append(
                "command-c1",
                [
                    new_event(
                        cmd.CommandStarted(
                            command_id="c1",
                            title="t",
                            command="sleep",
                            cwd="/",
                            started_at=parse_rfc3339("2026-12-02T00:00:00.000000Z"),
                        )
                    ),
                    new_event(cmd.AwaitRequested(command_id="c1", goal_id=goal_id)),
                ],
                "no_stream",
            )

    anyio.run(write)


def _events(url: str, stream: str) -> list[tuple[str, str | None, str | None, str]]:
    async def read() -> list[tuple[str, str | None, str | None, str]]:
        async with await open_store(url) as store:
            return [
                (e.type, e.causation_id, e.correlation_id, e.event_id)
                async for e in store.read_stream(stream)
            ]

    return anyio.run(read)


@pytest.mark.parametrize(("verb", "reason"), [("pause", "goal paused"), ("clear", "goal cleared")])
def test_pause_and_clear_cancel_the_goals_awaits(
    env: Path, capsys: pytest.CaptureFixture[str], verb: str, reason: str
) -> None:
    url = f"sqlite:{env / 'events.db'}"
    assert main("goal", "create", "g", "--objective", "o", "--model", "p/m", "--agent", "build") == 0
    goal_id = capsys.readouterr().out.splitlines()[0]
    _waiting_command(url, goal_id)

    assert main("goal", verb, goal_id) == 0

    goal_events = _events(url, f"goal-{goal_id}")
    command_events = _events(url, "command-c1")
    assert [e[0] for e in command_events][-1] == "command.await-cancelled"
    cancel = command_events[-1]
    cause = goal_events[-1]
    assert cause[0] in ("goal.paused", "goal.cleared")
    assert cancel[1] == cause[3], "the cancellation names the pause/clear event as its cause"
    assert cancel[2] == cause[2], "and stays in the same flow"

    async def payload() -> dict[str, object]:
        async with await open_store(url) as store:
            return [e async for e in store.read_stream("command-c1")][-1].data_dict()

    assert anyio.run(payload)["reason"] == reason


def test_reconcile_discards_awaits_of_a_goal_cleared_without_its_cancellations(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash window between ``goal.cleared`` and the cancellations: reconcile discards, never fires."""
    from loopd_es.events.goal import GoalCleared
    from loopd_es.procs import service
    from loopd_es.procs.paths import CommandPaths

    url = f"sqlite:{env / 'events.db'}"
    assert main("goal", "create", "g", "--objective", "o", "--model", "p/m", "--agent", "build") == 0
    goal_id = capsys.readouterr().out.splitlines()[0]
    _waiting_command(url, goal_id)

    async def clear_and_reconcile() -> list[str]:
        async with await open_store(url) as store:
            await store.append(f"goal-{goal_id}", [new_event(GoalCleared(goal_id=goal_id))])
            await service.reconcile(store, CommandPaths(url))  # the owner is gone: the command is missing
            return [e.type async for e in store.read_stream("command-c1")]

    types = anyio.run(clear_and_reconcile)
    assert "command.await-discarded" in types
    assert "command.await-fired" not in types
    assert types[-1] == "command.exited"


def test_reconcile_leaves_awaits_of_goals_it_does_not_know(env: Path) -> None:
    from loopd_es.procs import service
    from loopd_es.procs.paths import CommandPaths

    url = f"sqlite:{env / 'events.db'}"
    _waiting_command(url, "a-goal-of-another-tool")

    async def reconcile() -> list[str]:
        async with await open_store(url) as store:
            await service.reconcile(store, CommandPaths(url))
            return [e.type async for e in store.read_stream("command-c1")]

    assert "command.await-fired" in anyio.run(reconcile)
