"""Exactly once with real processes: 8 ``loopd-es loop run`` racers over 1,000 slots of 50 tasks, with kill -9.

50 tasks (1 s, no jitter) in 10 sessions of a simulated host shared through its state file; racers are killed
with SIGKILL at random moments and replaced. At the end one more ``loop tick`` (after the claim lifetime) closes
whatever the killed racers left open. Then, from the log alone: every slot 1..20 of every task is either fired
(exactly one claim outcome, at most one success) or recorded missed - never both, never twice - and the host
received no more prompts than successes plus claims recorded as lost with their claimer.
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
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.clock import from_ms, to_ms
from loopd_es.domain.loop import decide
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import decode_payload
from loopd_es.log import open_store
from loopd_es.sched import service
from tests.waits import let_time_pass

if TYPE_CHECKING:
    from loopd_es.events.base import Event

ROOT = Path(__file__).resolve().parents[2]
RACERS = 8
SESSIONS = 10
PER_SESSION = 5
SLOTS = 20
INTERVAL = 1_000
CLAIM_TTL = 3_000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("LOOPD_ES_STORE", None)
    return env


def _racer(tmp: Path, n: int, duration: float) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp / 'ev.db'}", "loop", "--host",
        f"sim:{tmp / 'host.json'}", "run", "--all-sessions", "--claimer", f"racer-{n}", "--claim-ttl-ms",
        str(CLAIM_TTL), "--period-ms", "50", "--duration", str(duration),
    ]  # fmt: skip
    with (tmp / f"racer-{n}.err").open("ab") as err:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=_env(), cwd=tmp)


async def _create(tmp: Path, base: int) -> None:
    async with await open_store(f"sqlite:{tmp / 'ev.db'}") as store:
        for s in range(SESSIONS):
            for i in range(PER_SESSION):
                out = await service.handle(
                    store, f"1s --jitter=false task {s}.{i}", session_id=f"s{s}", now=from_ms(base), cfg=decide.Config(),
                    origin_id=f"m{s}.{i}", directory=tmp, home=tmp,
                )  # fmt: skip
                assert out.error is None, out.message


async def _events(tmp: Path) -> list[Event]:
    async with await open_store(f"sqlite:{tmp / 'ev.db'}", create=False) as store:
        return [
            decode_payload(env) async for env in store.read_all() if env.stream.startswith(ev.SESSION_PREFIX)
        ]


@pytest.mark.timeout(180)
def test_eight_racers_with_kill_9_fire_every_slot_exactly_once_or_record_it_missed(tmp_path: Path) -> None:
    rng = random.Random(14)
    sessions = [{"id": f"s{s}"} for s in range(SESSIONS)]
    (tmp_path / "host.json").write_text(json.dumps({"sessions": sessions, "auto_reply": True}))
    base = time.time_ns() // 1_000_000 + 3_000  # slot k of every task is due at base + k s
    anyio.run(_create, tmp_path, base)
    end = base + SLOTS * INTERVAL
    racers = {n: _racer(tmp_path, n, 60) for n in range(RACERS)}
    kills = 0
    next_racer = RACERS
    while time.time_ns() // 1_000_000 < end + 300:
        let_time_pass(rng.uniform(0.3, 1.2), "the racers work a random span before one is killed")
        victim = rng.choice(sorted(racers))
        racers[victim].send_signal(signal.SIGKILL)
        racers[victim].wait()
        kills += 1
        del racers[victim]
        racers[next_racer] = _racer(tmp_path, next_racer, 60)
        next_racer += 1
    for p in racers.values():
        p.send_signal(signal.SIGTERM)
    for p in racers.values():  # a racer still starting up dies of the SIGTERM itself, which is fine too
        assert p.wait(timeout=30) in (0, -signal.SIGTERM)
    for err in tmp_path.glob("racer-*.err"):
        assert "Traceback" not in err.read_text() and "error" not in err.read_text(), err.read_text()
    # one last tick after every claim's lifetime: it closes what killed racers left open
    after = time.time_ns() // 1_000_000 + CLAIM_TTL + 1
    final = subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp_path / 'ev.db'}", "loop", "--host",
         f"sim:{tmp_path / 'host.json'}", "tick", "--all-sessions", "--now", str(after),
         "--claim-ttl-ms", str(CLAIM_TTL)],
        env=_env(), cwd=tmp_path, capture_output=True, check=True,
    )  # fmt: skip
    assert final.returncode == 0

    events = anyio.run(_events, tmp_path)
    claims = Counter((e.task_id, e.slot, e.attempt) for e in events if isinstance(e, ev.SlotClaimed))
    assert max(claims.values()) == 1, "a slot attempt was claimed twice"
    successes = Counter((e.task_id, e.slot) for e in events if isinstance(e, ev.FireSucceeded))
    assert max(successes.values()) == 1, "a slot fired twice"
    closes = Counter(
        (e.task_id, e.slot, e.attempt) for e in events if isinstance(e, ev.FireSucceeded | ev.FireFailed)
    )
    assert closes == claims, "every claim has exactly one recorded outcome"
    missed: Counter[tuple[str, int]] = Counter()
    for e in events:
        if isinstance(e, ev.SlotsMissed):
            missed.update((e.task_id, k) for k in range(e.first_slot, e.last_slot + 1))
    claimed_slots = {(t, s) for t, s, _ in claims}
    tasks = {e.task_id for e in events if isinstance(e, ev.TaskCreated)}
    assert len(tasks) == SESSIONS * PER_SESSION
    for t in tasks:
        for slot in range(1, SLOTS + 1):
            key = (t, slot)
            assert (key in claimed_slots) != (missed[key] == 1), f"slot {key} is not accounted exactly once"
            assert missed[key] <= 1
    lost = sum(1 for e in events if isinstance(e, ev.FireFailed) and e.reason == "claimer-lost")
    state = json.loads((tmp_path / "host.state.json").read_text())
    prompts = state["next_prompt"] - 1
    fired = sum(successes.values())
    assert fired <= prompts <= fired + lost
    total = SESSIONS * PER_SESSION * SLOTS
    in_window = sum(1 for (t, s) in successes if s <= SLOTS)
    print(f"\nslots {total}, fired {in_window}, missed {sum(1 for k, v in missed.items() if k[1] <= SLOTS)}, "
          f"lost claims {lost}, kills {kills}, host prompts {prompts}")  # fmt: skip
    # How many slots fire depends on how fast this machine runs the racers; what must hold at any speed is that
    # none was recorded missed while it could still fire: slot k is missed only once slot k + 1 is due too.
    claimed = [e for e in events if isinstance(e, ev.SlotClaimed)]
    assert all(to_ms(e.due_at) == base + e.slot * INTERVAL for e in claimed), "slot k is due at base + k s"
    for e in events:
        if isinstance(e, ev.SlotsMissed):
            assert base + (e.last_slot + 1) * INTERVAL <= to_ms(e.at), (
                f"{e} gave up a slot that was still the latest"
            )
    # and the racers fire (they do not only record slots missed). Which sessions got a fire in the window depends
    # on the machine's speed too (under load, all of one session's 20 slots can pass while it is busy: seen with
    # two busy loops on two cores), so only firing at all is asserted.
    session_of = {e.task_id: e.session_id for e in events if isinstance(e, ev.TaskCreated)}
    fired_sessions = {session_of[t] for t, s in successes if s <= SLOTS}
    assert in_window > 0, (in_window, sorted(fired_sessions))
