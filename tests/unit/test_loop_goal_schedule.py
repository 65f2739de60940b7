"""Goal schedules (docs/reference/loopd.md#s3-15) through the same slot claims: requeue, max runs, writer
rule, one tick per slot."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import anyio
import msgspec
import pytest

from loopd_es.clock import from_ms
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.events import goal as g
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import decode_payload, new_event
from loopd_es.events.envelope import Envelope, NewEvent

from ._loop_harness import T0, World, world

pytestmark = pytest.mark.anyio


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


async def _goal(
    w: World, gid: str, *, writer: bool = False, every: int = 10_000, max_runs: int | None = 3
) -> None:
    config = g.GoalConfig(schedule=g.Schedule(every_ms=every, max_runs=max_runs), workspace_write=writer)
    created = g.GoalCreated(goal_id=gid, name=gid, objective="tick", owner_session_id="s1", config=config)
    await w.store.append(goal_stream(gid), [new_event(created)])


async def _complete(w: World, gid: str, next_run_at: int | None) -> None:
    done = g.GoalCompleted(
        goal_id=gid,
        summary="ok",
        evidence="e",
        next_run_at=from_ms(next_run_at) if next_run_at else None,
    )
    await w.store.append(goal_stream(gid), [new_event(done)])


async def _state(w: World, gid: str):  # type: ignore[no-untyped-def]
    return fold([env async for env in w.store.read_stream(goal_stream(gid))], initial(gid))


async def test_ticks_until_max_runs_with_the_reference_message(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await _goal(w, "g1")
        await _complete(w, "g1", T0 + 10_000)  # the initial run: count 1
        w.now = T0 + 9_999
        assert (await w.tick()).goal_ticks == 0
        w.now = T0 + 10_000
        assert (await w.tick()).goal_ticks == 1
        st = await _state(w, "g1")
        assert st.status == "active" and st.inbox[-1].text.startswith(
            "Scheduled tick 2/3 — re-execute the objective now."
        )
        assert "Previous completion: 1 runs." in st.inbox[-1].text
        assert (await w.tick()).goal_ticks == 0  # running: skipped
        await _complete(w, "g1", T0 + 20_000)
        w.now = T0 + 20_000
        assert (await w.tick()).goal_ticks == 1
        await _complete(w, "g1", None)  # count 3 = max: next_run_at cleared, stays complete
        w.now = T0 + 60_000
        assert (await w.tick()).goal_ticks == 0
        st = await _state(w, "g1")
        assert st.status == "complete" and st.schedule_run_count == 3
        slots = [decode_payload(e) async for e in w.store.read_stream(ev.goal_slot_stream("g1"))]
        assert [(type(s).__name__, getattr(s, "slot", None)) for s in slots] == [
            ("SlotClaimed", 2), ("FireSucceeded", 2), ("SlotClaimed", 3), ("FireSucceeded", 3),
        ]  # fmt: skip


async def test_a_forced_completion_of_a_ticked_run_is_ticked_again(tmp_path: Path) -> None:
    """A forced completion counts no run and keeps ``next_run_at`` (the reference's force complete leaves the
    schedule's counters alone), so the goal is complete and due again: the reference's next tick resumes it with
    the same tick number. Here that is the slot's next attempt, also for a scheduler started afterwards; the
    schedule used to stall, the slot taken, until the goal changed by other means."""
    async with world(tmp_path) as w:
        await _goal(w, "g1")
        await _complete(w, "g1", T0 + 10_000)
        w.now = T0 + 10_000
        assert (await w.tick()).goal_ticks == 1
        assert (await w.tick()).goal_ticks == 0  # running: skipped
        forced = g.GoalCompleted(goal_id="g1", summary="forced", evidence="", forced=True)
        await w.store.append(goal_stream("g1"), [new_event(forced)])
        assert (await w.tick()).goal_ticks == 1
        st = await _state(w, "g1")
        assert st.status == "active" and st.schedule_run_count == 1 and not st.anomaly_count
        assert [(i.input_id, i.text.split(" —")[0]) for i in st.inbox] == [
            ("schedule-tick-2", "Scheduled tick 2/3")  # not queued twice while it waits
        ]
        delivered = g.GoalInputDelivered(goal_id="g1", input_ids=("schedule-tick-2",))
        await w.store.append(goal_stream("g1"), [new_event(delivered), new_event(forced)])
        e2 = w.scheduler("e2")  # a new scheduler reads it from the log, and the fire record as it takes it
        assert (await w.tick(e2)).goal_ticks == 1
        assert (await w.tick()).goal_ticks == 0
        st = await _state(w, "g1")
        assert [(i.input_id, i.text.split(" —")[0]) for i in st.inbox] == [
            ("schedule-tick-2-3", "Scheduled tick 2/3")
        ]
        slots = [decode_payload(e) async for e in w.store.read_stream(ev.goal_slot_stream("g1"))]
        assert [(type(s).__name__, getattr(s, "slot", 0), getattr(s, "attempt", 0)) for s in slots] == [
            ("SlotClaimed", 2, 1), ("FireSucceeded", 2, 1),
            ("SlotClaimed", 2, 2), ("FireSucceeded", 2, 2),
            ("SlotClaimed", 2, 3), ("FireSucceeded", 2, 3),
        ]  # fmt: skip
        await _complete(w, "g1", T0 + 20_000)  # a verified completion counts the run: the next slot
        w.now = T0 + 20_000
        assert (await w.tick()).goal_ticks == 1  # by a scheduler whose record's token is out of date
        assert (await _state(w, "g1")).schedule_run_count == 2


async def test_writer_goal_waits_while_another_writer_is_active(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await _goal(w, "g1", writer=True)
        await _goal(w, "g2", writer=True)
        await _complete(w, "g1", T0 + 10_000)
        w.now = T0 + 10_000
        assert (await w.tick()).goal_ticks == 0
        wake = w.sched.next_wake()
        assert wake is not None and wake > w.at  # it waits without spinning: looked at again later ...
        await _complete(w, "g2", None)  # ... or as soon as the log changes
        assert (await w.tick()).goal_ticks == 1
        assert (await _state(w, "g1")).status == "active"


async def test_racing_schedulers_tick_a_goal_once(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await _goal(w, "g1", max_runs=None)
        await _complete(w, "g1", T0 + 10_000)
        w.now = T0 + 10_000
        scheds = [w.scheduler(f"e{i}") for i in range(4)]
        async with anyio.create_task_group() as tg:
            for s in scheds:
                tg.start_soon(s.fire_due)
        events = [decode_payload(e) async for e in w.store.read_stream(goal_stream("g1"))]
        assert sum(isinstance(e, g.GoalResumed) and e.by == "schedule" for e in events) == 1


def test_a_tick_is_decided_by_the_goal_rules_and_a_moved_on_goal_decides_nothing() -> None:
    """The scheduler appends what ``decide(RunOnSchedule)`` returns: a completed goal with runs left resumes with
    the tick message; an active goal, one without a schedule and one that used its runs decide nothing."""
    from loopd_es.domain.decide import decide
    from loopd_es.domain.goal_commands import Facts, RunOnSchedule

    at = from_ms(T0)
    config = g.GoalConfig(schedule=g.Schedule(every_ms=10_000, max_runs=2))
    created = g.GoalCreated(goal_id="g", name="g", objective="tick", owner_session_id="s1", config=config)
    done = g.GoalCompleted(goal_id="g", summary="ok", evidence="e", next_run_at=at)
    envs = [new_event(created), new_event(done)]
    state = fold(_enveloped(envs), initial("g"))
    tick = RunOnSchedule(goal_id="g", slot=2, at=at)
    resumed, queued = decide(tick, state, Facts(now=at))
    assert isinstance(resumed, g.GoalResumed) and resumed.by == "schedule"
    assert isinstance(queued, g.GoalInputQueued) and queued.input_id == "schedule-tick-2" and queued.at == at
    assert queued.text.startswith("Scheduled tick 2/2")
    active = fold(_enveloped([*envs, new_event(resumed)]), initial("g"))
    assert decide(tick, active, Facts(now=at)) == []
    unscheduled = g.GoalCreated(goal_id="g", name="g", objective="tick", owner_session_id="s1")
    assert (
        decide(tick, fold(_enveloped([new_event(unscheduled), new_event(done)]), initial("g")), Facts()) == []
    )


def _enveloped(events: list[NewEvent]) -> list[Envelope]:
    from loopd_es.clock import iso_us

    return [
        Envelope(i + 1, goal_stream("g"), i + 1, e.event_id, e.type, e.schema_version, iso_us(from_ms(T0)), None,
                 None, msgspec.Raw(e.data_bytes()))
        for i, e in enumerate(events)
    ]  # fmt: skip
