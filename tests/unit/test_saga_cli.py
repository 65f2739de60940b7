"""``loopd-es goal ...`` and the goal part of ``loopd-es models``, run in-process through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd_es.app.crashpoints import Crash, arm
from loopd_es.cli.main import main

SCRIPT = {
    "models": [{"provider": "p", "id": m} for m in ("old", "new", "last")],
    "agents": [{"name": a} for a in ("old", "new", "last")],
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'events.db'}")
    monkeypatch.setenv("LOOPD_ES_HOST", f"sim:{tmp_path / 'host.json'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _create(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(
        "goal",
        "create",
        "demo",
        "--objective",
        "do it",
        "--model",
        "p/old",
        "--agent",
        "old",
        "--read-only",
        *extra,
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[1].startswith('Goal "demo" created and started in the background.')
    return out[0]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(*args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_switch_deferred_then_applied_at_idle_via_a_prefix(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gid = _create(capsys, "--fallback-model", "p/last")
    code, out, _ = _run(capsys, "goal", "switch-identity", gid[:8], "--model", "p/new", "--agent", "new")
    assert code == 0
    assert out.splitlines() == [
        "Identity switch: deferred",
        "Identity switch deferred until the next permitted idle turn/prompt; no implicit wake.",
    ]
    code, out, _ = _run(capsys, "models")
    assert f"{gid}  'demo'  active  p/old / old  pending: p/new / new" in out
    _run(capsys, "sim", "reply", gid)  # the worker answers its first turn
    code, out, _ = _run(capsys, "goal", "idle", gid[:8])
    assert code == 0
    assert out.splitlines() == [
        "pending switch: Identity switched to p/new / new on the same worker/session.",
        "turn started",
    ]
    code, out, _ = _run(capsys, "goal", "show", gid, "--json")
    row = json.loads(out)["goal"]
    assert (row["model"], row["agent"], row["pending_switch"]) == ("p/new", "new", None)


def test_idle_counts_the_turns_usage_before_it_decides_the_next_turn(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The usage used to be counted while the next turn's prompt was built, after ``run.started``: a goal past
    its token budget got one more (paid) turn. And a worker its host reports busy has not ended its turn."""
    gid = _create(capsys, "--token-budget", "1000")
    code, out, _ = _run(capsys, "goal", "idle", gid)
    assert code == 0 and "still busy: its turn is not over, nothing was recorded" in out
    code, out, _ = _run(capsys, "read", "--json")
    assert "run.completed" not in out
    _run(capsys, "sim", "reply", gid, "--input", "1000", "--output", "200")
    code, out, _ = _run(capsys, "goal", "idle", gid)
    assert code == 0 and out.strip() == "goal is budget_limited: no turn"
    code, out, _ = _run(capsys, "read", "--json")
    types = [json.loads(line)["type"] for line in out.splitlines()]
    assert types[-3:] == ["goal.usage_accounted", "run.completed", "goal.budget_exhausted"]
    assert types.count("run.started") == 1
    (state,) = env.rglob("*.state.json")  # the simulated host's state, beside its script
    host = json.loads(state.read_text())
    assert len(host["prompts"]) == 1  # the first turn's only


def test_applied_on_an_idle_interactive_goal(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gid = _create(capsys, "--interactive")
    _run(capsys, "sim", "reply", gid)
    assert (
        _run(capsys, "goal", "idle", gid)[1]
        .strip()
        .endswith(
            "goal is interactive: the engine starts no turn (pending switches wait for an explicit turn)"
        )
    )
    code, out, _ = _run(capsys, "goal", "switch-identity", gid, "--agent", "new")
    assert (
        code == 0 and out.splitlines()[-1] == "Identity switched to p/old / new on the same worker/session."
    )


def test_rule_violations_exit_3_and_bad_arguments_exit_2_with_the_reference_message(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request the goal's state refuses is a conflict (3); an argument that is wrong on its own (an agent
    the host lacks, no model or agent, a malformed model) is bad input (2). Both say the reference's words."""
    gid = _create(capsys, "--interactive")
    code, _, err = _run(capsys, "goal", "switch-identity", gid, "--agent", "missing")
    assert (
        code == 2
        and err.strip()
        == "loopd-es: Agent is unavailable. Discover agents with `loopd-es models --usable` first."
    )
    code, _, err = _run(capsys, "goal", "switch-identity", gid)
    assert code == 2 and "At least one of model or agent is required." in err
    code, _, err = _run(capsys, "goal", "switch-identity", gid, "--agent", " ")
    assert code == 2 and "Agent name is required." in err
    code, _, err = _run(capsys, "goal", "switch-identity", gid, "--model", "p/new", "--resume")
    assert code == 3 and "resume is only valid for a provider-limit-blocked goal." in err
    code, _, err = _run(capsys, "goal", "create", "x", "--objective", "o", "--model", "bad model")
    assert code == 2 and 'Invalid model "bad model"' in err
    for flags, said in [
        (["--schedule-every-ms", "999"], "--schedule-every-ms must be a number >= 1000"),
        (["--schedule-every-ms", "1e20"], "--schedule-every-ms must be at most 3153600000000 (100 years)"),
        (["--schedule-max-runs", "2"], "--schedule-max-runs requires --schedule-every-ms"),
        (["--cost-budget", "nan"], "--cost-budget must be a positive number of dollars"),
    ]:
        code, out, err = _run(capsys, "goal", "create", "x", "--objective", "o", "--read-only", *flags)
        assert (code, out, err.strip()) == (2, "", f"loopd-es: {said}"), flags
    for argv, said in [(("", "--objective", "o"), "NAME must not be empty"),
                       (("x", "--objective", "  "), "--objective must not be empty")]:  # fmt: skip
        code, out, err = _run(capsys, "goal", "create", *argv, "--read-only")
        assert (code, out, err.strip()) == (2, "", f"loopd-es: {said}"), argv
    code, out, _ = _run(capsys, "streams")
    assert out.count("goal-") == 1  # only the first goal: nothing was stored for a refused one


def test_unknown_goal_and_bad_json_are_usage_errors(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gid = _create(capsys)
    code, _, err = _run(capsys, "goal", "pause", "zzz")
    assert code == 2 and "no goal matches 'zzz'" in err
    code, _, err = _run(capsys, "goal", "observe-error", gid, "--error", "{nope")
    assert code == 2 and "--error is not valid JSON" in err


def test_unsupported_host_exits_3_and_says_so(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (env / "host.json").write_text(json.dumps({**SCRIPT, "model_switching": "unsupported"}))
    gid = _create(capsys, "--interactive")
    code, out, _ = _run(capsys, "goal", "switch-identity", gid, "--model", "p/new")
    assert code == 3 and out.splitlines() == [
        "Identity switch: unsupported",
        "Identity switch unsupported on this host (see `loopd-es models --usable`). Goal/session retained.",
    ]


def test_owner_controls_print_the_reference_messages(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gid = _create(capsys)
    assert _run(capsys, "goal", "pause", gid)[1] == (
        f'Goal "demo" paused. Resume with `loopd-es goal resume {gid}`.\n'
    )
    assert _run(capsys, "goal", "pause", gid)[1] == 'Goal "demo" is already paused.\n'
    assert _run(capsys, "goal", "resume", gid)[1].startswith('Goal "demo" resumed.')
    assert _run(capsys, "goal", "resume", gid)[1] == 'Goal "demo" is already active.\n'
    code, _, err = _run(capsys, "goal", "retry", gid)
    assert code == 3 and "only a blocked goal can be retried" in err
    assert _run(capsys, "goal", "interactive", gid, "on")[1] == (
        f'Goal "demo" is now manual: the engine will not start turns — steer it with '
        f"`loopd-es owner send|nudge {gid}`.\n"
    )
    assert _run(capsys, "goal", "interactive", gid, "off")[1] == (
        'Goal "demo" is back on auto: the engine resumes idle recovery and retries.\n'
    )
    assert _run(capsys, "goal", "clear", gid)[1] == 'Goal "demo" cleared and removed.\n'
    assert "Goals: none" in _run(capsys, "models")[1]


def test_observe_error_prepares_the_fallback(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gid = _create(capsys, "--fallback-model", "p/new")
    error = json.dumps({"statusCode": 429, "message": "SECRET", "responseHeaders": {"retry-after": "60"}})
    code, out, _ = _run(capsys, "goal", "observe-error", gid, "--error", error)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("provider limit: rate-limit (session-error, status 429, retry at ")
    assert lines[1] == "fallback prepared after a rate limit: p/new (applies on the next permitted idle turn)"
    assert lines[2] == "turn ended as a fallback turn (not a failure): next turn on p/new at once"
    assert not any(line.startswith("run failed") for line in lines)
    code, out, _ = _run(capsys, "goal", "observe-error", gid, "--error", '"ECONNRESET"')
    assert out.splitlines()[-1] == "not a provider limit: no observation recorded"
    assert b"SECRET" not in (env / "events.db").read_bytes()
    code, _, err = _run(capsys, "goal", "observe-error", gid, "--error", error, "--model", "bad")
    assert code == 2 and 'Invalid model "bad"' in err  # it was recorded as the model "bad"
    _run(capsys, "goal", "clear", gid)
    for action in (("observe-error", gid, "--error", error), ("idle", gid), ("pause", gid)):
        code, _, err = _run(capsys, "goal", *action)  # "not a provider limit", "goal is complete: no turn"
        assert (code, err.strip()) == (3, "loopd-es: Goal not found."), action


def test_a_crashed_switch_is_recovered_by_the_next_command(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gid = _create(capsys, "--interactive")
    _run(capsys, "sim", "reply", gid)
    _run(capsys, "goal", "idle", gid)
    arm(8)  # between the model and the agent host calls
    try:
        with pytest.raises(Crash):
            main("goal", "switch-identity", gid, "--model", "p/new", "--agent", "new")
    finally:
        arm(None)
    code, out, err = _run(capsys, "goal", "pause", gid)  # any goal action settles open switches first
    assert code == 0 and "recovered identity switch" in err and "rolled-back" in err
    code, out, _ = _run(capsys, "goal", "show", gid, "--json")
    row = json.loads(out)["goal"]
    assert (row["model"], row["agent"], row["pending_switch"]) == ("p/old", "old", None)
    code, out, _ = _run(capsys, "read", "--json")
    failed = [json.loads(line)["data"] for line in out.splitlines() if '"identity.switch_failed"' in line]
    assert [f["reason"] for f in failed] == ["interrupted"]  # it said "host-rejected": no host refused it


def test_a_refused_first_goal_leaves_no_log_behind(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``goal create`` made the log before deciding, so a refused first goal left an empty log (or an empty
    PostgreSQL schema) that every later query then read. It decides in memory first where there is no log."""
    for bad in (("--model", "bad"), ("--schedule-every-ms", "500")):
        code, _, err = _run(capsys, "goal", "create", "g", "--objective", "o", *bad)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert not (env / "events.db").exists()
    assert "--schedule-every-ms" in err  # the flag, not the tool's field
    _create(capsys)  # a good one makes it
    assert (env / "events.db").exists()


def _config(capsys: pytest.CaptureFixture[str], gid: str) -> dict[str, object]:
    code, out, _ = _run(capsys, "read", "--stream", f"goal-{gid}", "--json")
    assert code == 0
    created = json.loads(out.splitlines()[0])
    assert created["type"] == "goal.created"
    config: dict[str, object] = created["data"]["config"]
    return config


def test_create_trims_texts_and_a_blank_check_means_the_default_one(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a blank check once replaced `bun test`, and a workspace-writing goal then completed without any check
    code, out, err = _run(capsys, "goal", "create", "w", "--objective", "o", "--check", "", "--check", "  ",
                          "--model", " p/old ", "--agent", " old ")  # fmt: skip
    assert code == 0 and err == ""
    config = _config(capsys, out.splitlines()[0])
    assert (config["checks"], config["model"], config["agent"]) == (["bun test"], "p/old", "old")
    code, out, err = _run(capsys, "goal", "create", "r", "--objective", "o", "--read-only", "--check", " ls ",
                          "--check", "", "--agent", " ")  # fmt: skip
    assert code == 0 and err == ""
    config = _config(capsys, out.splitlines()[0])
    assert (config["checks"], config["agent"]) == (["ls"], None)  # blank agent: absent, the host's default


def test_a_goal_whose_worker_the_host_refuses_is_recorded_blocked_and_said_on_stderr(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "goal", "create", "x", "--objective", "o", "--read-only", "--agent", "nosuch"
    )
    assert code == 4 and len(out.splitlines()) == 1  # the id only: scripts can resume it
    gid = out.strip()
    assert err.count("\n") == 1 and err.startswith(
        'loopd-es: goal "x" was recorded but could not start: host '
    )
    assert f"`loopd-es goal resume {gid}` starts it" in err
    code, out, _ = _run(capsys, "goal", "show", gid, "--json")
    assert code == 0 and json.loads(out)["goal"]["status"] == "blocked"


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cost-budget", "1_0"), ("--cost-budget", "0x10"), ("--cost-budget", "٣"), ("--max-turns", "1_0"),
     ("--max-turns", "٣"), ("--schedule-every-ms", "1_000")],
)  # fmt: skip
def test_numbers_are_decimal_as_the_tools_json_writes_them(
    env: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    # Python's float() and int() took `1_0` as 10 and Arabic-Indic digits as numbers
    code, out, err = _run(capsys, "goal", "create", "x", "--objective", "o", "--read-only", flag, value)
    assert (code, out) == (2, "") and f"argument {flag}: not a" in err and err.count("\n") == 1
    assert _run(capsys, "streams")[1] == ""  # nothing stored


def test_resume_makes_the_worker_a_refused_create_could_not(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # resume once said "resumed" then "goal has no worker session", and the goal sat active with no worker
    code, out, _ = _run(capsys, "goal", "create", "x", "--objective", "o", "--read-only", "--agent", "later")
    gid = out.strip()
    assert code == 4
    code, out, err = _run(capsys, "goal", "resume", gid)  # the host still refuses: said as create says it
    assert (code, out) == (4, "") and err.startswith('loopd-es: goal "x" could not start: host ')
    assert err.count("\n") == 1
    agents = [*SCRIPT["agents"], {"name": "later"}]
    (env / "host.json").write_text(json.dumps({**SCRIPT, "agents": agents}))  # the cause is fixed
    code, out, err = _run(capsys, "goal", "resume", gid)
    assert (code, err) == (0, "") and out.splitlines() == ['Goal "x" resumed.', "turn started"]
    code, out, _ = _run(capsys, "goal", "show", gid, "--json")
    row = json.loads(out)["goal"]
    assert (row["status"], row["agent"]) == ("active", "later") and row["worker_session_id"]


def test_create_makes_the_artifact_directory_where_checks_run(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # only the tool path made it: a read-only goal's checks then failed in a missing directory, every time
    code, out, _ = _run(capsys, "goal", "create", "x", "--objective", "o", "--read-only", "--check", "true")
    assert code == 0
    gid = out.splitlines()[0]
    assert (env / ".opencode" / "loopd" / "goals" / gid).is_dir()


@pytest.mark.parametrize(("budget", "shown"), [("0.0005", "/$0.0005"), ("0.004", "/$0.004"), ("5", "/$5.00")])
def test_a_small_cost_budget_shows_as_itself(
    env: Path, capsys: pytest.CaptureFixture[str], budget: str, shown: str
) -> None:
    # a budget under half a cent was shown as $0.00
    assert (
        _run(capsys, "goal", "create", "x", "--objective", "o", "--read-only", "--cost-budget", budget)[0]
        == 0
    )
    code, out, _ = _run(capsys, "goals")
    assert code == 0 and f"$0.0000{shown}" in out, out
