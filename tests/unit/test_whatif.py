"""``loopd-es whatif`` and ``loopd-es replay --check`` on the demo log and on imported opencode-loopd projects.

Expectations are worked out from the logs themselves (which turn went idle first, how many turns ran after it),
not from the code under test. The check is shown to fail, naming goal, event and field, when a decider changes.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopd_es.cli.main import main
from loopd_es.clock import parse_rfc3339
from loopd_es.errors import UsageError
from loopd_es.log import open_store
from loopd_es.replay.policy import parse_policy
from loopd_es.replay.redecide import replay_goal_events
from loopd_es.replay.whatif import goal_streams

from .._profiles import scaled
from ..postgres_server import pg_url

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

__all__ = ["pg_url"]

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
DEPS = "5e1f0a3c-7b2d-4c8e-9f10-0000000000d4"
"""busy_day's "Upgrade dependencies": five 503s in a row, blocked at the fifth (the default limit)."""


def _streams(url: str) -> dict[str, list[Envelope]]:
    async def read() -> dict[str, list[Envelope]]:
        async with await open_store(url, create=False) as store:
            return await goal_streams(store)

    return anyio.run(read)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("demo")
    assert main("demo", "--dir", str(root / "d")) == 0
    return f"sqlite:{root / 'd' / 'events.db'}"


@pytest.fixture(scope="module")
def busy_day(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:{tmp_path_factory.mktemp('busy') / 'log.db'}"
    assert main("--store", url, "import-loopd", str(PROJECTS / "busy_day")) == 0
    return url


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    capsys.readouterr()
    code = main(*argv)
    return code, json.loads(capsys.readouterr().out)


# -- replay --check ------------------------------------------------------------------------------------


def _importable() -> Iterator[Path]:
    return (p for p in sorted(PROJECTS.iterdir()) if (p / ".opencode" / "loopd" / "state.json").exists())


def test_every_fixture_log_replays_as_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CI check over every fixture log: each project that imports replays with no decision changed."""
    checked = 0
    for project in _importable():
        url = f"sqlite:{tmp_path / project.name}.db"
        if main("--store", url, "import-loopd", str(project)) != 0:
            continue  # a project the importer rejects by design (corrupt, unknown version, wrong shape)
        code, body = _json(capsys, "--store", url, "replay", "--check", "--json")
        assert code == 0 and body["ok"] and body["failures"] == [], (project.name, body)
        checked += 1
    assert checked >= 7
    legacy = tmp_path / "legacy.ndjson"  # a log written before goal.created nested its configuration
    legacy.write_bytes((PROJECTS.parent / "goal_created_v1.ndjson").read_bytes())
    code, body = _json(capsys, "--store", f"ndjson:{legacy}", "replay", "--check", "--json")
    assert code == 0 and body["ok"] and body["goals"] == 1 and body["decisions"] == 1


def test_the_demo_log_replays_as_recorded(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    envs = [e for s in _streams(demo).values() for e in s]
    code, body = _json(capsys, "--store", demo, "replay", "--check", "--json")
    assert code == 0 and body["ok"] and body["goals"] == 3
    decided = {"run.started", "run.completed", "identity.provider_limit_observed"}
    switches = [e for e in envs if e.type in ("identity.switch_deferred", "identity.switch_requested")]
    assert switches and all(b'"worker_status":"' in bytes(e.data) for e in switches)  # re-made too
    assert body["decisions"] >= sum(e.type in decided for e in envs) + len(switches)
    assert main("--store", demo, "replay", "--check") == 0
    assert "all as recorded" in capsys.readouterr().out


def test_check_names_goal_event_and_field_when_the_failure_limit_changes(
    busy_day: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release that blocks after three failures instead of five reads the deps goal differently."""
    decide = importlib.import_module("loopd_es.domain.decide")  # the package exports a function by that name
    monkeypatch.setattr(decide, "DEFAULT_MAX_FAILURES", 3)
    third = next(
        e
        for e in _streams(busy_day)[DEPS]
        if e.type == "run.failed" and b'"consecutive_failures":3' in bytes(e.data)
    )
    capsys.readouterr()
    assert main("--store", busy_day, "replay", "--check") == 3
    out, err = capsys.readouterr()
    assert (
        f"goal {DEPS}: event #{third.position} (run.failed, v{third.version}) field run.failed.retry_after: "
        'recorded "2026-11-24T11:26:08.000Z", the current code decides null'
    ) in out
    assert err.count("\n") == 1 and "1 of 4 goal(s) would be read differently" in err


def test_check_names_the_retry_time_when_the_backoff_changes(
    busy_day: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    decide = importlib.import_module("loopd_es.domain.decide")  # the package exports a function by that name
    monkeypatch.setattr(decide, "backoff_ms", lambda failures, base, cap: 1000)
    first = next(e for e in _streams(busy_day)[DEPS] if e.type == "run.failed")
    code, body = _json(capsys, "--store", busy_day, "replay", "--check", "--json")
    assert code == 3 and not body["ok"]
    (failure,) = body["failures"]
    assert (failure["goal_id"], failure["position"], failure["field"]) == (
        DEPS,
        first.position,
        "run.failed.retry_after",
    )
    assert (
        failure["recorded"] == "2026-11-24T11:22:02.000Z"
        and failure["replayed"] == "2026-11-24T11:22:01.000Z"
    )


# -- whatif -------------------------------------------------------------------------------------------


def test_a_lower_turn_limit_stops_each_demo_goal_after_its_first_idle_turn(
    demo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    streams = _streams(demo)
    code, body = _json(capsys, "--store", demo, "whatif", "--all", "--set", "max_turns=1", "--json")
    assert code == 0
    total = 0
    for goal in body["goals"]:
        envs = streams[goal["goal_id"]]
        idle = next(e for e in envs if e.type == "run.completed")
        later = [e for e in envs if e.type == "run.started" and e.position > idle.position]
        d = goal["divergence"]
        assert (d["position"], d["outcome"], d["grace_turns"]) == (idle.position, "stops_earlier", 1)
        assert "ask for one wrap-up turn (Reached max turns (1))" in d["instead"]
        assert goal["saved_turns"] == max(0, len(later) - 1)
        assert goal["applies_through"] < idle.position
        total += goal["saved_turns"]
    assert body["totals"]["stop_earlier"] == 3 and body["totals"]["saved_turns"] == total
    assert body["summary"].startswith(
        f"with max_turns 1, 3 of 3 goal(s) stop earlier, saving {total} turn(s)"
    )


def test_a_lower_failure_limit_blocks_the_deps_goal_at_its_second_failure(
    busy_day: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main("--store", busy_day, "whatif", DEPS[:-1], "--set", "max_failures=2") == 0
    out = capsys.readouterr().out
    second = [e for e in _streams(busy_day)[DEPS] if e.type == "run.failed"][1]
    assert (
        f"first difference at event #{second.position} (run.failed, v{second.version}), run.failed.retry_after"
        in out
    )
    assert "block the goal (Failed 2 times. Last error: Provider error 503: upstream unavailable)" in out
    assert "stops earlier: saves 3 of 5 recorded turn(s)" in out
    assert f"apply through position {second.position - 1}" in out


def test_a_higher_failure_limit_runs_longer_than_the_log_can_tell(
    busy_day: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body = _json(capsys, "--store", busy_day, "whatif", DEPS, "--set", "max_failures=10", "--json")
    (goal,) = body["goals"]
    assert goal["divergence"]["outcome"] == "runs_longer"
    assert goal["divergence"]["instead"].endswith("the log has no observations past here")
    assert goal["saved_turns"] == 0 and body["totals"]["run_longer"] == 1


def test_usage_an_import_filled_in_as_one_total_is_not_charged_to_a_skipped_turn(
    busy_day: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # "Investigate flaky CI": loopd kept its usage as one total (88000 tokens, $0.61), filled in as one event in
    # the third turn; a lower turn limit once "saved" all of it, though the first two turns would still run
    flaky = "5e1f0a3c-7b2d-4c8e-9f10-0000000000c3"
    code, body = _json(capsys, "--store", busy_day, "whatif", flaky, "--set", "max_turns=1", "--json")
    (goal,) = body["goals"]
    assert goal["divergence"]["outcome"] == "stops_earlier" and goal["saved_turns"] == 1
    assert (goal["saved_tokens"], goal["saved_cost"], goal["recorded_tokens"]) == (0, 0.0, 88000)
    assert any("filled in from state.json as one total" in a for a in goal["assumptions"]), goal[
        "assumptions"
    ]


def test_another_fallback_order_changes_the_demo_fallback_and_says_what_it_assumes(
    demo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main("--store", demo, "whatif", "--all", "--set", "fallback_models=openai/gpt-x") == 0
    out = capsys.readouterr().out
    assert (
        'identity.fallback_prepared.model: recorded "anthropic/claude-sonnet-4-5", would be "openai/gpt-x"'
        in out
    )
    assert "assumes openai/gpt-x is taken as usable: the log records no catalog answer for it" in out
    assert "2 of 3 goal(s) decide differently otherwise" not in out


def test_no_fallbacks_makes_a_fallen_back_turn_a_counted_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without fallbacks the engine records the turn's failure (counted, backed off) and the observation; the
    what-if said the goal "would do nothing here", as if the error were ignored."""
    monkeypatch.chdir(tmp_path)
    error = '{"statusCode": 429, "responseHeaders": {"retry-after": "1"}}'
    goals = []
    for fallback in (("--fallback-model", "anthropic/claude-sonnet-4-5"), ()):
        capsys.readouterr()
        assert main("goal", "create", "g", "--objective", "o", "--model", "openai/gpt-5", *fallback,
                    "--read-only") == 0  # fmt: skip
        goals.append(capsys.readouterr().out.split()[0])
        assert main("goal", "observe-error", goals[-1], "--error", error) == 0
    capsys.readouterr()
    assert main("history", goals[1], "--json") == 0  # what the goal without a fallback recorded
    recorded = [e["type"] for e in json.loads(capsys.readouterr().out)["events"]][-2:]
    assert recorded == ["run.failed", "identity.provider_limit_observed"]
    capsys.readouterr()
    assert main("whatif", goals[0], "--set", "fallback_models=") == 0
    out = capsys.readouterr().out
    assert 'recorded "identity.provider_limit_observed", would be "run.failed"' in out
    assert "would count failure 1, retry at" in out and "would do nothing" not in out


def test_a_longer_idle_window_says_the_quiet_time_is_not_recorded(
    demo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, body = _json(capsys, "--store", demo, "whatif", "--all", "--set", "confirm_idle_ms=60000", "--json")
    divergences = [g["divergence"] for g in body["goals"] if g["divergence"]]
    assert divergences and all(d["field"] == "confirm_idle_ms" for d in divergences)
    assert all("whether the worker stayed quiet longer is not recorded" in d["instead"] for d in divergences)


def test_a_token_budget_stops_the_demo_goal_at_the_usage_that_exhausts_it(
    demo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    streams = _streams(demo)
    code, body = _json(capsys, "--store", demo, "whatif", "--all", "--set", "token_budget=1", "--json")
    hit = [
        g
        for g in body["goals"]
        if g["divergence"] and g["divergence"]["event_type"] == "goal.usage_accounted"
    ]
    assert hit, body
    for goal in hit:
        usage = next(e for e in streams[goal["goal_id"]] if e.type == "goal.usage_accounted")
        assert goal["divergence"]["position"] == usage.position
        assert goal["divergence"]["outcome"] == "stops_earlier"
        assert "Token budget exhausted" in goal["divergence"]["instead"]


def test_bad_settings_are_one_line_usage_errors(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (
        "max_turnz=3",
        "max_turns=0",
        "max_turns=x",
        "cost_budget=-1",
        "fallback_models=nope",
        "max_turns",
        "max_turns=",  # once "none"
        "max_turns=1_0",  # once 10
    ):
        capsys.readouterr()
        assert main("--store", demo, "whatif", "--all", "--set", bad) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--set" in err, err
    capsys.readouterr()  # a cap below the base once retried after 1 ms
    assert (
        main("--store", demo, "whatif", "--all", "--set", "backoff_base_ms=1000", "--set", "backoff_cap_ms=1")
        == 2
    )
    assert "is below backoff_base_ms=1000" in capsys.readouterr().err
    assert main("--store", demo, "whatif", "--all") == 2
    assert main("--store", demo, "whatif", "nosuchgoal", "--set", "max_turns=2") == 2
    assert main("--store", demo, "replay", "--check", "--until", "3") == 2


def test_policy_values() -> None:
    p = parse_policy(["max_turns=5", "fallback_models=a/b, c/d,a/b", "cost_budget=$4.5", "token_budget=none"])
    assert p.goal == {
        "max_turns": 5,
        "fallback_models": ("a/b", "c/d"),
        "cost_budget": 4.5,
        "token_budget": None,
    }
    assert p.describe() == "max_turns 5, fallback_models a/b,c/d, cost_budget 4.5, token_budget none"
    b = parse_policy(["backoff_base_ms=500"])
    assert b.backoff is not None and (b.backoff.base_ms, b.backoff.cap_ms) == (500, 30_000)
    with pytest.raises(UsageError):
        parse_policy(["confirm_idle_ms=none"])
    with pytest.raises(UsageError, match="--set max_turns given twice"):  # the last one silently won
        parse_policy(["max_turns=1", "max-turns=2"])


@pytest.fixture(scope="module")
def busy_streams(busy_day: str) -> dict[str, list[Envelope]]:
    return _streams(busy_day)


@given(turns=st.integers(1, 60), failures=st.integers(1, 8))
@example(turns=1, failures=1)
@example(turns=50, failures=5)
@settings(max_examples=scaled(30))
def test_any_limits_replay_without_inventing_turns(
    busy_streams: dict[str, list[Envelope]], turns: int, failures: int
) -> None:
    """Whatever the limits, a replay never claims to save more than was recorded after the point it stops at,
    and the recorded observations it uses end before that point."""
    policy = parse_policy([f"max_turns={turns}", f"max_failures={failures}"])
    for envs in busy_streams.values():
        rep = replay_goal_events(envs, policy)
        assert 0 <= rep.saved_turns <= rep.recorded_turns
        assert 0 <= rep.saved_tokens <= rep.recorded_tokens
        if rep.divergence is None:
            assert rep.saved_turns == 0 and rep.applies_through == envs[-1].position
        else:
            assert rep.applies_through < rep.divergence.position
            after = [e for e in envs if e.type == "run.started" and e.position > rep.divergence.position]
            assert rep.saved_turns <= len(after)


def test_the_readme_block_runs_top_to_bottom(tmp_path: Path) -> None:
    from .test_readme import _bash, _section_commands

    result = _bash(_section_commands("## What if? Replaying goals under another policy"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "all as recorded" in result.stdout
    assert "with max_turns 1, 3 of 3 goal(s) stop earlier" in result.stdout
    body = json.loads(result.stdout.splitlines()[-1])
    assert body["policy"]["goal"] == {"fallback_models": ["openai/gpt-5"], "max_failures": 2}


# -- pure: a goal decided here, every decision kind, recorded as the engine appends it ----------------------


class _Recorder:
    """A goal decided through :mod:`._domain_harness`, each decision recorded as one append (shared time, cause)."""

    def __init__(self) -> None:
        from ._domain_harness import Goal

        self.goal = Goal()
        self.envs: list[Envelope] = []

    def record(self, events: list[Any]) -> None:
        from loopd_es.events.envelope import Envelope

        at = self.goal.facts.now.isoformat().replace("+00:00", "Z")
        cause = f"cause-{len(self.envs)}"
        for event in events:
            n = len(self.envs) + 1
            self.envs.append(
                Envelope(
                    position=n,
                    stream="goal-g1",
                    version=n,
                    event_id=f"e{n}",
                    type=event.event_type,
                    schema_version=event.schema_version,
                    recorded_at=at,
                    causation_id=cause,
                    correlation_id=None,
                    data=msgspec.Raw(msgspec.json.encode(event)),
                )
            )

    def do(self, command: Any) -> None:
        self.record(self.goal.do(command))
        self.goal.tick(7)


def _story() -> _Recorder:
    """A scheduled goal: a turn without progress, two failures, a rejected then accepted completion."""
    from loopd_es.domain import goal_commands as c
    from loopd_es.events.goal import GoalWorkerAssigned

    rec = _Recorder()
    g = rec.goal
    rec.do(
        c.CreateGoal(
            goal_id="g1", name="nightly", objective="o", owner_session_id="owner-1", schedule_every_ms=60_000
        )
    )
    worker = GoalWorkerAssigned(goal_id="g1", worker_session_id="W")
    g.apply(worker)
    rec.record([worker])

    def turn() -> None:
        rec.do(c.StartRun(goal_id="g1", run_id=g.next_id("run"), prompt_message_id=g.next_id("p")))

    def idle() -> None:
        rec.do(
            c.ConfirmIdle(goal_id="g1", run_id=g.state.active_run_id or "", generation=g.state.run_generation)
        )

    turn()
    idle()  # no progress in turn 1
    turn()
    rec.do(c.RecordRunFailure(goal_id="g1", error_text="503"))
    turn()
    rec.do(c.RecordRunFailure(goal_id="g1", error_text="503"))
    turn()
    rec.do(c.ReportProgress(goal_id="g1", summary="half"))
    failed = c.CheckResult(command="bun test", exit_code=1, stderr="1 failed")
    rec.do(c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id="a1", check_results=(failed,)))
    idle()
    turn()
    rec.do(c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id="a2"))
    return rec


def test_every_decision_kind_replays_as_recorded() -> None:
    rec = _story()
    kinds = {e.type for e in rec.envs}
    assert {
        "run.started",
        "run.completed",
        "run.failed",
        "goal.completion_rejected",
        "goal.completed",
    } <= kinds
    rep = replay_goal_events(rec.envs)
    assert rep.divergence is None and rep.applies_through == rec.envs[-1].position
    assert rep.decisions == sum(
        e.type in ("run.started", "run.completed", "run.failed", "goal.completion_rejected", "goal.completed")
        for e in rec.envs
    )


def test_a_changed_schedule_time_is_named_by_field() -> None:
    """A release that computed the next scheduled run differently is caught at the completion."""
    rec = _story()
    last = rec.envs[-1]
    data = json.loads(bytes(last.data))
    data["next_run_at"] = "2030-01-01T00:00:00.000Z"
    rec.envs[-1] = msgspec.structs.replace(last, data=msgspec.Raw(json.dumps(data).encode()))
    d = replay_goal_events(rec.envs).divergence
    assert d is not None and (d.position, d.field) == (last.position, "goal.completed.next_run_at")
    assert d.recorded == "2030-01-01T00:00:00.000Z" and d.replayed != d.recorded


def test_what_if_no_progress_rejections_and_backoff_change(capsys: pytest.CaptureFixture[str]) -> None:
    rec = _story()
    quiet = parse_policy(["max_no_progress=1"])  # counted here, unlike the reference (whose guard is dead)
    d = replay_goal_events(rec.envs, quiet).divergence
    assert (
        d is not None and d.outcome == "stops_earlier" and "No progress for 1 consecutive turns" in d.instead
    )
    assert "opencode-loopd never does" in quiet.notes()[0]

    rejected = next(e for e in rec.envs if e.type == "goal.completion_rejected")
    d = replay_goal_events(rec.envs, parse_policy(["max_evaluator_rejections=1"])).divergence
    assert d is not None and d.position == rejected.position and d.outcome == "stops_earlier"
    assert "block the goal (Evaluator rejected 1 time(s)" in d.instead

    first_failure = next(e for e in rec.envs if e.type == "run.failed")
    rep = replay_goal_events(rec.envs, parse_policy(["backoff_base_ms=10000", "backoff_cap_ms=15000"]))
    d = rep.divergence
    assert d is not None and (d.position, d.field) == (first_failure.position, "run.failed.retry_after")
    failed_at = json.loads(bytes(first_failure.data))["at"]
    from datetime import timedelta

    from loopd_es.clock import parse_rfc3339

    assert parse_rfc3339(d.replayed) - parse_rfc3339(failed_at) == timedelta(
        seconds=15
    )  # min(15 s, 10 s * 2)


@pytest.fixture(params=["ndjson", "postgresql"])
def other_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "ndjson":
        return f"ndjson:{tmp_path / 'log.ndjson'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def test_check_reads_ndjson_and_postgresql_logs_and_one_stream(
    other_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = other_store
    assert main("--store", url, "import-loopd", str(PROJECTS / "busy_day")) == 0
    code, body = _json(capsys, "--store", url, "replay", "--check", "--json")
    assert code == 0 and body["ok"] and body["goals"] == 4
    code, body = _json(capsys, "--store", url, "replay", "--check", "--stream", f"goal-{DEPS}", "--json")
    assert code == 0 and body["goals"] == 1
    assert body["decisions"] == 10  # 5 run starts, 5 failures (the fifth's block is part of its decision)
    code, body = _json(capsys, "--store", url, "whatif", DEPS, "--set", "max_failures=2", "--json")
    assert body["goals"][0]["saved_turns"] == 3


def test_idle_windows_say_what_the_log_cannot_tell() -> None:
    """A turn idle at t, active again (a new idle candidate 10 s later), confirmed 3 s after that."""
    from loopd_es.domain import goal_commands as c
    from loopd_es.events.goal import GoalWorkerAssigned
    from loopd_es.events.run import RunIdleCandidate

    rec = _Recorder()
    g = rec.goal
    rec.do(c.CreateGoal(goal_id="g1", name="n", objective="o", owner_session_id="owner-1"))
    worker = GoalWorkerAssigned(goal_id="g1", worker_session_id="W")
    g.apply(worker)
    rec.record([worker])
    rec.do(c.StartRun(goal_id="g1", run_id="run-1", prompt_message_id="p1"))

    def candidate() -> None:
        at = g.facts.now.isoformat().replace("+00:00", "Z")
        event = RunIdleCandidate(goal_id="g1", run_id="run-1", generation=1, at=parse_rfc3339(at))
        g.apply(event)
        rec.record([event])

    candidate()
    g.tick(10)
    candidate()
    g.tick(3)
    rec.do(c.ConfirmIdle(goal_id="g1", run_id="run-1", generation=1))
    done = rec.envs[-1]
    assert done.type == "run.completed"

    assert (
        replay_goal_events(rec.envs).divergence is None
    )  # the recorded window is not in the log: not checked
    shorter = replay_goal_events(rec.envs, parse_policy(["confirm_idle_ms=9000"])).divergence
    assert shorter is not None and shorter.position == done.position and shorter.field == "confirm_idle_ms"
    assert "whether the turn would have been cut short is not known" in shorter.instead
    longer = replay_goal_events(rec.envs, parse_policy(["confirm_idle_ms=11000"])).divergence
    assert longer is not None and (longer.recorded, longer.replayed) == (3000, 11000)
    assert "whether the worker stayed quiet longer is not recorded" in longer.instead


def test_a_decision_the_deciders_now_refuse_names_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopd_es.domain import goal_commands as c
    from loopd_es.domain.rules import RuleError

    rec = _story()
    decide = importlib.import_module("loopd_es.domain.decide")

    def refuse(*_: Any) -> Any:
        raise RuleError("Completion needs a summary of at least 3 characters.")

    monkeypatch.setitem(decide._DECIDERS, c.CompleteGoal, refuse)
    rejected = next(e for e in rec.envs if e.type == "goal.completion_rejected")
    d = replay_goal_events(rec.envs).divergence
    assert d is not None and (d.position, d.field) == (rejected.position, "type")
    assert (d.recorded, d.replayed) == ("goal.completion_rejected", "refused")
    assert d.instead.startswith("would refuse it (Completion needs a summary of at least 3 characters.)")


# -- owner controls and switch decisions --------------------------------------------------------------------


def _controls_story() -> _Recorder:
    """A goal the owner pauses, resumes, retries and clears, and switches while the worker is busy and idle."""
    from loopd_es.domain import goal_commands as c
    from loopd_es.events.goal import GoalWorkerAssigned

    from ._domain_harness import AGENTS, CATALOG

    rec = _Recorder()
    g = rec.goal
    g.facts = msgspec.structs.replace(g.facts, model_catalog=CATALOG, agent_catalog=AGENTS)
    rec.do(c.CreateGoal(goal_id="g1", name="ctl", objective="o", owner_session_id="owner-1", model="p/old"))
    worker = GoalWorkerAssigned(goal_id="g1", worker_session_id="W")
    g.apply(worker)
    rec.record([worker])
    rec.do(c.StartRun(goal_id="g1", run_id="run-1", prompt_message_id="p1"))
    busy = g.do(
        c.SwitchIdentity(goal_id="g1", switch_id="s1", agent="new", caller="owner-1"), worker_status="busy"
    )
    rec.record(busy)
    rec.do(c.ConfirmIdle(goal_id="g1", run_id="run-1", generation=g.state.run_generation))
    rec.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s1"))
    rec.do(c.RecordSwitchOutcome(goal_id="g1", switch_id="s1", agent_result="applied"))
    rec.do(c.SwitchIdentity(goal_id="g1", switch_id="s2", model="p/new", caller="owner-1"))
    rec.do(c.RecordSwitchOutcome(goal_id="g1", switch_id="s2", model_result="applied"))
    rec.do(c.PauseGoal(goal_id="g1", caller="owner-1"))
    rec.do(c.ResumeGoal(goal_id="g1"))
    for _ in range(5):
        rec.do(c.StartRun(goal_id="g1", run_id=g.next_id("run"), prompt_message_id=g.next_id("p")))
        rec.do(c.RecordRunFailure(goal_id="g1", error_text="503"))
    rec.do(c.RetryGoal(goal_id="g1", caller="owner-1"))
    rec.do(c.ClearGoal(goal_id="g1"))
    return rec


CONTROLS = ("goal.paused", "goal.resumed", "goal.retried", "goal.cleared")
SWITCHES = ("identity.switch_deferred", "identity.switch_requested")


def test_owner_controls_and_switch_decisions_replay_as_recorded() -> None:
    rec = _controls_story()
    types = [e.type for e in rec.envs]
    assert all(t in types for t in (*CONTROLS, *SWITCHES, "goal.blocked"))
    assert types.count("identity.switch_requested") == 2  # the pending one applied, and the idle one
    rep = replay_goal_events(rec.envs)
    assert rep.divergence is None and rep.applies_through == rec.envs[-1].position
    assert rep.decisions == sum(t in (*CONTROLS, *SWITCHES, *_TURN_DECISIONS) for t in types)


_TURN_DECISIONS = ("run.started", "run.completed", "run.failed")


def _edited(rec: _Recorder, type_: str, nth: int = 0, **changes: Any) -> Envelope:
    """The ``nth`` ``type_`` event with ``changes`` to its payload (what another release would have written)."""
    env = [e for e in rec.envs if e.type == type_][nth]
    n = rec.envs.index(env)
    data = {**json.loads(bytes(env.data)), **changes}
    rec.envs[n] = msgspec.structs.replace(env, data=msgspec.Raw(json.dumps(data).encode()))
    return rec.envs[n]


def test_a_switch_is_re_made_under_the_worker_status_it_recorded() -> None:
    rec = _controls_story()
    _edited(rec, "identity.switch_deferred", worker_status="idle")
    assert replay_goal_events(rec.envs).divergence is None  # idle, but a turn is running: deferred still
    rec = _controls_story()
    requested = _edited(rec, "identity.switch_requested", 1, worker_status="busy")
    d = replay_goal_events(rec.envs).divergence
    assert d is not None and (d.position, d.field) == (requested.position, "type")
    assert (d.recorded, d.replayed) == ("identity.switch_requested", "identity.switch_deferred")


def test_a_switch_without_its_worker_status_is_not_counted() -> None:
    """A log written before switches recorded the worker status: those decisions cannot be re-made."""
    full = replay_goal_events(_controls_story().envs)
    rec = _controls_story()
    for env in [e for e in rec.envs if e.type in SWITCHES]:
        n = rec.envs.index(env)
        data = {k: v for k, v in json.loads(bytes(env.data)).items() if k != "worker_status"}
        rec.envs[n] = msgspec.structs.replace(env, data=msgspec.Raw(json.dumps(data).encode()))
    old = replay_goal_events(rec.envs)
    assert old.divergence is None and old.decisions == full.decisions - 3


@pytest.mark.parametrize(
    ("command", "event_type"),
    [("PauseGoal", "goal.paused"), ("ResumeGoal", "goal.resumed"), ("RetryGoal", "goal.retried")],
)
def test_a_control_the_deciders_now_ignore_is_named(
    monkeypatch: pytest.MonkeyPatch, command: str, event_type: str
) -> None:
    """A release whose pause, resume or retry would do nothing reads the recorded control differently."""
    from loopd_es.domain import goal_commands as c

    rec = _controls_story()
    decide = importlib.import_module("loopd_es.domain.decide")
    monkeypatch.setitem(decide._DECIDERS, getattr(c, command), lambda *_: [])
    recorded = next(e for e in rec.envs if e.type == event_type)
    d = replay_goal_events(rec.envs).divergence
    assert d is not None and (d.position, d.field) == (recorded.position, "events")
    assert (d.recorded, d.replayed) == ([event_type], [])
    assert d.instead.startswith("would do nothing here where the log recorded")


def test_a_clear_by_someone_other_than_the_owner_is_refused_on_replay() -> None:
    rec = _controls_story()
    cleared = _edited(
        rec, "goal.cleared", called_by={"role": "owner", "session_id": "intruder", "tool": "loopd_clear_goal"}
    )
    d = replay_goal_events(rec.envs).divergence
    assert d is not None and (d.position, d.field, d.replayed) == (cleared.position, "type", "refused")


# -- on a bundle ------------------------------------------------------------------------------------------


def _same_answer(goal: dict[str, Any]) -> dict[str, Any]:
    """A goal's what-if answer without the log positions (a bundle numbers its events afresh)."""
    d = goal["divergence"]
    d = d and {k: v for k, v in d.items() if k != "position"}
    keep = ("goal_id", "decisions", "saved_turns", "saved_tokens", "recorded_turns", "assumptions")
    return {"divergence": d, **{k: goal[k] for k in keep}}


@pytest.mark.parametrize("redact", ["default", "none"])
def test_whatif_and_check_on_a_bundle_answer_as_on_the_log(
    demo: str, busy_day: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], redact: str
) -> None:
    """``--store bundle:FILE``: the redacted text (errors, prompts) changes no decision and no what-if."""
    policies = ["max_turns=1", "max_failures=2", "fallback_models=openai/gpt-5", "confirm_idle_ms=9000"]
    demo_goals = [g["goal_id"] for g in _json(capsys, "--store", demo, "goals", "--json")[1]["goals"]]
    differing = 0
    for url, goal in [*((demo, g) for g in demo_goals), (busy_day, DEPS)]:
        bundle = tmp_path / f"{goal}-{redact}.bundle"
        assert main("--store", url, "bundle", goal, "-o", str(bundle), "--redact", redact) == 0
        store = f"bundle:{bundle}"
        code, body = _json(capsys, "--store", store, "replay", "--check", "--json")
        assert code == 0 and body["ok"] and body["goals"] == 1 and body["decisions"] > 0
        for policy in policies:
            code, on_log = _json(capsys, "--store", url, "whatif", goal, "--set", policy, "--json")
            assert code == 0
            code, on_bundle = _json(capsys, "--store", store, "whatif", goal, "--set", policy, "--json")
            assert code == 0
            assert [_same_answer(g) for g in on_bundle["goals"]] == [_same_answer(g) for g in on_log["goals"]]
            differing += sum(g["divergence"] is not None for g in on_bundle["goals"])
    assert differing >= len(demo_goals) + 1  # max_turns=1 stops each demo goal; max_failures=2 the deps goal
