"""``loopd-es fork`` and ``loopd-es compare`` on the demo's log (real SQLite, the simulated host) and on an
imported loopd project: the fork's state is the source's at the chosen event, both are linked, history and
the HTML timeline show the branch, and the fork's worker starts from the source's transcript up to the
matching message (the host's fork, or a session primed with that transcript when the host has none).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from loopd_es.cli.main import main
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.state import GoalState
from loopd_es.events import goal as g
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store

DAY = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects" / "busy_day"
CARRIED = ("tokens_used", "cost_used", "run_count", "budget_turn_count", "last_progress", "status", "inbox")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "d"
    assert main("demo", "--dir", str(root)) == 0
    return root


@pytest.fixture
def demo(demo_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the demo (log and simulated host), so each test forks on its own."""
    root = tmp_path / "d"
    shutil.copytree(demo_dir, root)
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(*args)
    out, err = capsys.readouterr()
    return code, out, err


def envelopes(url: str, stream: str) -> list[Any]:
    async def read() -> list[Any]:
        async with await open_store(url, create=False) as store:
            return [e async for e in store.read_stream(stream)]

    return anyio.run(read)


def goal_id_named(url: str, name: str) -> str:
    async def find() -> str:
        async with await open_store(url, create=False) as store:
            async for env in store.read_all(types=["goal.created"]):
                if env.data_dict()["name"] == name:
                    return env.stream.removeprefix("goal-")
        raise AssertionError(f"no goal named {name}")

    return anyio.run(find)


def pause_active_writers(capsys: pytest.CaptureFixture[str], url: str, host: str) -> None:
    """Make room for a fork of a writer: one active workspace-writing goal at a time (the reference's rule)."""
    code, out, err = run(capsys, "--store", url, "goals", "--json")
    assert code == 0, err
    for goal in json.loads(out)["goals"]:
        if goal["status"] == "active" and goal["options"]["workspaceWrite"]:
            code, _, err = run(capsys, "--store", url, "goal", "pause", goal["goal_id"], "--host", host)
            assert code == 0, err


def fork_json(capsys: pytest.CaptureFixture[str], url: str, host: str, *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, "--store", url, "fork", *args, "--host", host, "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def test_a_fork_starts_with_the_sources_state_at_the_event_and_its_transcript(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, host = f"sqlite:{demo / 'events.db'}", f"sim:{demo / 'host.json'}"
    source = goal_id_named(url, "report")
    own = envelopes(url, f"goal-{source}")
    accounted = [e for e in own if e.type == "goal.usage_accounted"]
    point = accounted[0]  # after the first turn was counted: tokens, not yet the second turn
    report = fork_json(
        capsys,
        url,
        host,
        source[:8],
        "--at",
        str(point.position),
        "--model",
        "openai/gpt-5-mini",
        "--max-turns",
        "9",
        "--no-start",
    )
    fork = report["goal_id"]
    assert report["point"]["position"] == point.position and report["changed"] == ["model", "max_turns"]

    then = fold([e for e in own if e.position <= point.position], initial(source))
    now = fold(envelopes(url, f"goal-{fork}"), initial(fork))
    for name in CARRIED:
        assert getattr(now, name) == getattr(then, name), name
    assert now.tokens_used > 0 and now.config.model == "openai/gpt-5-mini" and now.config.max_turns == 9
    assert now.config.agent == then.config.agent and now.objective == then.objective
    assert now.anomaly_count == 0 and now.active_run_id is None
    assert source not in (now.config.progress_file or "")  # the fork's files are its own

    # linked both ways, in one append
    first = envelopes(url, f"goal-{fork}")[0]
    assert first.type == "goal.forked_from" and first.data_dict()["source_goal_id"] == source
    marks = [e for e in envelopes(url, f"goal-{source}") if e.type == "goal.forked"]
    assert [m.data_dict()["fork_goal_id"] for m in marks] == [fork]
    assert marks[0].position == first.position + 1 and marks[0].correlation_id == first.correlation_id

    # the worker: the host's fork of the source's session, through the last message counted at that point
    worker = report["worker"]
    assert worker["method"] == "fork" and worker["source_session_id"] == then.worker_session_id
    state = anyio.run(SimulatedHost.from_file(demo / "host.json").snapshot)
    kept = [m.message_id for m in state.transcripts[worker["session_id"]]]
    source_ids = [m.message_id for m in state.transcripts[then.worker_session_id or ""]]
    last = point.data_dict()["message_ids"][-1]
    assert kept == source_ids[: source_ids.index(last) + 1] and len(kept) == worker["kept_messages"]
    assert now.worker_session_id == worker["session_id"] != then.worker_session_id
    assigned = envelopes(url, f"goal-{fork}")[-1].data_dict()
    assert assigned["fork_method"] == "fork" and assigned["worker_session_id"] == worker["session_id"]


def test_history_and_the_html_timeline_show_the_branch_both_ways(
    demo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url, host = f"sqlite:{demo / 'events.db'}", f"sim:{demo / 'host.json'}"
    source = goal_id_named(url, "report")
    at = envelopes(url, f"goal-{source}")[3].position
    report = fork_json(capsys, url, host, source, "--at", str(at), "--agent", "plan")
    fork = report["goal_id"]
    assert report["first_turn"] == "started"  # an active fork with a worker goes on, as a new goal does
    started = [e for e in envelopes(url, f"goal-{fork}") if e.type == "run.started"]
    assert (
        len(started) == 1 and started[0].data_dict()["turn_count"] > 1
    )  # counting on from the source's turns

    code, out, _ = run(capsys, "--store", url, "history", fork)
    assert code == 0 and f"forked from goal {source} at #{at} (changed: agent)" in out.splitlines()[1]
    code, out, _ = run(capsys, "--store", url, "history", source)
    assert code == 0 and f"fork {fork} made at #{at}" in out
    code, out, _ = run(capsys, "--store", url, "history", source, "--json")
    assert json.loads(out)["branches"] == [
        {"kind": "fork", "goal_id": fork, "position": at, "changed": ["agent"]}
    ]
    page = tmp_path / "fork.html"
    assert run(capsys, "--store", url, "history", fork, "--html", str(page))[0] == 0
    code, out, _ = run(capsys, "--store", url, "history", fork, "--html", str(page), "--json")
    assert code == 0 and json.loads(out)["html"] == str(page)  # it printed the text line
    html = page.read_text()
    model = json.loads(html.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert model["branches"][0] == {
        "kind": "forked_from",
        "goal_id": source,
        "position": at,
        "changed": ["agent"],
    }
    assert model["segments"][0]["lane"] == "status"  # the fork's own status lane starts at its first event

    # A bundle renumbers its events: its fork facts name the fork point by the bundle's numbers (they kept the
    # source log's, where #N was another event or none), or say the bundle does not hold it.
    for goal, bundle in ((source, tmp_path / "source.bundle"), (fork, tmp_path / "fork.bundle")):
        assert run(capsys, "--store", url, "bundle", goal, "-o", str(bundle))[0] == 0
    code, out, _ = run(capsys, "--store", f"bundle:{tmp_path / 'source.bundle'}", "history", source, "--json")
    doc = json.loads(out)
    (branch,) = doc["branches"]
    point = next(e for e in doc["events"] if e["position"] == branch["position"])
    assert point["event_id"] == envelopes(url, f"goal-{source}")[3].event_id and branch["position"] != at
    code, out, _ = run(capsys, "--store", f"bundle:{tmp_path / 'fork.bundle'}", "history", fork)
    assert f"forked from goal {source} at an event this bundle does not hold" in out


def test_fork_by_time_takes_the_last_event_by_then(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, host = f"sqlite:{demo / 'events.db'}", f"sim:{demo / 'host.json'}"
    source = goal_id_named(url, "docs")
    own = envelopes(url, f"goal-{source}")
    pick = own[len(own) // 2]
    pause_active_writers(capsys, url, host)
    report = fork_json(capsys, url, host, source, "--at", pick.recorded_at, "--no-worker")
    last = [e for e in own if e.recorded_at <= pick.recorded_at][-1]  # one append's events share a time
    assert report["point"]["event_id"] == last.event_id and report["worker"] is None


def test_a_host_without_fork_primes_a_new_session_with_the_transcript(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = demo / "host.json"
    data = json.loads(script.read_text())
    script.write_text(json.dumps({**data, "can_fork": False}))
    url, host = f"sqlite:{demo / 'events.db'}", f"sim:{script}"
    source = goal_id_named(url, "report")
    at = envelopes(url, f"goal-{source}")[-1].position
    worker = fork_json(capsys, url, host, source, "--at", str(at), "--no-start")["worker"]
    assert worker["method"] == "primed" and worker["kept_messages"] > 0
    state = anyio.run(SimulatedHost.from_file(script).snapshot)
    (primer,) = state.transcripts[worker["session_id"]]
    earlier = state.transcripts[worker["source_session_id"]][: worker["kept_messages"]]
    assert primer.role == "user" and all(f"[{m.role}] {m.text}".rstrip() in primer.text for m in earlier)


def test_compare_lays_a_fork_beside_its_source(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, host = f"sqlite:{demo / 'events.db'}", f"sim:{demo / 'host.json'}"
    source = goal_id_named(url, "report")
    at = envelopes(url, f"goal-{source}")[2].position
    fork = fork_json(capsys, url, host, source, "--at", str(at), "--cost-budget", "1.5", "--no-start")[
        "goal_id"
    ]
    code, out, err = run(capsys, "--store", url, "compare", source, fork, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["relation"] == "fork" and result["shared_at"] == at
    rows = {r["field"]: r for r in result["rows"]}
    assert rows["cost_budget"] == {"field": "cost_budget", "a": None, "b": 1.5, "same": False}
    assert rows["objective"]["same"] and not rows["worker"]["same"]
    assert result["b"]["types_after"] == {"goal.worker_assigned": 1}
    assert result["a"]["events_after"] >= 1 and "goal.forked" in result["a"]["types_after"]
    code, out, _ = run(capsys, "--store", url, "compare", fork[:8], source[:8])
    assert code == 0 and "A was forked from B" in out and "≠ cost_budget" in out
    code, out, err = run(capsys, "--store", url, "compare", source, source[:6])  # once a goal against itself
    assert (code, out) == (2, "") and err == (
        f"loopd-es: {source!r} and {source[:6]!r} are the same goal ({source}); compare two different goals\n"
    )
    assert run(capsys, "--store", url, "goal", "clear", source)[0] == 0
    code, out, err = run(capsys, "--store", url, "compare", source, fork, "--json")
    rows = {r["field"]: r for r in json.loads(out)["rows"]}
    assert rows["status"]["a"] == "cleared (was blocked)"  # once shown as its status before the clear


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--at", "yesterday"), "invalid --at"),
        (("--at", "1"), "did not exist yet"),
        (("--at", "9", "--max-turns", "-1"), "--max-turns must be a number > 0"),
        (("--at", "9", "--max-turns", "1_0"), "--max-turns: not a whole number: '1_0'"),
        (("--at", "9999"), "--at 9999 is past the end of the log (its last position is "),
        (("--at", "9", "--max-turns", "99999999999999999999"), "--max-turns must be at most 1000000"),
        (("--at", "9", "--token-budget", str(10**16)), "--token-budget must be at most 1000000000000000"),
        (("--at", "9", "--cost-budget", "nan"), "--cost-budget must be a number > 0, got nan"),
        (("--at", "9", "--name", " "), "--name must not be empty"),
        (("--at", "9", "--objective", ""), "--objective must not be empty"),
        (("--at", "9", "--cost-budget", "inf"), "--cost-budget must be a number > 0, got inf"),
        (("--at", "60", "--model", "openai/gpt-9"), "the host offers no model 'openai/gpt-9'"),
        (("--at", "60", "--agent", "poet"), "the host offers no agent 'poet'"),
    ],
)
def test_bad_fork_requests_get_one_line_and_exit_2(
    demo: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], words: str
) -> None:
    url = f"sqlite:{demo / 'events.db'}"
    source = goal_id_named(url, "report")
    before = envelopes(url, f"goal-{source}")
    code, out, err = run(capsys, "--store", url, "fork", source, *args, "--host", f"sim:{demo / 'host.json'}")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and out == ""
    assert envelopes(url, f"goal-{source}") == before  # nothing written


def test_a_fork_may_lift_the_turn_limit_as_goal_create_does(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:{demo / 'events.db'}"
    source = goal_id_named(url, "report")
    code, out, err = run(capsys, "--store", url, "fork", source, "--at", "60", "--max-turns", "0", "--no-worker",
                         "--no-start", "--json", "--host", f"sim:{demo / 'host.json'}")  # fmt: skip
    assert code == 0, err
    fork = json.loads(out)
    assert fork["changed"] == ["max_turns"]
    (created,) = [e for e in envelopes(url, f"goal-{fork['goal_id']}") if e.type == "goal.forked_from"]
    assert created.data_dict()["config"]["max_turns"] == 0  # 0: no turn limit


def test_a_fork_may_not_be_a_second_active_writer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The single-writer rule holds for forks as for new goals: exit 3 naming the active writer, nothing
    written; once the source is paused the fork is made (and then the source may not resume)."""
    url = f"sqlite:{tmp_path / 'log.db'}"
    host = f"sim:{tmp_path / 'host.json'}"
    code, out, err = run(capsys, "--store", url, "goal", "create", "w", "--objective", "o", "--host", host)
    assert code == 0, err
    source = out.splitlines()[0]
    before = envelopes(url, f"goal-{source}")
    code, out, err = run(capsys, "--store", url, "fork", source, "--at", "1", "--host", host)
    assert code == 3 and out == ""
    assert f'Workspace-writing goal "w" ({source}) is already active.' in err
    assert envelopes(url, f"goal-{source}") == before
    assert run(capsys, "--store", url, "goal", "pause", source, "--host", host)[0] == 0
    fork = fork_json(capsys, url, host, source, "--at", "1", "--no-start")["goal_id"]
    code, _, err = run(capsys, "--store", url, "goal", "resume", source, "--host", host)
    assert code == 3 and f"({fork}) is already active" in err


def test_a_fork_of_an_imported_goal_has_its_state_at_that_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:{tmp_path / 'day.db'}"
    assert main("--store", url, "import-loopd", str(DAY)) == 0
    goal_id = "5e1f0a3c-7b2d-4c8e-9f10-0000000000a1"
    own = envelopes(url, f"goal-{goal_id}")
    from loopd_es.events.imported import happened_at

    when = happened_at(own[len(own) // 2])
    pause_active_writers(capsys, url, f"sim:{tmp_path / 'host.json'}")
    report = fork_json(capsys, url, f"sim:{tmp_path / 'host.json'}", goal_id, "--at", when)
    from loopd_es.clock import parse_rfc3339

    then = fold([e for e in own if parse_rfc3339(happened_at(e)) <= parse_rfc3339(when)], initial(goal_id))
    fork = fold(envelopes(url, f"goal-{report['goal_id']}"), initial(report["goal_id"]))
    for name in ("tokens_used", "run_count", "budget_turn_count", "last_progress", "objective"):
        assert getattr(fork, name) == getattr(then, name), name
    # the imported worker session is not on this host: the fork says so and is blocked, not half-made
    assert report["worker"] is None and "session" in report["worker_error"]
    assert fork.status == "blocked" and fork.blocker is not None


def test_the_fold_refuses_a_second_start_and_keeps_a_fork_note_on_a_cleared_goal() -> None:
    start = g.GoalForkedFrom(
        goal_id="b",
        source_goal_id="a",
        at_position=1,
        at_version=1,
        at_event_id="e",
        name="n",
        objective="o",
        state=msgspec.to_builtins(GoalState(goal_id="a", exists=True, tokens_used=7)),
    )
    state = fold([start, start], initial("b"))
    assert (
        state.tokens_used == 7 and state.anomaly_count == 1 and "already exists" in state.anomalies[0].reason
    )
    created = g.GoalCreated(goal_id="a", name="n", objective="o", owner_session_id="s")
    note = g.GoalForked(goal_id="a", fork_goal_id="b", at_position=1, at_version=1)
    cleared = fold([created, g.GoalCleared(goal_id="a"), note], initial("a"))
    assert cleared.anomaly_count == 0 and cleared.cleared
