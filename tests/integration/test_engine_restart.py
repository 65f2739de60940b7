"""kill -9 of ``loopd-es run`` at random points while goals are busy; after each restart nothing is lost or
done twice: every recorded turn reached the host exactly once, every goal runs to its end, every notice is
delivered once, and replaying each goal shows no refused event."""

from __future__ import annotations

import json
import random
from pathlib import Path

import anyio
import pytest

from loopd_es.clock import stamped_builtins
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.log import open_store
from tests.waits import let_time_pass, wait_until

from .test_engine_run import cli, host_state, start_engine

pytestmark = pytest.mark.slow

SCRIPT = {"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}], "auto_reply": True}
GOALS = 3
MAX_TURNS = 8
KILLS = 8


def _log(workdir: Path) -> dict[str, list[dict[str, object]]]:
    async def read() -> dict[str, list[dict[str, object]]]:
        out: dict[str, list[dict[str, object]]] = {}
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            async for e in store.read_all():
                out.setdefault(e.stream, []).append({"type": e.type, **e.data_dict(), "_env": e})
        return out

    return anyio.run(read)


def _finished(workdir: Path, goal_ids: list[str]) -> bool:
    streams = _log(workdir)
    return all(any(e["type"] == "goal.blocked" for e in streams.get(goal_stream(g), [])) for g in goal_ids)


@pytest.mark.timeout(180)
def test_kill_9_at_random_points_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rand = random.Random(seed)
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    lease = ["--lease-ms", "600"]
    engine = start_engine(tmp_path, "e0", *lease)
    goal_ids = []
    try:
        for i in range(GOALS):
            out = cli(
                tmp_path,
                "goal",
                "create",
                f"g{i}",
                "--objective",
                "o",
                "--model",
                "p/m",
                "--agent",
                "build",
                "--max-turns",
                str(MAX_TURNS),
                "--read-only",
            )
            assert out.returncode == 0, out.stderr
            goal_ids.append(out.stdout.splitlines()[0])
        for trial in range(KILLS):
            let_time_pass(rand.uniform(0.05, 0.5), "the engine works a random span before it is killed")
            engine.kill()
            engine.wait(timeout=10)
            engine = start_engine(tmp_path, f"e{trial + 1}", *lease)
        wait_until("every goal to reach its end", lambda: _finished(tmp_path, goal_ids), within=120)
        wait_until("the last notices to be delivered", lambda: _notices_delivered(tmp_path))
    finally:
        engine.kill()
        engine.wait(timeout=10)
    # a final engine delivers whatever a kill left pending, then stops cleanly
    final = start_engine(tmp_path, "final", *lease)
    wait_until("the final engine", lambda: _lease_holder(tmp_path).startswith("final/"), within=20)
    wait_until("the final engine to deliver every notice", lambda: _notices_delivered(tmp_path))
    final.terminate()
    final.wait(timeout=15)

    streams = _log(tmp_path)
    host = host_state(tmp_path)
    sent = [p["prompt_id"] for p in host["prompts"]]
    assert len(sent) == len(set(sent)), f"a prompt id was delivered twice (seed {seed})"
    for goal_id in goal_ids:
        events = streams[goal_stream(goal_id)]
        started = [str(e["prompt_message_id"]) for e in events if e["type"] == "run.started"]
        assert set(started) <= set(sent), f"a recorded turn never reached the host (seed {seed})"
        assert len(started) == MAX_TURNS + 1, (
            f"{len(started)} turns instead of max + the final one (seed {seed})"
        )
        state = fold([e["_env"] for e in events], initial(goal_id))  # type: ignore[misc]
        assert state.anomaly_count == 0, (state.anomalies, seed)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == f"Reached max turns ({MAX_TURNS}) (force-finish ignored)"
        replayed = cli(tmp_path, "replay", "--stream", goal_stream(goal_id), "--json")  # snapshots on the way
        assert replayed.returncode == 0, replayed.stderr
        assert json.loads(replayed.stdout) == stamped_builtins(state), seed
    notices = streams.get("notifications", [])
    requested = [str(e["notification_id"]) for e in notices if e["type"] == "notification.requested"]
    delivered = [str(e["notification_id"]) for e in notices if e["type"] == "notification.delivered"]
    assert len(requested) == GOALS and sorted(requested) == sorted(set(requested)), seed
    assert sorted(delivered) == sorted(requested), f"a notice was lost or delivered twice (seed {seed})"
    shown = [str(n["notification_id"]) for n in host["notifications"]]
    assert sorted(shown) == sorted(requested), seed


def _notices_delivered(workdir: Path) -> bool:
    """Every goal's notice is requested and each one requested is delivered."""
    notices = _log(workdir).get("notifications", [])
    requested = {e["notification_id"] for e in notices if e["type"] == "notification.requested"}
    delivered = {e["notification_id"] for e in notices if e["type"] == "notification.delivered"}
    return len(requested) == GOALS and requested <= delivered


def _lease_holder(workdir: Path) -> str:
    async def read() -> str:
        async with await open_store(f"sqlite:{workdir / 'events.db'}") as store:
            return next(
                (c.holder for c in await store.coord_read("engine/lease") if c.key == "engine/lease"), ""
            )

    return anyio.run(read)
