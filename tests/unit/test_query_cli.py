"""``loopd-es goals | goal show | commands | identities``, run in-process against a scripted log."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.cli import main as cli
from loopd_es.cli import query_cmds
from loopd_es.events import goal as g
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store

from .test_projections_base import M2, A, B, append_story


def _show_handler() -> Any:
    parser = cli.build_parser()
    return parser.parse_args(["goal", "show", "x"]).handler


@pytest.fixture(autouse=True)
def our_goal_show(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``goal show`` (registered by ``saga_cmds``) answers from the read models."""
    monkeypatch.delenv(cli.STORE_ENV, raising=False)
    assert _show_handler() is query_cmds._goal_show
    yield


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scripted story in a SQLite log at the default place, ``.loopd/events.db``; no read db yet."""
    monkeypatch.chdir(tmp_path)

    async def make() -> None:
        async with await open_store("sqlite:.loopd/events.db") as store:
            await append_story(store)

    anyio.run(make)
    return tmp_path / ".loopd" / "events.db"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(*argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_goals_catches_up_then_lists_live_goals(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "goals")
    assert code == 0 and err == "" and (log.parent / "read.db").exists()
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "NAME",
        "STATUS",
        "PHASE",
        "MODEL",
        "TURNS",
        "TOKENS",
        "COST",
        "OWNER",
        "UPDATED",
    ]
    assert len(lines) == 2 and lines[1].split()[:6] == ["a1b2c3d4", "docs", "blocked", "idle", M2, "5/50"]
    assert "$0.0100/$1.00" in lines[1]

    code, out, _ = _run(capsys, "goals", "--all")
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [
        ["a1b2c3d4", "docs", "blocked"], ["a1b2ffff", "scratch", "cleared"],
    ]  # fmt: skip
    assert _run(capsys, "goals", "--status", "active")[1] == "no goals match\n"
    code, out, _ = _run(capsys, "goals", "--status", "cleared", "--json")
    (cleared,) = json.loads(out)["goals"]
    assert cleared["goal_id"] == B and cleared["status"] == "cleared"  # the JSON said "active"
    assert cleared["status_before_clear"] == "active"
    code, out, _ = _run(capsys, "goal", "show", B, "--json")
    assert json.loads(out)["goal"]["status"] == "cleared"
    assert "status      cleared (was active)" in _run(capsys, "goal", "show", B)[1]
    code, out, _ = _run(capsys, "goals", "--owner", "owner-1", "--json")
    (doc,) = json.loads(out)["goals"]
    assert (doc["goal_id"], doc["status"], doc["blocker_reason"], doc["tokens_used"]) == (
        A, "blocked", "needs an API key", 100,
    )  # fmt: skip


def test_no_catch_up_says_how_far_behind(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "goals", "--no-catch-up")
    head = 98
    assert code == 0 and out == "no goals\n"
    assert err == f"loopd-es: read models are {head} events behind the log (run `loopd-es project`)\n"
    assert _run(capsys, "goals")[2] == ""  # a query without the flag catches up

    async def more() -> None:
        async with await open_store("sqlite:.loopd/events.db") as store:
            created = g.GoalCreated(goal_id="late", name="late", objective="o", owner_session_id="me")
            await store.append(
                "goal-late", [new_event(created), new_event(g.GoalPaused(goal_id="late"))], "any"
            )

    anyio.run(more)
    code, out, err = _run(capsys, "goals", "--no-catch-up")
    assert "late" not in out and "read models are 2 events behind the log" in err
    code, out, err = _run(capsys, "goals", "--status", "paused")
    assert err == "" and out.splitlines()[1].split()[:3] == ["late", "late", "paused"]


def test_goal_show_by_prefix(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "goal", "show", "a1b2c")
    assert code == 0 and err == ""
    assert out.startswith(f"goal {A}  'docs'\n  status      blocked, phase idle\n")
    for expected in (
        "blocker     needs an API key [provider-limit] — needed: set KEY",
        "budgets     turns 5/50   tokens 100/10000   cost $0.0100/$1.00   time 2.5s/600s",
        "progress    outline written (next: write chapter 1)",
        "fallback    unavailable, attempted prov/m4, prov/m2, prov/m3; 1 provider limit(s)",
        "runs (6):", "identity switches:", "commands:", "awaits:",
    ):  # fmt: skip
        assert expected in out
    code, out, _ = _run(capsys, "goal", "show", A, "--json")
    doc = json.loads(out)
    assert sorted(doc) == [
        "awaits",
        "commands",
        "fallback",
        "goal",
        "kept",
        "provider_limits",
        "runs",
        "switches",
    ]
    assert [r["run_id"] for r in doc["runs"]] == ["r1", "r2", "r3", "r4", "r5", "r6"]
    assert [c["command_id"] for c in doc["commands"]] == ["c1"] and doc["fallback"]["attempted"][
        -1
    ] == "prov/m3"


def test_goal_show_errors(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "goal", "show", "zzz")
    assert (code, out) == (2, "") and err == (
        "loopd-es: no goal matches 'zzz'; `loopd-es goals --all` lists the goals and their ids\n"
    )
    code, _, err = _run(capsys, "goal", "show", "a1b2")
    assert code == 2 and "goal id prefix 'a1b2' is ambiguous (2 goals: " in err
    code, _, err = _run(capsys, "--store", "sqlite:nowhere/events.db", "goals")
    assert code == 2 and "no log at" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("cmd", "list"), ("cmd", "show", "abc"), ("cmd", "kill", "abc"), ("cmd", "reconcile"),
        ("loop", "list"), ("loop", "cancel", "abc"), ("loop", "stop-all"),
        ("goal", "pause", "abc"), ("goal", "clear", "abc"), ("goal", "recover"),
        ("worker", "get", "--session", "w"), ("owner", "nudge", "abc"),
    ],
)  # fmt: skip
def test_a_command_on_a_missing_log_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    """A mistyped --store used to become a new, empty log for these (exit 0 or "no goal matches"), and every
    later query then read that log instead of saying the path was wrong."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOOPD_SESSION", "s1")
    for store in ("sqlite:typo/events.db", "ndjson:typo.ndjson"):
        code, out, err = _run(capsys, "--store", store, *argv)
        assert (code, out) == (2, "") and "no log at" in err, err
        assert list(tmp_path.iterdir()) == []
    code, out, _ = _run(capsys, "--store", "sqlite:typo/events.db", "loop", "help")
    assert code == 0 and "/loop" in out and list(tmp_path.iterdir()) == []  # help needs no log


def test_commands(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "commands")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[1].split()[:6] == ["c1", "build", "terminated", "until", "143", "SIGTERM"]
    code, out, _ = _run(capsys, "commands", "--all", "--json")
    assert [(c["command_id"], c["status"], c["removed"]) for c in json.loads(out)["commands"]] == [
        ("c1", "terminated", 0), ("c2", "exited", 1),
    ]  # fmt: skip


def test_identities(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "identities", "a1b2c3")
    assert code == 0 and out.startswith(f"goal {A}  'docs': blocked, model {M2}, agent plan, pending -\n")
    assert "sw-d    applied → sw-p" in out and "rollback-failed" in out and "fallback  quota" in out
    code, out, _ = _run(capsys, "identities", A, "--json")
    doc = json.loads(out)
    assert len(doc["switches"]) == 9 and doc["history"][0]["event"] == "deferred"
    assert _run(capsys, "identities", B)[1].endswith("no identity switches\n")
    assert _run(capsys, "identities", "nope")[0] == 2


def test_queries_on_a_log_written_by_the_goal_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real decider output (the simulated host): a switch deferred while the worker is busy, then listed."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, "goal", "create", "docs", "--objective", "write the docs")
    assert code == 0
    goal_id = out.splitlines()[0]
    assert _run(capsys, "goal", "switch-identity", goal_id[:8], "--model", "openai/gpt-5-mini")[0] == 0
    code, out, _ = _run(capsys, "identities", goal_id[:8], "--json")
    (switch,) = json.loads(out)["switches"]
    assert (switch["status"], switch["model"], switch["requested_by"]) == (
        "deferred",
        "openai/gpt-5-mini",
        "cli",
    )
    code, out, _ = _run(capsys, "goals", "--json")
    (row,) = json.loads(out)["goals"]
    assert (row["goal_id"], row["pending_switch"], row["phase"]) == (
        goal_id,
        "model openai/gpt-5-mini (owner)",
        "running",
    )


def test_goal_show_joins_an_existing_goal_parser() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    actions = sub.add_parser("goal").add_subparsers()
    actions.add_parser("pause")
    query_cmds.register(sub)
    assert sorted(actions.choices) == ["pause", "show"]
    assert parser.parse_args(["goal", "show", "abc", "--no-catch-up"]).handler is query_cmds._goal_show

    def taken() -> None:
        own = argparse.ArgumentParser()
        own_sub = own.add_subparsers()
        own_actions = own_sub.add_parser("goal").add_subparsers()
        own_actions.add_parser("show").set_defaults(handler="theirs")
        query_cmds.register(own_sub)
        assert own.parse_args(["goal", "show"]).handler == "theirs"  # never replaces another module's show

    taken()


def test_short_ids_stay_unique() -> None:
    ids = ["01a236ff-2b4c-7001", "01a236ff-2c50-7001", "abc"]
    assert query_cmds.short_ids(ids) == {
        "01a236ff-2b4c-7001": "01a236ff-2b",
        "01a236ff-2c50-7001": "01a236ff-2c",
        "abc": "abc",
    }


@pytest.mark.parametrize(
    "argv",
    [("goal", "show"), ("explain",), ("history",), ("identities",), ("whatif", "--set", "max_turns=3"),
     ("goal", "pause")],
)  # fmt: skip
def test_every_command_taking_a_goal_id_resolves_it_alike(
    log: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    # explain '' once said "ambiguous" where identities '' said "no goal matches": four resolvers, one rule now
    where = 2 if argv[0] == "goal" else 1
    for text, expected in [
        ("", "no goal matches ''; `loopd-es goals --all` lists the goals and their ids"),
        ("zz", "no goal matches 'zz'; `loopd-es goals --all` lists the goals and their ids"),
        ("a1b2", f"goal id prefix 'a1b2' is ambiguous (2 goals: {A}, {B}); give more characters"),
    ]:
        code, out, err = _run(capsys, *argv[:where], text, *argv[where:])
        assert (code, out, err) == (2, "", f"loopd-es: {expected}\n"), argv


def test_no_catch_up_answers_from_the_read_models_when_the_log_cannot_be_reached(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it exited 4: the read models were there, only the log's head (for the "behind" note) could not be had
    assert _run(capsys, "goals")[0] == 0  # the read models, caught up
    read_db = str(log.parent / "read.db")
    away = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1: refused at once
    code, out, err = _run(capsys, "--store", away, "goals", "--read-db", read_db, "--no-catch-up")
    assert code == 0 and "docs" in out, (out, err)
    assert err.startswith("loopd-es: the log cannot be reached (") and "answering from the read models" in err
    code, out, err = _run(capsys, "--store", away, "goals", "--read-db", read_db)  # a catch-up needs the log
    assert (code, out) == (4, "") and "cannot connect" in err
