"""``history``: a goal's streams found (read model or scan), merged in global order, each goal event diffed.

The log is built from real payloads (``new_event``) with fixed ids and timestamps, copied in verbatim with
``import_envelopes``, so positions, causation links and ``--at`` cuts are exact. It holds the chain
``explain`` must walk: 429 → fallback prepared → pending switch rejected by the host → blocked.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from loopd_es.cli.main import main
from loopd_es.clock import parse_rfc3339
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r
from loopd_es.events import saga as s
from loopd_es.events.base import Event
from loopd_es.events.catalogue import new_event
from loopd_es.events.command import CommandStarted
from loopd_es.events.envelope import Envelope, NewEvent
from loopd_es.log import LogStore, open_store
from loopd_es.postmortem import UnknownGoalError, build_history, find_goal
from loopd_es.projector import Projector
from projections.goal_links import GoalLinks

pytestmark = pytest.mark.anyio

ALL = [GoalLinks()]
"""A projection registry for ``--registry tests.unit.test_postmortem_history`` (goal_links only)."""

GOAL = "7f3a0c1e-goal"
OTHER = "7f9b22d0-goal"
SWITCH = "0193aa01-switch"
COMMAND = "cmd-42"
T0 = "2026-12-02T12:00:"

Step = tuple[str, Event, "int | str | None"]
"""(stream, payload, cause): cause is the 1-based index of an earlier step, a request id, or None."""


def chain_steps() -> list[Step]:
    """The story: created, a 429 on p/old, the quota fallback to p/new, the host refusing it, blocked."""
    goal, other = f"goal-{GOAL}", f"goal-{OTHER}"
    switch, command = f"switch-{SWITCH}", f"command-{COMMAND}"
    cfg = g.GoalConfig(model="p/old", agent="build", fallback_models=("p/new",))
    return [
        (goal, g.GoalCreated(goal_id=GOAL, name="docs", objective="write docs", owner_session_id="o", config=cfg), "req-create"),  # 1
        (goal, g.GoalWorkerAssigned(goal_id=GOAL, worker_session_id="ses_1"), 1),  # 2
        (other, g.GoalCreated(goal_id=OTHER, name="noise", objective="x", owner_session_id="o"), "req-other"),  # 3
        (goal, r.RunStarted(goal_id=GOAL, run_id="run-1", generation=1, prompt_message_id="m1", turn_count=1), 2),  # 4
        (goal, r.RunFailed(goal_id=GOAL, run_id="run-1", error="provider error (status 429)", consecutive_failures=1), "req-error"),  # 5
        (goal, i.ProviderLimitObserved(goal_id=GOAL, kind="rate-limit", source="session-error", observed_at=parse_rfc3339(T0 + "05.000Z"), model="p/old", status_code=429), 5),  # 6
        (goal, i.FallbackPrepared(goal_id=GOAL, model="p/new", attempted=("p/old", "p/new"), at=parse_rfc3339(T0 + "05.000Z")), 5),  # 7
        (command, CommandStarted(command_id=COMMAND, title="tests", command="pytest", cwd="/w", goal_id=GOAL, started_at=parse_rfc3339(T0 + "07Z")), "req-cmd"),  # 8
        (other, g.GoalPaused(goal_id=OTHER), "req-pause"),  # 9
        (goal, i.IdentitySwitchRequested(goal_id=GOAL, switch_id=SWITCH, model="p/new", reason="quota", pending=True), "req-idle"),  # 10
        (switch, s.SwitchSagaStarted(switch_id=SWITCH, goal_id=GOAL, session_id="ses_1", model="p/new", from_model="p/old", pending=True), 10),  # 11
        (switch, s.HostCallIntended(switch_id=SWITCH, key=f"{SWITCH}/forward/switch_model", op="switch_model", arg="p/new"), 10),  # 12
        (switch, s.HostCallFailed(switch_id=SWITCH, key=f"{SWITCH}/forward/switch_model", reason="rejected"), 10),  # 13
        (goal, i.IdentitySwitchFailed(goal_id=GOAL, switch_id=SWITCH, target="model", stage="host", reason="host-rejected", pending=True), 10),  # 14
        (goal, g.GoalBlocked(goal_id=GOAL, reason="Pending model switch was not accepted.", needed="switch explicitly, then retry"), 10),  # 15
        (switch, s.SwitchSagaFinished(switch_id=SWITCH, goal_id=GOAL, outcome="failed"), 10),  # 16
    ]  # fmt: skip


def eid(k: int) -> str:
    """The event id of step ``k``: a UUID whose tail is the step number, so failures are readable."""
    return f"00000000-0000-7000-8000-{k:012d}"


def envelopes(steps: Sequence[Step]) -> list[Envelope]:
    """Envelopes as the log records them, one second apart, correlation inherited along causation."""
    out: list[Envelope] = []
    versions: dict[str, int] = {}
    for k, (stream, payload, cause) in enumerate(steps, start=1):
        causation: str | None
        correlation: str | None
        if isinstance(cause, int):
            causation, correlation = out[cause - 1].event_id, out[cause - 1].correlation_id
        else:
            causation = correlation = cause
        new = new_event(payload, event_id=eid(k), causation_id=causation, correlation_id=correlation)
        versions[stream] = versions.get(stream, 0) + 1
        out.append(
            Envelope(
                k, stream, versions[stream], new.event_id, new.type, new.schema_version, f"{T0}{k:02d}.000000Z",
                new.causation_id, new.correlation_id, msgspec.Raw(new.data_bytes()),
            )
        )  # fmt: skip
    return out


async def make_log(path: Path, steps: Sequence[Step] | None = None) -> str:
    """A SQLite log holding ``steps`` (default: the chain); returns its URL."""
    url = f"sqlite:{path / 'events.db'}"
    batch = envelopes(chain_steps() if steps is None else steps)

    async def source() -> AsyncIterator[list[Envelope]]:
        yield batch

    async with await open_store(url) as store:
        await store.import_envelopes(source())
    return url


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LogStore]:
    async with await open_store(await make_log(tmp_path)) as opened:
        yield opened


async def test_links_and_scan_find_the_same_streams(store: LogStore, tmp_path: Path) -> None:
    by_links = await find_goal(store, GOAL, read_db=tmp_path / "read.db", links=GoalLinks())
    by_scan = await find_goal(store, GOAL)
    expected = (f"goal-{GOAL}", f"command-{COMMAND}", f"switch-{SWITCH}")
    assert (by_links.streams, by_links.source) == (expected, "goal_links")
    assert (by_scan.streams, by_scan.source) == (expected, "scan")


async def test_goal_ids_resolve_by_unique_prefix_only(store: LogStore, tmp_path: Path) -> None:
    for links in (GoalLinks(), None):
        read_db = tmp_path / "read.db" if links else None
        assert (await find_goal(store, "7f3", read_db=read_db, links=links)).goal_id == GOAL
        with pytest.raises(UnknownGoalError, match="ambiguous"):
            await find_goal(store, "7f", read_db=read_db, links=links)
        with pytest.raises(UnknownGoalError, match="no goal matches 'nope'"):
            await find_goal(store, "nope", read_db=read_db, links=links)


async def test_history_merges_streams_in_global_order_and_diffs_each_goal_event(store: LogStore) -> None:
    history = await build_history(store, await find_goal(store, GOAL))
    positions = [e.position for e in history.entries]
    assert positions == [1, 2, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16]  # goal OTHER's 3 and 9 left out
    by_pos = {e.position: e for e in history.entries}
    changes = {p: {c.field: c for c in e.changes} for p, e in by_pos.items()}
    assert changes[15]["status"].before == "active" and changes[15]["status"].after == "blocked"
    assert changes[7]["model_pending"].before is None and changes[7]["model_pending"].after.model == "p/new"
    assert changes[14]["model_pending"].after is None
    assert changes[14]["model_last_failure"].after.reason == "host-rejected"
    assert changes[1]["config.fallback_models"].added == ["p/new"]
    assert changes[5]["consecutive_failures"].after == 1 and changes[5]["last_error"].after.endswith("429)")
    assert not by_pos[13].own and by_pos[13].changes == [] and by_pos[13].summary() == "reason=rejected"
    assert by_pos[8].summary() == "title=tests command=pytest"
    assert history.state.status == "blocked" and history.state.config.model == "p/old"


async def test_until_and_at_cut_the_timeline(store: LogStore) -> None:
    from loopd_es.clock import parse_rfc3339

    goal = await find_goal(store, GOAL)
    upto = await build_history(store, goal, until=7)
    assert [e.position for e in upto.entries] == [1, 2, 4, 5, 6, 7]
    assert upto.state.status == "active" and upto.state.model_pending is not None
    at = await build_history(store, goal, at=parse_rfc3339(f"{T0}12.5Z"))
    assert [e.position for e in at.entries][-1] == 12 and at.state.switch_in_flight is not None
    before = await build_history(store, goal, at=parse_rfc3339("2026-12-02T11:00:00Z"))
    assert before.entries == [] and not before.state.exists


async def test_refused_events_say_why(tmp_path: Path) -> None:
    steps: list[Step] = [
        (f"goal-{GOAL}", g.GoalCreated(goal_id=GOAL, name="n", objective="o", owner_session_id="o"), "req"),
        (
            f"goal-{GOAL}",
            g.GoalCreated(goal_id=GOAL, name="again", objective="o", owner_session_id="o"),
            "req",
        ),
    ]
    async with await open_store(await make_log(tmp_path, steps)) as store:
        history = await build_history(store, await find_goal(store, GOAL))
    assert history.entries[1].refused == "goal already exists" and history.entries[1].changes == []


# -- the projection -----------------------------------------------------------------------------------


def _rows(db: Path) -> list[Any]:
    with sqlite3.connect(db) as conn:
        links = conn.execute("SELECT * FROM goal_links ORDER BY goal_id, stream").fetchall()
        goals = conn.execute("SELECT * FROM goal_links_goals ORDER BY goal_id").fetchall()
    return [links, goals]


class _OneByOne(GoalLinks):
    """The same projection without its batch fast path: what ``apply`` alone builds."""

    apply_batch = None  # type: ignore[assignment]


async def test_projection_batch_incremental_and_per_event_agree(store: LogStore, tmp_path: Path) -> None:
    async with await Projector.open(store, [GoalLinks()], tmp_path / "batch.db") as projector:
        await projector.run_once()
    async with await Projector.open(store, [_OneByOne()], tmp_path / "single.db") as projector:
        await projector.run_once()
    rows = _rows(tmp_path / "batch.db")
    assert rows == _rows(tmp_path / "single.db")
    assert rows[0] == [
        (GOAL, f"command-{COMMAND}", 8, 8, 1),
        (GOAL, f"goal-{GOAL}", 1, 15, 9),
        (GOAL, f"switch-{SWITCH}", 11, 16, 4),
        (OTHER, f"goal-{OTHER}", 3, 9, 2),
    ]
    assert rows[1] == [(GOAL, 1, 16, 14), (OTHER, 3, 9, 2)]


async def test_projection_catches_up_before_it_is_trusted(tmp_path: Path) -> None:
    steps = chain_steps()
    url = await make_log(tmp_path, steps[:9])
    read_db = tmp_path / "read.db"
    async with await open_store(url) as store:
        first = await find_goal(store, GOAL, read_db=read_db, links=GoalLinks())
        assert first.streams == (f"goal-{GOAL}", f"command-{COMMAND}")
        later = envelopes(steps)[9:]
        for env in later:  # appended after the read model was built: the switch stream must still be found
            event = NewEvent(
                type=env.type,
                data=env.data,
                event_id=env.event_id,
                causation_id=env.causation_id,
                correlation_id=env.correlation_id,
            )
            await store.append(env.stream, [event])
        found = await find_goal(store, GOAL, read_db=read_db, links=GoalLinks())
    assert found.streams == (f"goal-{GOAL}", f"command-{COMMAND}", f"switch-{SWITCH}")


# -- the command line ---------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(*argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("registry", ["tests.unit.test_postmortem_history", "no_such_registry_module"])
def test_cli_history_json_and_cuts(tmp_path: Path, capsys: pytest.CaptureFixture[str], registry: str) -> None:
    url = anyio.run(make_log, tmp_path)
    code, out, err = _run(capsys, "--store", url, "history", "7f3a", "--json", "--registry", registry)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["goal_id"] == GOAL and doc["status"] == "blocked"
    assert doc["found_by"] == ("goal_links" if registry.startswith("tests") else "scan")
    assert [e["position"] for e in doc["events"]][-3:] == [14, 15, 16]
    blocked = doc["events"][-2]
    assert {"field": "status", "before": "active", "after": "blocked"} in blocked["changes"]
    assert blocked["causation_id"] == eid(10) and blocked["data"]["reason"].startswith("Pending model")
    code, out, _ = _run(capsys, "--store", url, "history", GOAL, "--until", "7", "--registry", registry)
    assert code == 0 and "cut at position 7" in out and "#7 " in out and "#8 " not in out
    assert "model_pending: - → {model: p/new" in out
    code, out, _ = _run(capsys, "--store", url, "history", GOAL, "--at", f"{T0}05Z", "--registry", registry)
    assert code == 0 and "#5 " in out and "#6 " not in out


def test_cli_history_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = anyio.run(make_log, tmp_path)
    code, out, err = _run(capsys, "--store", url, "history", "nope")
    assert code == 2 and out == "" and "no goal matches 'nope'" in err
    code, _, err = _run(capsys, "--store", url, "history", "7f")
    assert code == 2 and "ambiguous" in err
    code, _, err = _run(capsys, "--store", url, "history", GOAL, "--at", "yesterday")
    assert code == 2 and "invalid --at 'yesterday'" in err
    code, _, err = _run(capsys, "--store", url, "history", GOAL, "--until", "3", "--at", f"{T0}05Z")
    assert code == 2 and "not allowed with" in err


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(*args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_goals_history_holds_only_its_own_notices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the notifications stream holds every goal's notices; a goal's history once showed the other goals' too
    demo = tmp_path / "demo"
    assert main("demo", "--dir", str(demo)) == 0
    url = f"sqlite:{demo / 'events.db'}"
    capsys.readouterr()
    goals = json.loads(_cli(capsys, "--store", url, "goals", "--all", "--json")[1])["goals"]
    told = 0
    for goal in (row["goal_id"] for row in goals):
        history = json.loads(_cli(capsys, "--store", url, "history", goal, "--json")[1])
        notices = [e for e in history["events"] if e["stream"] == "notifications"]
        assert all(e["data"]["goal_id"] == goal for e in notices), goal
        told += len(notices)
    everything = _cli(capsys, "--store", url, "read", "--stream", "notifications", "--json")[1]
    assert told == len(everything.splitlines()) >= 2  # each notice in exactly one goal's history
