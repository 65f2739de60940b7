"""Many engines on one log (``loopd-es run --shared``): 3 engines, 300 goals on the simulated host, kill -9.

Engines are killed with SIGKILL at random moments and started again (a new member each time). From the log and
the host alone, afterwards: every goal ran to its end (none stranded), no prompt reached the host twice and every
recorded turn reached it (no goal turned by two engines at once), the log holds no coordination bookkeeping (only
the goals' moves between members), every claim ended released, every notice was delivered exactly once, the
goals were spread over several engines, and the /loop slots the engines fired meanwhile fired once each.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from loopd_es.app.goals import Goals
from loopd_es.app.service import Ctx, GoalService
from loopd_es.clock import from_ms
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.loop import decide
from loopd_es.domain.streams import aggregate_of
from loopd_es.engine.shares import CLAIM_PREFIX, MEMBER_PREFIX
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import decode_payload
from loopd_es.host import open_host
from loopd_es.log import open_store
from loopd_es.sched import service as loops
from tests.waits import let_time_pass, wait_until

from ..postgres_server import pg_url

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope
    from loopd_es.log.coord import Claim

pytestmark = pytest.mark.slow
__all__ = ["pg_url"]

ENGINES = 3
GOALS = int(os.environ.get("LOOPD_ES_SHARED_GOALS", "300"))
MAX_TURNS = 2
KILLS = 6
LOOP_SESSIONS = 3
SCRIPT = {
    "models": [{"provider": "p", "id": "m"}],
    "agents": [{"name": "build"}],
    "auto_reply": True,
    "sessions": [{"id": f"loop{i}"} for i in range(LOOP_SESSIONS)],
}


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shared log: a SQLite file, and a schema of the test PostgreSQL server (engines woken by NOTIFY)."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'events.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def _env(workdir: Path, store: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    env.update(LOOPD_ES_STORE=store, LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}")
    return env


def _engine(workdir: Path, store: str, name: str, *, lease_ms: int = 1500) -> subprocess.Popen[str]:
    with (workdir / f"{name}.err").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "loopd_es", "run", "--shared", "--holder", name, "--lease-ms", str(lease_ms),
             "--confirm-idle-ms", "100", "--maintenance-ms", "1000"],
            cwd=workdir, env=_env(workdir, store), stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip


async def _create_goals(workdir: Path, url: str, count: int) -> list[str]:
    ids = []
    async with await open_store(url) as store:
        host = await open_host(f"sim:{workdir / 'host.json'}")
        try:
            goals = Goals(GoalService(store, host))
            for i in range(count):
                state = await goals.create(
                    f"g{i}",
                    "o",
                    Ctx.new(),
                    model="p/m",
                    agent="build",
                    max_turns=MAX_TURNS,
                    workspace_write=False,
                )
                ids.append(state.goal_id)
            base = time.time_ns() // 1_000_000 + 1_000
            for i in range(LOOP_SESSIONS):
                out = await loops.handle(
                    store, f"1s --jitter=false tick {i}", session_id=f"loop{i}", now=from_ms(base), cfg=decide.Config(),
                    origin_id=f"m{i}", directory=workdir, home=workdir,
                )  # fmt: skip
                assert out.error is None, out.message
        finally:
            await host.aclose()
    return ids


def _read(url: str) -> list[Envelope]:
    async def read() -> list[Envelope]:
        async with await open_store(url) as store:
            return [e async for e in store.read_all()]

    return anyio.run(read)


def _finished(url: str, goal_ids: list[str]) -> int:
    blocked = {aggregate_of(e.stream)[1] for e in _read(url) if e.type == "goal.blocked"}
    return sum(1 for g in goal_ids if g in blocked)


@pytest.mark.timeout(900)
def test_three_shared_engines_with_kill_9_turn_each_goal_alone_and_strand_none(
    tmp_path: Path, store_url: str
) -> None:
    seed = random.randrange(1 << 30)
    rand = random.Random(seed)
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    engines = {f"e{i}": _engine(tmp_path, store_url, f"e{i}") for i in range(ENGINES)}
    started = ENGINES
    killed: set[str] = set()
    goal_ids = anyio.run(_create_goals, tmp_path, store_url, GOALS)
    try:
        for _ in range(KILLS):
            let_time_pass(rand.uniform(1.0, 4.0), "the engines work a random span before one is killed")
            victim = rand.choice(sorted(engines))
            engines[victim].kill()
            engines[victim].wait(timeout=10)
            del engines[victim]
            killed.add(victim)
            name = f"e{started}"
            started += 1
            engines[name] = _engine(tmp_path, store_url, name)
        wait_until(
            "every goal to reach its end",
            lambda: _finished(store_url, goal_ids) == len(goal_ids),
            within=600,
        )
        wait_until("the last notices to be delivered", lambda: _notices_delivered(store_url, goal_ids))
    finally:
        for p in engines.values():
            p.send_signal(signal.SIGTERM)
        for p in engines.values():
            p.wait(timeout=30)
    for err in tmp_path.glob("e*.err"):
        assert "Traceback" not in err.read_text(), err.read_text()[-3000:]

    events = _read(store_url)
    host = json.loads((tmp_path / "host.state.json").read_text())
    _check_turns(events, host, goal_ids, seed)
    _check_claims(store_url, events, goal_ids, seed)
    left = [m.holder for m in _coord(store_url, MEMBER_PREFIX) if m.holder.split("/")[0] not in killed]
    assert not left, f"members that stopped cleanly left their records: {left}"
    _check_notices(events, host, goal_ids, seed)
    _check_loops(events, host, seed)


def _check_turns(events: list[Envelope], host: dict[str, Any], goal_ids: list[str], seed: int) -> None:
    """Each worker session got exactly the prompts its goal recorded, each once (the host keeps only the last
    200 prompt records, so the per-session call counters and transcripts are what is compared)."""
    by_goal: dict[str, list[Envelope]] = {}
    for e in events:
        if e.stream.startswith("goal-"):
            by_goal.setdefault(aggregate_of(e.stream)[1], []).append(e)
    for goal_id in goal_ids:
        stream = by_goal[goal_id]
        state = fold(stream, initial(goal_id))
        assert state.anomaly_count == 0, (state.anomalies, seed)
        assert state.status == "blocked", (goal_id, state.status, seed)
        started = [e.data_dict()["prompt_message_id"] for e in stream if e.type == "run.started"]
        assert len(started) == MAX_TURNS + 1, (goal_id, len(started), seed)
        session = state.worker_session_id
        assert session is not None
        received = [m["message_id"] for m in host["transcripts"][session] if m["role"] == "user"]
        assert received == started, (
            f"{goal_id}: the host got {received}, the log recorded {started} (seed {seed})"
        )
        calls = host["counters"][f"prompt@{session}"]
        assert calls == len(started), (
            f"{goal_id}: {calls} prompt calls for {len(started)} turns (seed {seed})"
        )


def _check_claims(url: str, events: list[Envelope], goal_ids: list[str], seed: int) -> None:
    """The log holds no bookkeeping (no lease, membership, claim or fence event); the moves of goals between
    members are kept as facts; every claim ends released; the goals were spread over several engines.

    (One engine turning a goal at a time is shown by :func:`_check_turns`: each session got exactly the
    prompts its goal recorded.)"""
    bookkeeping = [e.type for e in events if e.type.startswith("engine.") and e.type != "engine.goal_moved"]
    assert not bookkeeping, f"coordination written into the log: {Counter(bookkeeping)} (seed {seed})"
    moves = [e.data_dict() for e in events if e.type == "engine.goal_moved"]
    assert all(m["member"] != m["previous_member"] and m["goal_id"] in goal_ids for m in moves), seed
    assert all(m["reason"] in ("takeover", "handover", "stopping") for m in moves), seed
    records = {c.key[len(CLAIM_PREFIX) :]: c for c in _coord(url, CLAIM_PREFIX)}
    held = sorted(g for g in goal_ids if g not in records or records[g].holder)
    assert not held, f"claims never released at the end: {held[:3]} (seed {seed}, {len(moves)} moves)"
    releasers = {records[g].info.split(" ", 1)[1] for g in goal_ids}
    assert len(releasers) >= 2, f"the goals were not spread over the engines: {releasers} (seed {seed})"
    assert not _coord(url, MEMBER_PREFIX + "nobody"), seed


def _coord(url: str, prefix: str) -> list[Claim]:
    async def read() -> list[Claim]:
        async with await open_store(url) as store:
            return await store.coord_read(prefix)

    return anyio.run(read)


def _notices_delivered(url: str, goal_ids: list[str]) -> bool:
    """Each goal's notice is requested and each one requested is delivered."""
    notices = [e for e in _read(url) if e.stream == "notifications"]
    requested = {e.data_dict()["notification_id"] for e in notices if e.type == "notification.requested"}
    delivered = {e.data_dict()["notification_id"] for e in notices if e.type == "notification.delivered"}
    return len(requested) == len(goal_ids) and requested <= delivered


def _check_notices(events: list[Envelope], host: dict[str, Any], goal_ids: list[str], seed: int) -> None:
    notices = [e for e in events if e.stream == "notifications"]
    requested = [e.data_dict()["notification_id"] for e in notices if e.type == "notification.requested"]
    delivered = [e.data_dict()["notification_id"] for e in notices if e.type == "notification.delivered"]
    assert len(requested) == len(set(requested)) == len(goal_ids), seed
    assert sorted(delivered) == sorted(requested), f"a notice was lost or delivered twice (seed {seed})"
    shown = [n["notification_id"] for n in host["notifications"]]
    assert sorted(shown) == sorted(requested), seed


def _check_loops(events: list[Envelope], host: dict[str, Any], seed: int) -> None:
    loop_events = [decode_payload(e) for e in events if e.stream.startswith(ev.SESSION_PREFIX)]
    claims = Counter((e.task_id, e.slot, e.attempt) for e in loop_events if isinstance(e, ev.SlotClaimed))
    successes = Counter((e.task_id, e.slot) for e in loop_events if isinstance(e, ev.FireSucceeded))
    assert claims and max(claims.values()) == 1, f"a slot attempt was claimed twice (seed {seed})"
    assert max(successes.values()) == 1, f"a loop slot fired twice (seed {seed})"
    lost = sum(1 for e in loop_events if isinstance(e, ev.FireFailed) and e.reason == "claimer-lost")
    closed = {
        (e.task_id, e.slot, e.attempt) for e in loop_events if isinstance(e, ev.FireSucceeded | ev.FireFailed)
    }
    still_open = len(set(claims) - closed)  # a claimer killed after its prompt, before recording the outcome
    prompts = sum(host["counters"].get(f"prompt@loop{i}", 0) for i in range(LOOP_SESSIONS))
    fired = sum(successes.values())
    assert fired <= prompts <= fired + lost + still_open, (fired, prompts, lost, still_open, seed)


def _claims(url: str) -> dict[str, str | None]:
    """Each goal's holder by its claim record (``None`` once released)."""
    return {c.key[len(CLAIM_PREFIX) :]: c.holder or None for c in _coord(url, CLAIM_PREFIX)}


@pytest.mark.timeout(180)
def test_a_clean_stop_hands_goals_over_at_once_and_exclusive_and_shared_engines_do_not_mix(
    tmp_path: Path,
) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    (tmp_path / "host.json").write_text(json.dumps({**SCRIPT, "auto_reply": False}))
    goal_ids = anyio.run(_create_goals, tmp_path, url, 12)
    a = _engine(tmp_path, url, "a", lease_ms=30_000)
    b = _engine(tmp_path, url, "b", lease_ms=30_000)
    exclusive = None
    try:
        wait_until(
            "both members to hold goals", lambda: len(set(_claims(url).values()) - {None}) == 2, within=30
        )
        with (tmp_path / "solo.err").open("w") as solo_err:
            exclusive = subprocess.Popen(
                [sys.executable, "-m", "loopd_es", "run", "--holder", "solo", "--lease-ms", "1000"],
                cwd=tmp_path, env=_env(tmp_path, url), stdout=subprocess.DEVNULL, stderr=solo_err, text=True,
            )  # fmt: skip
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=30) == 0
        # a left cleanly: b claims its goals at once, long before a's 30 s membership would have run out
        wait_until(
            "b to hold every goal",
            lambda: {h for g, h in _claims(url).items() if g in goal_ids} == {_member(url, "b")},
            within=15,
        )
        shared_note = "standing by: the goals are shared by engines started with --shared"
        wait_until(
            "the exclusive engine to stand by", lambda: shared_note in (tmp_path / "solo.err").read_text()
        )
        assert exclusive.poll() is None
        exclusive.send_signal(signal.SIGTERM)
        assert exclusive.wait(timeout=30) == 0
        err = (tmp_path / "solo.err").read_text()
        assert "engine running" not in err, err
    finally:
        for p in (a, b, exclusive):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert not [c for c in _coord(url, "engine/lease") if c.token], (
        "the exclusive engine never took the lease"
    )
    stops = [e.data_dict() for e in _read(url) if e.type == "engine.goal_moved"]
    reasons = {m["reason"] for m in stops}  # a's goals went to b when a stopped (and some when b joined)
    assert "stopping" in reasons and reasons <= {"stopping", "handover"}, stops


def _member(url: str, holder: str) -> str:
    """The member name of the running engine started with ``--holder holder``."""
    found = [
        c.key[len(MEMBER_PREFIX) :] for c in _coord(url, MEMBER_PREFIX) if c.holder.startswith(f"{holder}/")
    ]
    return found[0] if found else "?"
