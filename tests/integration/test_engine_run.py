"""``loopd-es run`` as a real process: goals created from other processes advance by themselves; a standby
takes over when the lease runs out; SIGTERM stops it cleanly; kill -9 and a restart change nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.log import open_store
from tests.waits import wait_until

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState

pytestmark = pytest.mark.slow

SCRIPT = {"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}]}


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    env.update(LOOPD_ES_STORE=f"sqlite:{workdir / 'events.db'}", LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}")
    return env


def cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", *args],
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        text=True,
        timeout=30,
    )


def start_engine(workdir: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    """``loopd-es run`` in the background; its stderr goes to ``<name>.err`` (no pipe left to close)."""
    with (workdir / f"{name}.err").open("w") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopd_es",
                "run",
                "--holder",
                name,
                "--confirm-idle-ms",
                "100",
                "--maintenance-ms",
                "300",
                *extra,
            ],
            cwd=workdir,
            env=_env(workdir),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )


def engine_err(workdir: Path, name: str) -> str:
    return (workdir / f"{name}.err").read_text()


def host_state(workdir: Path) -> dict[str, Any]:
    path = workdir / "host.state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def prompts(workdir: Path, session: str) -> list[str]:
    return [p["text"] for p in host_state(workdir).get("prompts", []) if p["session_id"] == session]


def goal(workdir: Path, goal_id: str) -> GoalState:
    async def load() -> GoalState:
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            return fold([e async for e in store.read_stream(goal_stream(goal_id))], initial(goal_id))

    return anyio.run(load)


def _types(workdir: Path, goal_id: str) -> list[str]:
    async def read() -> list[str]:
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            return [e.type async for e in store.read_stream(goal_stream(goal_id))]

    return anyio.run(read)


def lease_record(workdir: Path) -> tuple[str, int]:
    """(holder, token) of the engine lease as the log's coordination records hold it (("", 0): none yet)."""

    async def read() -> tuple[str, int]:
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            found = [c for c in await store.coord_read("engine/lease") if c.key == "engine/lease"]
            return (found[0].holder, found[0].token) if found else ("", 0)

    return anyio.run(read)


def engine_facts(workdir: Path) -> list[dict[str, object]]:
    async def read() -> list[dict[str, object]]:
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            return [
                {"type": e.type, **e.data_dict()}
                async for e in store.read_all()
                if e.type.startswith("engine.")
            ]

    return anyio.run(read)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    yield tmp_path


def _create(workdir: Path, *extra: str) -> tuple[str, str]:
    out = cli(
        workdir,
        "goal",
        "create",
        "g",
        "--objective",
        "write done.txt",
        "--model",
        "p/m",
        "--agent",
        "build",
        *extra,
    )
    assert out.returncode == 0, out.stderr
    goal_id = out.stdout.splitlines()[0]
    session = goal(workdir, goal_id).worker_session_id
    assert session is not None
    return goal_id, session


def _stop(process: subprocess.Popen[str], workdir: Path, name: str, how: int = signal.SIGTERM) -> str:
    process.send_signal(how)
    process.wait(timeout=15)
    err = engine_err(workdir, name)
    assert process.returncode == 0, err
    return err


def test_end_to_end_goals_advance_fail_retry_complete_and_survive_a_kill(workdir: Path) -> None:
    engine = start_engine(workdir, "e1", "--lease-ms", "2000")
    try:
        goal_id, session = _create(workdir, "--check", "test -f done.txt")
        assert len(prompts(workdir, session)) == 1
        # the worker answers with usage and goes idle: the engine confirms and sends the next turn
        assert cli(workdir, "sim", "reply", session, "--input", "100", "--output", "20").returncode == 0
        wait_until("a continuation turn", lambda: len(prompts(workdir, session)) == 2)
        assert prompts(workdir, session)[1].startswith("This is continuation run 2")
        assert goal(workdir, goal_id).tokens_used == 120
        # a 429: the run fails, waits 2 s, and the engine retries by itself
        fail = cli(workdir, "sim", "fail", session, "--error", '{"statusCode": 429}')
        assert fail.returncode == 0, fail.stderr
        wait_until("the failure", lambda: goal(workdir, goal_id).consecutive_failures == 1)
        # kill -9 in the middle of the backoff; a new engine resumes the timer from the log
        engine.kill()
        engine.wait(timeout=10)
        engine = start_engine(workdir, "e2", "--lease-ms", "1000")
        wait_until("the retry turn", lambda: len(prompts(workdir, session)) == 3)
        assert "run.failed" in _types(workdir, goal_id)
        # a check that fails, then passes
        out = cli(workdir, "worker", "complete", "--session", session, "done", "see done.txt")
        assert "Evaluator rejected completion." in out.stdout
        (workdir / "done.txt").write_text("ok")
        out = cli(workdir, "worker", "complete", "--session", session, "done", "see done.txt")
        assert out.returncode == 0 and 'Goal "g" complete.' in out.stdout
        state = goal(workdir, goal_id)
        assert state.status == "complete" and state.consecutive_failures == 1
        notes = cli(workdir, "notifications", "--goal", goal_id[:8])
        assert 'Loop goal "g" completed: done. Evidence: see done.txt.' in notes.stdout
        history = cli(workdir, "history", goal_id)
        for fact in (
            "run.idle_candidate",
            "run.completed",
            "goal.usage_accounted",
            "run.failed",
            "goal.completion_rejected",
            "goal.completed",
        ):
            assert fact in history.stdout, fact
        assert len(set(prompts(workdir, session))) == len(prompts(workdir, session))  # nothing sent twice
    finally:
        if engine.poll() is None:
            _stop(engine, workdir, "e2")


def test_a_standby_takes_over_when_the_lease_runs_out_and_ctrl_c_releases_it(workdir: Path) -> None:
    first = start_engine(workdir, "first", "--lease-ms", "1500")
    second: subprocess.Popen[str] | None = None
    try:
        wait_until("the first engine's lease", lambda: lease_record(workdir)[0].startswith("first/"))
        second = start_engine(workdir, "second", "--lease-ms", "1500")
        wait_until("the standby", lambda: "standing by" in (workdir / "second.err").read_text())
        assert second.poll() is None
        first.send_signal(signal.SIGSTOP)  # a paused holder stops renewing; the standby waits for expiry
        wait_until("the takeover", lambda: lease_record(workdir)[0].startswith("second/"))
        assert lease_record(workdir)[1] == 2
        first.send_signal(signal.SIGCONT)
        err = _stop(first, workdir, "first")
        assert "lost the engine lease" in err or "stopped" in err
        # the old holder changed nothing after losing the lease: the second engine still holds it
        assert lease_record(workdir)[0].startswith("second/")
        err = _stop(second, workdir, "second", signal.SIGINT)  # Ctrl-C
        assert "SIGINT: stopping" in err and err.strip().endswith("stopped")
        assert lease_record(workdir) == ("", 2), "released"
        facts = engine_facts(workdir)
        assert [f["type"] for f in facts] == ["engine.took_over"], "the takeover is the one fact kept"
        assert str(facts[0]["previous_holder"]).startswith("first/")
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
