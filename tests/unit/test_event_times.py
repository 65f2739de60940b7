"""Payload times are aware UTC datetimes (#25 item 2): old stored text still reads, a naive time does not.

Every type whose time fields were ISO text bumped its version; an event stored at the old version carries
``""`` for "not recorded" and may carry another offset or millisecond precision. Each is checked here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopd_es.clock import stamp
from loopd_es.domain.evolve import fold, initial
from loopd_es.errors import InvalidEventError
from loopd_es.events.base import CATALOGUE
from loopd_es.events.catalogue import decode_data, decode_payload, validate
from loopd_es.events.envelope import ENVELOPE_DECODER, NewEvent
from loopd_es.events.upcasting import registered
from loopd_es.replay.redecide import replay_goal_events

_CALLER = {"role": "owner", "session_id": "s", "tool": "t"}

BUMPED: dict[str, tuple[int, dict[str, Any], tuple[str, ...]]] = {
    # type: (old version, the payload's other required fields, its time fields)
    "goal.created": (2, {"goal_id": "g", "name": "n", "objective": "o", "owner_session_id": "s"}, ("at",)),
    "goal.progress": (1, {"goal_id": "g", "summary": "s"}, ("at",)),
    "goal.completed": (1, {"goal_id": "g", "summary": "s", "evidence": "e"}, ("at", "next_run_at")),
    "goal.blocked": (1, {"goal_id": "g", "reason": "r", "needed": "n"}, ("at",)),
    "goal.input_queued": (1, {"goal_id": "g", "input_id": "i", "text": "t"}, ("at",)),
    "goal.worker_aborted": (1, {"goal_id": "g"}, ("at",)),
    "goal.turn_requested": (1, {"goal_id": "g"}, ("at",)),
    "goal.compaction_started": (1, {"goal_id": "g"}, ("at",)),
    "goal.compaction_completed": (1, {"goal_id": "g"}, ("at",)),
    "goal.forked_from": (
        1,
        {
            "goal_id": "g",
            "source_goal_id": "f",
            "at_position": 1,
            "at_version": 1,
            "at_event_id": "e",
            "name": "n",
            "objective": "o",
        },
        ("at",),
    ),
    "identity.switch_requested": (1, {"goal_id": "g", "switch_id": "w"}, ("at",)),
    "identity.switch_deferred": (1, {"goal_id": "g", "switch_id": "w"}, ("at",)),
    "identity.switch_applied": (1, {"goal_id": "g", "switch_id": "w", "target": "model"}, ("at",)),
    "identity.switch_failed": (
        1,
        {"goal_id": "g", "switch_id": "w", "target": "model", "stage": "host", "reason": "host-rejected"},
        ("at",),
    ),
    "identity.provider_limit_observed": (
        1,
        {"goal_id": "g", "kind": "quota", "source": "session-error"},
        ("observed_at", "retry_at"),
    ),
    "identity.fallback_prepared": (1, {"goal_id": "g", "model": "p/m", "attempted": []}, ("at",)),
    "run.started": (
        1,
        {"goal_id": "g", "run_id": "r", "generation": 1, "prompt_message_id": "m", "turn_count": 1},
        ("at", "lease_expires_at"),
    ),
    "run.idle_candidate": (1, {"goal_id": "g", "run_id": "r", "generation": 1}, ("at",)),
    "run.failed": (
        1,
        {"goal_id": "g", "run_id": "r", "error": "e", "consecutive_failures": 1},
        ("at", "retry_after"),
    ),
    "run.fell_back": (1, {"goal_id": "g", "run_id": "r", "kind": "quota", "to_model": "p/m"}, ("at",)),
    "run.confirm_failed": (1, {"goal_id": "g", "generation": 1, "reason": "worker-active"}, ("at",)),
    "notification.requested": (
        1,
        {
            "notification_id": "n",
            "goal_id": "g",
            "owner_session_id": "s",
            "kind": "complete",
            "text": "t",
            "cause_event_id": "c",
        },
        ("at",),
    ),
    "notification.delivered": (1, {"notification_id": "n", "goal_id": "g"}, ("at",)),
    "saga.switch_started": (1, {"switch_id": "w", "goal_id": "g", "session_id": "s"}, ("at",)),
    "saga.host_call_intended": (
        1,
        {"switch_id": "w", "key": "k", "op": "switch_model", "arg": "p/m"},
        ("at",),
    ),
    "compaction.started": (1, {"goal_id": "g", "run_count": 1}, ("at",)),
    "command.started": (
        1,
        {"command_id": "c", "title": "t", "command": "true", "cwd": "/"},
        ("started_at", "deadline_at"),
    ),
    "command.exited": (
        1,
        {"command_id": "c", "status": "exited", "end_reason": "exit"},
        ("ended_at", "owner_notified_at"),
    ),
    "command.await-requested": (1, {"goal_id": "g", "command_id": "c", "called_by": _CALLER}, ("at",)),
}

NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

LATER: dict[str, tuple[int, dict[str, str]]] = {
    # type: (versions bumped since its times became UTC, old field name -> the name it reads as now)
    "run.started": (1, {"lease_expires_at": "deadline"}),
    "identity.switch_failed": (1, {}),  # v3: the reason `interrupted`
}


def _now(type_: str, field: str) -> str:
    """The name an old payload's time field reads as today."""
    return LATER.get(type_, (0, {}))[1].get(field, field)


def _old(type_: str, times: dict[str, str]) -> Any:
    version, required, _ = BUMPED[type_]
    return decode_data(type_, msgspec.json.encode({**required, **times}), version)


def test_every_bumped_type_is_listed_here() -> None:
    """A type that moved to UtcTime has its old payloads tested below (``goal.created`` v1's nesting elsewhere)."""
    timed = {t for t, v in registered() if t in CATALOGUE and (t, v) != ("goal.created", 1)}
    timed -= {t for t in timed if CATALOGUE[t].__module__.endswith(".loop")}  # /loop's own, tested with it
    assert timed == set(BUMPED)
    assert all(
        CATALOGUE[t].schema_version == v + 1 + LATER.get(t, (0, {}))[0] for t, (v, _, _) in BUMPED.items()
    )


@pytest.mark.parametrize("type_", sorted(BUMPED))
def test_an_empty_time_of_the_old_version_reads_as_none(type_: str) -> None:
    fields = BUMPED[type_][2]
    event = _old(type_, dict.fromkeys(fields, ""))
    assert [getattr(event, _now(type_, f)) for f in fields] == [None] * len(fields)


@pytest.mark.parametrize("type_", sorted(BUMPED))
def test_an_offset_time_of_the_old_version_reads_as_the_utc_instant(type_: str) -> None:
    fields = BUMPED[type_][2]
    event = _old(type_, dict.fromkeys(fields, "2026-12-02T14:00:00.000+02:00"))
    for f in fields:
        moment = getattr(event, _now(type_, f))
        assert moment == NOON and moment.utcoffset().total_seconds() == 0, f
    # written back, the instant is UTC text
    assert b'"2026-12-02T12:00:00Z"' in NewEvent(type=type_, data=event).data_bytes()


@pytest.mark.parametrize("type_", sorted(BUMPED))
def test_the_old_versions_text_reads_to_its_precision(type_: str) -> None:
    """loopd-es wrote microseconds (``iso_us``) and milliseconds (``iso``, the reference's), both with ``Z``."""
    fields = BUMPED[type_][2]
    micro = _old(type_, dict.fromkeys(fields, "2026-12-02T12:00:00.123456Z"))
    milli = _old(type_, dict.fromkeys(fields, "2026-12-02T12:00:00.123Z"))
    for f in fields:
        assert getattr(micro, _now(type_, f)) == NOON.replace(microsecond=123456)
        assert getattr(milli, _now(type_, f)) == NOON.replace(microsecond=123000)


def test_a_run_started_of_v2_reads_its_lease_expires_at_as_the_deadline() -> None:
    """The run's timeout was named ``lease_expires_at`` (the reference's name) until v3; it is no lease."""
    v2 = b'{"goal_id":"g","run_id":"r","generation":1,"prompt_message_id":"m","turn_count":1,'
    started = decode_data("run.started", v2 + b'"lease_expires_at":"2026-12-02T12:00:00Z"}', 2)
    assert started.deadline == NOON  # type: ignore[attr-defined]
    assert decode_data("run.started", v2[:-1] + b"}", 2).deadline is None  # type: ignore[attr-defined]
    assert b'"deadline":"2026-12-02T12:00:00Z"' in NewEvent(type="run.started", data=started).data_bytes()


def test_goal_created_v1_reads_through_both_upcasters() -> None:
    v1 = b'{"goal_id":"g","name":"n","objective":"o","owner_session_id":"s","model":"p/m","at":""}'
    created = decode_data("goal.created", v1, 1)
    assert created.at is None and created.config.model == "p/m"  # type: ignore[attr-defined]
    v1 = v1.replace(b'"at":""', b'"at":"2026-12-02T13:00:00+01:00"')
    assert decode_data("goal.created", v1, 1).at == NOON  # type: ignore[attr-defined]


def test_a_naive_or_empty_time_at_the_current_version_is_a_malformed_event() -> None:
    with pytest.raises(InvalidEventError, match=r"invalid payload for goal.progress: .*timezone.* `\$\.at`"):
        validate("goal.progress", b'{"goal_id":"g","summary":"s","at":"2026-12-02T12:00:00"}')
    with pytest.raises(InvalidEventError, match=r"`\$\.at`"):
        validate("goal.progress", b'{"goal_id":"g","summary":"s","at":""}')
    with pytest.raises(InvalidEventError, match=r"`\$\.ended_at`"):
        validate("command.exited", b'{"command_id":"c","status":"exited","end_reason":"exit","ended_at":"x"}')


def test_a_stored_non_utc_offset_at_the_current_version_is_the_same_instant() -> None:
    """Nothing of ours writes one; if a log holds one, it compares as the instant it names."""
    event = decode_data(
        "run.idle_candidate", b'{"goal_id":"g","run_id":"r","generation":1,"at":"2026-12-02T14:00:00+02:00"}'
    )
    assert event.at == NOON  # type: ignore[attr-defined]


def test_the_wire_form_is_rfc3339_utc() -> None:
    from loopd_es.events.run import RunIdleCandidate

    e = RunIdleCandidate(goal_id="g", run_id="r", generation=1, at=NOON.replace(microsecond=456000))
    assert b'"at":"2026-12-02T12:00:00.456000Z"' in NewEvent(type=e.event_type, data=e).data_bytes()
    assert decode_data(e.event_type, NewEvent(type=e.event_type, data=e).data_bytes()) == e


def test_a_log_written_when_times_were_text_folds_as_before() -> None:
    """A goal stream as loopd-es wrote it before #25: ``""`` for unrecorded times, an offset, ms and us text."""
    lines = (Path(__file__).parents[1] / "fixtures" / "goal_times_v1.ndjson").read_bytes().splitlines()
    envelopes = [ENVELOPE_DECODER.decode(line) for line in lines]
    assert {e.schema_version for e in envelopes if e.type != "goal.created"} == {1}
    events = [decode_payload(e) for e in envelopes]
    assert events[2].at == datetime(2026, 11, 30, 9, 0, 2, tzinfo=UTC)  # type: ignore[attr-defined]  # +02:00
    state = fold(envelopes, initial("old"))
    assert state.anomaly_count == 0 and state.status == "blocked"
    assert stamp(state.created_at) == "2026-11-30T09:00:00.000Z"
    assert stamp(state.turn_started_at) == "2026-11-30T09:00:02.000Z"  # written at +02:00, kept in UTC
    assert state.last_progress is not None and stamp(state.last_progress.at) == "2026-11-30T09:00:03.123456Z"
    assert state.blocker is not None and state.blocker.at is None  # not recorded
    assert state.last_provider_limit is not None and state.last_provider_limit.observed_at is None
    # replay --check re-makes its decisions (the turn, its failure and backoff) with times as instants: equal
    report = replay_goal_events(envelopes)
    assert report.decisions == 3 and report.divergence is None
