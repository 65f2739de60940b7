"""/loop event times are instants (v2, RFC 3339 UTC text), and a log written with epoch milliseconds (v1) still reads.

Every bumped type is decoded from a v1 payload as the v1 writer stored it, and a whole v1 log is folded, fired on and
projected next to v2 events on a real SQLite log.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopd_es.clock import from_ms, from_ms_held, iso, to_ms
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.errors import InvalidEventError
from loopd_es.events import loop as ev
from loopd_es.events.base import CATALOGUE, Event
from loopd_es.events.catalogue import decode_data
from loopd_es.events.envelope import NewEvent
from loopd_es.events.upcasting import epoch_ms_to_text
from projections.loops import Loops

from ._loop_harness import T0, world

pytestmark = pytest.mark.anyio

V1: dict[str, dict[str, Any]] = {  # the smallest payload each type's v1 writer stored, times as epoch ms
    "loop.task_created": {"task_id": "t", "origin_id": "m", "session_id": "s1", "prompt": "p", "mode": "fixed",
                          "interval_ms": 1000, "jitter": False, "created_at": T0, "next_due_at": T0 + 1000},
    "loop.task_paused": {"task_id": "t", "at": T0 + 1},
    "loop.task_resumed": {"task_id": "t", "at": T0 + 2, "next_due_at": T0 + 1002},
    "loop.task_rescheduled": {"task_id": "t", "at": T0 + 3, "requested_next_due_at": T0 + 2500.5,
                              "next_due_at": T0 + 2500},
    "loop.task_converted_to_fixed": {"task_id": "t", "at": T0 + 4, "interval_ms": 1000, "jitter": False,
                                     "next_due_at": T0 + 1004},
    "loop.task_cancelled": {"task_id": "t", "reason": "user", "at": T0 + 5},
    "loop.task_adopted": {"task_id": "t", "owner": "b", "at": T0 + 6},
    "loop.slot_claimed": {"task_id": "t", "slot": 1, "due_at": T0 + 1000, "claimed_at": T0 + 1001, "claimer": "c",
                          "claim_expires_at": T0 + 61_001, "next_due_at": T0 + 2000},
    "loop.slots_missed": {"task_id": "t", "n": 2, "first_slot": 1, "last_slot": 2, "at": T0 + 7},
    "loop.fire_succeeded": {"task_id": "t", "slot": 1, "at": T0 + 8},
    "loop.fire_failed": {"task_id": "t", "slot": 1, "at": T0 + 9, "reason": "boom", "retry_at": T0 + 30_009},
    "loop.session_activated": {"session_id": "s1", "at": T0 + 10},
    "loop.session_deleted": {"session_id": "s1", "at": T0 + 11},
}  # fmt: skip


def _time_fields(cls: type[Event]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(cls) if "datetime" in repr(f.type)}


LEASE_FIELDS: dict[str, dict[str, str | None]] = {
    "loop.slot_claimed": {"claim_expires_at": None, "claimer": "by"}
}
"""What version 3 of a type took out of its payload (coordination, not history): dropped (None) or renamed."""


def test_every_loop_instant_is_typed_and_every_bumped_type_is_upcast() -> None:
    loop_types = {t: c for t, c in CATALOGUE.items() if t.startswith("loop.")}
    bumped = {t for t, c in loop_types.items() if c.schema_version >= 2}
    assert bumped == set(ev.EPOCH_MS_FIELDS) == set(V1)
    assert {t for t, c in loop_types.items() if c.schema_version == 3} == set(LEASE_FIELDS)
    for type_, cls in loop_types.items():
        retired = set(LEASE_FIELDS.get(type_, ()))
        assert _time_fields(cls) == set(ev.EPOCH_MS_FIELDS.get(type_, ())) - retired, type_
        assert not {f for f in _time_fields(cls) if f.endswith("_ms")}, "a duration is no instant"


@pytest.mark.parametrize("type_", sorted(V1))
def test_a_v1_payload_reads_as_the_same_instants(type_: str) -> None:
    old = V1[type_]
    e = decode_data(type_, msgspec.json.encode(old), 1)
    assert type(e) is CATALOGUE[type_]
    retired = LEASE_FIELDS.get(type_, {})
    for name in ev.EPOCH_MS_FIELDS[type_]:
        if name in retired:
            continue
        got = getattr(e, name)
        assert got == from_ms(old[name]) and got.utcoffset() == timedelta(0), (name, got)
    for name, value in old.items():  # every other field is kept as it was, under its new name if it has one
        if name not in ev.EPOCH_MS_FIELDS[type_] and retired.get(name, "") is not None:
            assert getattr(e, retired.get(name) or name) == value
    for name in retired:
        assert not hasattr(e, name)
    assert decode_data(type_, msgspec.json.encode(e)) == e  # and it writes back as the current version


def test_v1_absent_and_null_times_stay_absent_and_a_huge_one_is_held() -> None:
    claim = {**V1["loop.slot_claimed"], "next_due_at": None}
    assert decode_data("loop.slot_claimed", msgspec.json.encode(claim), 1).next_due_at is None  # type: ignore[attr-defined]
    failed = {k: v for k, v in V1["loop.fire_failed"].items() if k != "retry_at"}
    assert decode_data("loop.fire_failed", msgspec.json.encode(failed), 1).retry_at is None  # type: ignore[attr-defined]
    huge = {**V1["loop.task_created"], "next_due_at": T0 + 8_640_000_000_000_000}  # `/loop 100000000d` in v1
    created = decode_data("loop.task_created", msgspec.json.encode(huge), 1)
    assert created.next_due_at == datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)  # type: ignore[attr-defined]
    assert created.next_due_at == from_ms_held(huge["next_due_at"])  # type: ignore[attr-defined]


def test_the_upcaster_writes_utc_text_and_leaves_text_and_booleans_alone() -> None:
    step = epoch_ms_to_text("a", "b", "c", "d")
    assert step({"a": 0, "b": 1.5, "c": "2027-01-15T08:00:00Z", "d": True, "e": 5}) == {
        "a": "1970-01-01T00:00:00.000000Z",
        "b": "1970-01-01T00:00:00.001500Z",
        "c": "2027-01-15T08:00:00Z",
        "d": True,
        "e": 5,
    }


@pytest.mark.parametrize(
    "bad", ["2027-01-15T08:00:00", "2027-01-15T08:00:00.000", "", "soon", 1_800_000_000_000]
)
def test_a_v2_time_without_an_offset_or_not_a_time_is_refused(bad: object) -> None:
    data = msgspec.json.encode({"task_id": "t", "at": bad})
    with pytest.raises(InvalidEventError, match=r"invalid payload for loop.task_paused: .* at `\$\.at`"):
        decode_data("loop.task_paused", data)


def test_a_v2_offset_time_is_the_same_instant() -> None:
    e = decode_data("loop.task_paused", b'{"task_id":"t","at":"2027-01-15T10:00:00+02:00"}')
    assert isinstance(e, ev.TaskPaused)
    assert e.at == datetime(2027, 1, 15, 8, tzinfo=UTC) and e.at.utcoffset() == timedelta(hours=2)
    assert iso(e.at) == "2027-01-15T08:00:00.000Z"  # shown in UTC


async def test_a_v1_log_is_folded_fired_on_and_projected_with_current_events(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        tid = task_id_for("m-old")
        created = {**V1["loop.task_created"], "task_id": tid, "origin_id": "m-old", "created_at": T0,
                   "ran_on_creation": True, "next_due_at": T0 + 1000}  # fmt: skip
        await w.store.append(ev.session_stream("s1"), [NewEvent(type="loop.task_created", data=created)])
        active = {"session_id": "s1", "at": T0}
        await w.store.append(ev.ACTIVE_STREAM, [NewEvent(type="loop.session_activated", data=active)])
        t = await w.task(tid)
        assert (t.created_at, t.last_fired_at, t.next_due_at) == (
            from_ms(T0),
            from_ms(T0),
            from_ms(T0 + 1000),
        )
        w.now = T0 + 1000
        assert (await w.tick()).fired == [
            (tid, 1)
        ]  # the scheduler fires on the v1 task, writes today's events
        t = await w.task(tid)
        assert t.fires == 1 and t.next_due_at == from_ms(T0 + 2000) and t.last_fired_at == from_ms(T0 + 1000)
        envs = [env async for env in w.store.read_all()]
        written = [(env.type, env.schema_version) for env in envs if env.stream == ev.session_stream("s1")]
        assert written == [("loop.task_created", 1), ("loop.slot_claimed", 3), ("loop.fire_succeeded", 2)]
        conn = sqlite3.connect(":memory:")
        loops = Loops()
        loops.schema(conn)
        loops.apply_batch(conn, envs)
        row = conn.execute(
            "SELECT next_due_at, last_fired_at, fires FROM loops WHERE task_id = ?", (tid,)
        ).fetchone()
        assert row == (T0 + 2000, T0 + 1000, 1)  # the read model's columns stay epoch ms
        fire = conn.execute(
            "SELECT due_at, claimed_at, ended_at FROM loop_fires WHERE task_id = ?", (tid,)
        ).fetchone()
        assert fire == (T0 + 1000, T0 + 1000, T0 + 1000)
        assert to_ms(t.expires_at()) == T0 + 1000 + 7 * 86_400_000


def test_from_ms_held_keeps_an_instant_within_the_years_a_datetime_holds() -> None:
    assert from_ms_held(T0 + 0.5) == from_ms(T0 + 0.5)
    assert (
        from_ms_held(2**53)
        == datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
        == from_ms_held(float("inf"))
    )
    assert from_ms_held(-(2**53)) == datetime(1, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="NaN"):
        from_ms_held(float("nan"))


async def test_a_model_asking_for_a_time_past_year_9999_gets_the_last_millisecond(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path) as w:
        await w.loop("5m p", origin_id="x")
        tid = task_id_for("x")
        args = {"action": "reschedule", "taskId": tid, "nextDueAtMs": 2**53}
        r = await loop_schedule(w.store, args, session_id="s1", now=w.at, cfg=w.cfg, origin_id="o")
        assert r == {
            "ok": True,
            "requestedNextDueAt": "9999-12-31T23:59:59.999Z",
            "task": {"id": tid, "nextDueAt": "9999-12-31T23:59:59.999Z"},
        }
        [e] = [e for e in await w.events() if isinstance(e, ev.TaskRescheduled)]
        assert e.requested_next_due_at == e.next_due_at == from_ms_held(2**53)
        w.now += 86_400_000
        await w.activate("s1")
        assert (await w.tick()).fired == []


def test_a_v2_claim_reads_without_its_lease() -> None:
    """A ``loop.slot_claimed`` written before 0.5 held its claimer's lease (``claim_expires_at``): read today, the
    claimer is ``by`` and the lease is gone (fire records hold it beside the log), every decision kept."""
    v2 = {"task_id": "t", "slot": 3, "attempt": 2, "due_at": "2027-01-15T08:00:00Z", "claimed_at": "2027-01-15T08:00:01Z",
          "claimer": "engine-a", "claim_expires_at": "2027-01-15T08:01:01Z", "next_due_at": "2027-01-15T08:05:00Z",
          "jitter_offset_ms": 12, "fallback_u": None}  # fmt: skip
    e = decode_data("loop.slot_claimed", msgspec.json.encode(v2), 2)
    assert isinstance(e, ev.SlotClaimed)
    assert (e.slot, e.attempt, e.by, e.jitter_offset_ms) == (3, 2, "engine-a", 12)
    assert (e.due_at, e.next_due_at) == (
        datetime(2027, 1, 15, 8, 0, tzinfo=UTC),
        datetime(2027, 1, 15, 8, 5, tzinfo=UTC),
    )
    assert "claim_expires_at" not in msgspec.json.decode(msgspec.json.encode(e))
