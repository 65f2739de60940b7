"""``loopd-es loop`` and ``loopd-es loops`` end to end (in-process ``main``), and the ``loops`` read model."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.log import open_store
from loopd_es.projector import Projector
from projections.loops import Loops

T0 = 1_800_000_000_000


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'ev.db'}")
    monkeypatch.setenv("LOOPD_SESSION", "s1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "host.json").write_text(
        json.dumps({"sessions": [{"id": "s1"}, {"id": "s2"}], "auto_reply": True})
    )
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(*argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_cancel_with_reference_texts_and_exit_codes(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "loop", "--message-id", "m1", "--now", str(T0), "add", "5m", "check", "the", "deploy"
    )
    tid = task_id_for("m1")
    assert code == 0 and out.strip() == (
        f'🔁 Loop started: every 5m (running now), prompt "check the deploy" [id={tid}] [s=s1]. '
        f"Cancel: `/loop cancel {tid}`"
    )
    code, out, err = run(capsys, "loop", "add", "5m")
    assert (code, out) == (2, "") and err.strip().startswith('❌ Missing prompt after interval "5m"')
    code, _, err = run(capsys, "loop", "add", "0", "9", "*", "*", "1-5")
    assert code == 2 and "Cron expressions are not supported" in err
    code, out, _ = run(capsys, "loop", "list")
    assert out.splitlines()[1] == f"  [{tid}] ▶ active • every 300s • check the deploy"
    code, _, err = run(capsys, "loop", "--session", "s2", "cancel", tid)
    assert code == 2 and err.strip() == f"❌ No task {tid} in this session"
    code, out, _ = run(capsys, "loop", "cancel", tid)
    assert (code, out.strip()) == (0, f"🛑 Cancelled {tid}")
    code, out, _ = run(capsys, "loop", "help")
    assert out.startswith("/loop — run prompts on a schedule")
    code, _, err = run(capsys, "loop", "frobnicate", "x")
    assert code == 2 and "unknown action" in err
    code, _, err = run(capsys, "loop", "--session", "", "add", "5m", "x")
    assert code == 2 and err.strip() == "❌ /loop requires an active session context"


def test_tick_loops_and_history(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "loop", "--message-id", "m1", "--now", str(T0), "add", "1m", "--jitter=false", "ping")
    tid = task_id_for("m1")
    code, out, _ = run(capsys, "loop", "tick", "--host", "sim:host.json", "--now", str(T0 + 60_000))
    assert code == 0 and json.loads(out)["fired"] == 1
    code, out, _ = run(capsys, "loop", "tick", "--host", "sim:host.json", "--now", str(T0 + 300_500))
    assert json.loads(out) | {"claimer": ""} == {"claimer": "", "fired": 1, "failed": 0, "missed": 3, "swept": 0,
                                                 "goal_ticks": 0}  # fmt: skip
    code, out, _ = run(capsys, "loops", "--json")
    [row] = json.loads(out)["loops"]
    assert (row["task_id"], row["next_due_at"], row["last_fired_at"], row["fires"], row["missed"]) == (
        tid, T0 + 360_000, T0 + 300_500, 2, 3,
    )  # fmt: skip
    code, out, _ = run(capsys, "loops")
    assert tid in out and "MISSED" in out
    code, out, _ = run(capsys, "loop", "history", tid)
    assert (
        "slot 1 attempt 1: succeeded" in out and "slots 2-4: missed (3)" in out and "slot 5 attempt 1" in out
    )
    code, _, err = run(capsys, "loop", "history", "nope")
    assert code == 2 and "no task" in err


def test_bare_loop_rereads_loop_md(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (env / "loop.md").write_text("tidy the backlog\n")
    code, out, _ = run(capsys, "loop", "--json", "--message-id", "b", "--now", str(T0), "add")
    doc = json.loads(out)
    assert doc["model_prompt"] == "tidy the backlog" and "maintenance mode" in doc["message"]
    code, out, _ = run(capsys, "loops", "--json")
    assert json.loads(out)["loops"][0]["mode"] == "maintenance"


def test_tool_channel(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "loop", "--now", str(T0), "tool", '{"action": "create", "prompt": "p", "intervalMs": 60000}'
    )
    doc = json.loads(out)
    assert code == 0 and doc["message"].startswith(f"Loop task created [id={doc['task']['id']}] [s=s1].")
    code, out, _ = run(capsys, "loop", "tool", '{"tool": "loop_status"}')
    assert json.loads(out)["activeTasks"] == 1
    code, out, _ = run(capsys, "loop", "tool", '{"action": "cancel", "taskId": "zzzzzzzz"}')
    assert code == 3 and json.loads(out) == {"ok": False, "error": "No task zzzzzzzz in this session"}
    code, _, err = run(capsys, "loop", "tool", '{"action": "create", "prompt": "   "}')
    assert (code, err.strip()) == (2, "loopd-es: prompt must be non-empty")
    code, _, err = run(capsys, "loop", "tool", '{"action": "create", "prompt": "\\ufeff\\u3000"}')
    assert (code, err.strip()) == (
        2,
        "loopd-es: prompt must be non-empty",
    )  # JavaScript's trim: a BOM is blank
    code, out, _ = run(capsys, "loop", "tool", '{"action": "create", "prompt": " spaced\\n"}')
    assert code == 0  # the reference's tool keeps the prompt as given
    code, out, _ = run(capsys, "loop", "tool", '{"tool": "loop_status"}')
    assert [t["prompt"] for t in json.loads(out)["tasks"]] == ["p", " spaced\n"]
    code, _, err = run(capsys, "loop", "tool", "{not json")
    assert code == 2 and "not JSON" in err


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"action": "create", "prompt": ["a", "b"]}, "`$.prompt`"),  # was stored as the prompt "['a', 'b']"
        ({"action": "create", "prompt": "p", "intervalMs": "60000"}, "`$.intervalMs`"),
        ({"action": "create", "prompt": "p", "intervalMs": 1e300}, "`$.intervalMs`"),
        ({"action": "create", "prompt": "p", "once": "false"}, "`$.once`"),
        ({"action": "reschedule", "taskId": 7}, "`$.taskId`"),
        ({"action": "list", "sessions": "all"}, "`sessions`"),
        (
            {"action": "create", "prompt": "p", "mode": "bogus"},
            "`$.mode`",
        ),  # was a maintenance task, prompt lost
        ({"action": "bogus"}, "`$.action`"),
        ({}, "`action`"),  # was {"ok": false, "error": "Unknown action: None"}
    ],
)
def test_tool_arguments_of_the_wrong_type_are_refused_naming_the_field(
    env: Path, capsys: pytest.CaptureFixture[str], call: dict[str, object], field: str
) -> None:
    code, out, err = run(capsys, "loop", "tool", json.dumps(call))
    assert (code, out) == (2, "") and len(err.splitlines()) == 1 and field in err, err
    code, out, _ = run(capsys, "loop", "tool", '{"tool": "loop_status"}')
    assert json.loads(out)["tasks"] == []  # nothing stored


def test_tool_answers_are_the_references_json(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No ``null`` where JavaScript leaves a key out, numbers as JavaScript writes them, and pause, resume and
    cancel answering the whole task record with epoch-ms times (docs/reference/loop-plugin.md#s5-1)."""
    now = ["loop", "--now", str(T0), "tool"]
    code, out, _ = run(capsys, *now, '{"action": "create", "prompt": "watch it"}')
    created = json.loads(out)["task"]
    assert code == 0 and list(created) == ["id", "mode", "sessionID", "nextDueAt"]  # was "intervalMs": null
    tid = created["id"]
    code, out, _ = run(capsys, *now, json.dumps({"action": "reschedule", "taskId": tid, "delayMs": 100}))
    assert '"requestedDelayMs": 100,' in out  # was 100.0
    code, out, _ = run(capsys, *now, json.dumps({"action": "pause", "taskId": tid}))
    assert json.loads(out)["task"] == {
        "id": tid, "prompt": "watch it", "mode": "adaptive", "adaptiveMinMs": 60_000, "adaptiveMaxMs": 3_600_000,
        "createdAt": T0, "lastFiredAt": 0, "nextDueAt": T0 + 60_000, "source": "user", "directory": str(env),
        "sessionID": "s1", "paused": True,
    }  # fmt: skip
    code, out, _ = run(
        capsys, *now, '{"action": "create", "prompt": "t", "intervalMs": 1500.5, "once": true}'
    )
    fixed = json.loads(out)["task"]["id"]
    code, out, _ = run(capsys, *now, json.dumps({"action": "cancel", "taskId": fixed}))
    removed = json.loads(out)["removed"]
    assert (removed["intervalMs"], removed["jitterEnabled"], removed["once"]) == (1501, True, True)  # rounded
    assert removed["nextDueAt"] == T0 + 1501 and json.loads(out)["message"] == f"Cancelled {fixed}"
    code, out, _ = run(capsys, *now, '{"action": "create", "prompt": "w"}')
    code, out, _ = run(capsys, *now, json.dumps({"action": "set_fixed", "taskId": json.loads(out)["task"]["id"],
                                                 "intervalMs": 1000.9}))  # fmt: skip
    assert json.loads(out)["task"]["intervalMs"] == 1001  # was cut to 1000 where /loop 1.0009s gives 1001


def test_a_message_id_sent_again_tells_the_truth(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A retried message answers as before while its task lives, says so once the task has ended (it used to
    say "Loop started ... (running now)"), and is refused with other arguments (they used to be dropped)."""
    first = run(capsys, "loop", "--message-id", "m1", "add", "5m", "foo")
    assert first[0] == 0 and run(capsys, "loop", "--message-id", "m1", "add", "5m", "foo") == first
    code, _, err = run(capsys, "loop", "--message-id", "m1", "add", "10m", "bar")
    assert code == 3 and "message m1 already created loop" in err
    tid = task_id_for("m1")
    run(capsys, "loop", "cancel", tid)
    code, out, _ = run(capsys, "loop", "--message-id", "m1", "add", "5m", "foo")
    assert (code, out.strip()) == (
        0,
        f"🔁 This message already started loop {tid}, which has since been cancelled; nothing new was started.",
    )
    assert "no loop tasks" in run(capsys, "loop", "list")[1].lower()


def test_read_model_rebuild_is_identical(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        run(capsys, "loop", "--message-id", f"m{i}", "--now", str(T0), "add", f"{i + 1}m", f"task {i}")
    run(capsys, "loop", "--now", str(T0), "pause", task_id_for("m1"))
    incremental = env / "inc.db"

    async def project(db: Path) -> None:
        async with await open_store(f"sqlite:{env / 'ev.db'}") as store:
            async with await Projector.open(store, [Loops()], db) as p:
                await p.run_once()

    anyio.run(project, incremental)
    for k in range(1, 6):
        assert (
            main("loop", "tick", "--all-sessions", "--host", "sim:host.json", "--now", str(T0 + k * 61_000))
            == 0
        )
        anyio.run(project, incremental)
    anyio.run(project, env / "fresh.db")
    capsys.readouterr()

    def dump(path: Path) -> list[list[object]]:
        conn = sqlite3.connect(path)
        try:
            return [
                sorted(conn.execute(f"SELECT * FROM {t}").fetchall())
                for t in ("loops", "loop_fires", "loop_missed")
            ]
        finally:
            conn.close()

    built = dump(incremental)
    assert built == dump(env / "fresh.db") and len(built[1]) >= 3


def test_goal_schedule_ticks_show_in_the_goals_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ._loop_harness import world
    from .test_loop_goal_schedule import _complete, _goal

    async def tick() -> None:
        async with world(tmp_path) as w:
            await _goal(w, "g1")
            await _complete(w, "g1", T0 + 10_000)
            w.now = T0 + 10_000
            assert (await w.tick()).goal_ticks == 1

    anyio.run(tick)
    assert main("--store", f"sqlite:{tmp_path / 'events.db'}", "history", "g1", "--json") == 0
    out = capsys.readouterr().out
    assert "loop.slot_claimed" in out and "loop.fire_succeeded" in out and "goal.resumed" in out


def test_scenario_39_history_is_the_log(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the reference appends fires to a history.log it rotates at 1 MB; here each fire is in the log, kept whole
    script = {
        "sessions": [{"id": "s1"}],
        "auto_reply": True,
        "failures": [{"op": "prompt", "on_call": 2, "error": "unavailable"}],
    }
    (env / "host.json").write_text(json.dumps(script))
    run(capsys, "loop", "--message-id", "m1", "--now", str(T0), "add", "1m", "--jitter=false", "ping")
    for k in (1, 2):
        run(capsys, "loop", "tick", "--host", "sim:host.json", "--now", str(T0 + k * 60_000))
    code, out, _ = run(capsys, "loop", "history", task_id_for("m1"), "--json")
    fires = json.loads(out)["fires"]
    assert [(f["slot"], f["outcome"]) for f in fires] == [(1, "succeeded"), (2, "failed")]
    assert "unavailable" in fires[1]["reason"]
    code, out, _ = run(capsys, "loop", "tool", '{"tool": "loop_status"}')
    recent = json.loads(out)["tasks"][0]["recentFires"]
    assert [(r["slot"], r["outcome"][:6]) for r in recent] == [(1, "succee"), (2, "failed")]


def test_run_keeps_ticking_after_a_transient_storage_failure() -> None:
    import argparse

    from loopd_es.cli import loop_cmds
    from loopd_es.clock import FakeClock, from_ms
    from loopd_es.errors import StorageError
    from loopd_es.sched.runner import FireReport

    class Flaky:
        calls = 0

        async def fire_due(self) -> FireReport:
            self.calls += 1
            if self.calls == 1:
                raise StorageError("database is busy")
            return FireReport(fired=[("t", self.calls)])

        def next_wake(self) -> datetime | None:
            return None

    sched = Flaky()
    totals = {"fired": 0, "failed": 0, "missed": 0, "swept": 0, "goal_ticks": 0}
    args = argparse.Namespace(duration=0.3, period_ms=50)
    anyio.run(loop_cmds._forever, sched, FakeClock(from_ms(T0)), args, totals)
    assert sched.calls >= 3 and totals["fired"] == sched.calls - 1


@pytest.mark.parametrize("session", ["a\x1bb", "s" * 200])
def test_a_session_id_that_cannot_name_a_session_changes_nothing(
    env: Path, capsys: pytest.CaptureFixture[str], session: str
) -> None:
    """A failing command activates its session, as in the reference, but an id no session stream can have
    is refused first: activating it stopped the active session's tasks firing, and no task could be added."""
    assert run(capsys, "loop", "--session", "ses_1", "add", "5m", "x")[0] == 0
    code, out, err = run(capsys, "--store", f"sqlite:{env / 'ev.db'}", "read", "--json")
    before = out
    code, out, err = run(capsys, "loop", "--session", session, "add", "5m", "y")
    assert code == 2 and "cannot name a session" in err and out == ""
    assert run(capsys, "--store", f"sqlite:{env / 'ev.db'}", "read", "--json")[1] == before


def test_loop_history_without_a_task_id_says_what_to_give(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "loop", "history")
    assert code == 2 and "loop history: give one task id" in err and "unknown action" not in err
