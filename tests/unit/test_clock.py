"""One notion of time (:mod:`loopd_es.clock`): conversions, comparisons by instant, and the offset bug pinned.

The offset bug: a deadline written with an offset (``12:26:04+02:00`` is ``10:26:04Z``) compared as text
against a ``Z`` time reads as still ahead at ``10:30Z``, so a retry already due waited on. It is pinned at
both ends: the comparison parses (whatever text reached the log), and the import normalizes loopd's times to
UTC on the way in, so the log holds one shape.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from loopd_es.app.goals import Goals
from loopd_es.app.service import Ctx, GoalService
from loopd_es.clock import (
    EPOCH,
    FakeClock,
    from_ms,
    from_us,
    iso,
    iso_ms,
    iso_us,
    later,
    ms_between,
    parse_cut,
    parse_or_none,
    parse_rfc3339,
    stamp,
    stamp_or_none,
    stamped_builtins,
    to_ms,
    to_us,
    utc,
    utc_text,
    whole_ms,
)
from loopd_es.domain.evolve import evolve, initial
from loopd_es.domain.rules import run_in_time
from loopd_es.events.catalogue import decode_data
from loopd_es.host import SimulatedHost
from loopd_es.host.sim_script import HostScript
from loopd_es.importer import apply_plan, build_plan
from loopd_es.log import open_store

V9 = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects" / "v9_project"
RETRY = "61111111-aaaa-4bbb-8ccc-000000000006"  # waiting_retry until 2026-11-20T10:26:04.000Z
PLUS_TWO = timezone(timedelta(hours=2))

moments = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))


def test_text_with_an_offset_is_the_same_instant_in_utc() -> None:
    assert parse_rfc3339("2026-11-20T12:26:04.000+02:00") == datetime(2026, 11, 20, 10, 26, 4, tzinfo=UTC)
    assert parse_rfc3339("2026-11-20T10:26:04Z").tzinfo is UTC
    assert parse_rfc3339("2026-11-20T10:26:04") == datetime(2026, 11, 20, 10, 26, 4, tzinfo=UTC)  # naive: UTC
    assert parse_or_none("soon") is None and parse_or_none("") is None and parse_or_none(None) is None
    with pytest.raises(ValueError):
        parse_rfc3339("soon")


def test_the_offset_bug_a_past_deadline_with_an_offset_is_past() -> None:
    now = datetime(2026, 11, 20, 10, 30, tzinfo=UTC)
    deadline = "2026-11-20T12:26:04.000+02:00"  # 10:26:04Z: four minutes ago
    assert iso(now) < deadline  # what comparing the texts said: still ahead, keep waiting
    until = parse_rfc3339(deadline)
    assert not now < until and now - timedelta(minutes=5) < until  # as instants: four minutes past
    assert later("2026-11-20T10:27:00.000Z", deadline) and not later(deadline, "2026-11-20T10:27:00.000Z")
    assert not later("garbage", deadline) and not later(deadline, None)


def test_a_run_deadline_with_an_offset_runs_out_at_its_instant() -> None:
    running = msgspec.structs.replace(
        initial("g"), run_deadline=datetime.fromisoformat("2026-11-20T12:26:04.000+02:00")
    )
    assert run_in_time(running, datetime(2026, 11, 20, 10, 26, 3, tzinfo=UTC))
    assert not run_in_time(running, datetime(2026, 11, 20, 10, 26, 5, tzinfo=UTC))


def test_utc_text_keeps_z_text_and_rewrites_offsets() -> None:
    assert utc_text("2026-11-20T10:26:04.000Z") == "2026-11-20T10:26:04.000Z"
    assert utc_text("2026-11-20T10:26:04Z") == "2026-11-20T10:26:04Z"  # loopd's text, byte for byte
    assert utc_text("2026-11-20T12:26:04.000+02:00") == "2026-11-20T10:26:04.000Z"
    assert utc_text("2026-11-20T12:26:04.123456+02:00") == "2026-11-20T10:26:04.123456Z"
    assert utc_text("2026-11-20T10:26:04") == "2026-11-20T10:26:04.000Z"
    assert utc_text("") == "" and utc_text("later") == "later"


def test_the_texts_the_reference_prints() -> None:
    moment = datetime(2026, 10, 7, 12, 0, 0, 123456, tzinfo=UTC)
    assert iso(moment) == "2026-10-07T12:00:00.123Z"
    assert iso(moment.astimezone(PLUS_TWO)) == "2026-10-07T12:00:00.123Z"
    assert iso_us(moment) == "2026-10-07T12:00:00.123456Z"
    assert iso_ms(1_800_000_000_000) == "2027-01-15T08:00:00.000Z"  # JavaScript's new Date(ms).toISOString()
    assert whole_ms(moment) == moment.replace(microsecond=123000)


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(datetime(2026, 1, 1, 2, tzinfo=PLUS_TWO))
    assert clock.now() == datetime(2026, 1, 1, tzinfo=UTC) and clock.now().tzinfo is UTC
    assert clock.advance(1.5) - clock.advance_ms(500) == timedelta(milliseconds=-500)
    clock.set(EPOCH)
    assert clock.now() == EPOCH and to_ms(clock.now()) == 0


@given(moments)
@example(datetime(2027, 1, 15, 8, 0, 0, 999999, tzinfo=UTC))
def test_conversions_round_trip(moment: datetime) -> None:
    assert from_us(to_us(moment)) == moment
    assert from_ms(to_ms(moment)) == whole_ms(moment)
    assert parse_rfc3339(iso_us(moment)) == moment
    assert parse_rfc3339(iso(moment)) == whole_ms(moment)
    assert parse_rfc3339(utc_text(moment.astimezone(PLUS_TWO).isoformat())) == moment
    assert ms_between(moment, EPOCH) == pytest.approx(to_us(moment) / 1000)


@given(moments, moments)
def test_order_is_the_instants_order_whatever_the_offset(a: datetime, b: datetime) -> None:
    shown_a, shown_b = a.astimezone(PLUS_TWO).isoformat(), iso(b)
    assert later(shown_a, shown_b) == (a > whole_ms(b))
    assert utc(a.astimezone(PLUS_TWO)) == a


def _offset_project(tmp_path: Path) -> Path:
    """The v9 fixture with the retry deadline written at +02:00 (the same instant, 10:26:04Z)."""
    project = tmp_path / "p"
    shutil.copytree(V9, project)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    runtime = next(rt for rt in doc["runtimes"] if rt["goalID"] == RETRY)
    assert runtime["retryAfter"] == "2026-11-20T10:26:04.000Z"
    runtime["retryAfter"] = "2026-11-20T12:26:04.000+02:00"
    state_file.write_text(json.dumps(doc))
    return project


def test_the_import_normalizes_an_offset_to_utc(tmp_path: Path) -> None:
    plan = build_plan(_offset_project(tmp_path))
    batch = next(b for b in plan.batches if b.stream == f"goal-{RETRY}")
    state = initial(RETRY)
    for event in batch.events:
        state = evolve(state, decode_data(event.type, event.data_bytes()))
    assert state.phase == "waiting_retry"
    assert state.retry_after == parse_rfc3339("2026-11-20T10:26:04.000Z")
    assert "+02:00" not in b"".join(e.data_bytes() for b in plan.batches for e in b.events).decode()


@pytest.mark.anyio
async def test_an_imported_retry_past_its_deadline_is_due_not_waiting(tmp_path: Path) -> None:
    plan = build_plan(_offset_project(tmp_path))
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        await apply_plan(store, plan)
        clock = FakeClock(datetime(2026, 11, 20, 10, 20, tzinfo=UTC))
        goals = Goals(GoalService(store, SimulatedHost(HostScript()), clock=clock))
        before = await goals.idle(RETRY, Ctx.new())
        assert (before.result, before.detail) == ("waiting", "2026-11-20T10:26:04.000Z")
        clock.set(datetime(2026, 11, 20, 10, 30, tzinfo=UTC))
        after = await goals.idle(RETRY, Ctx.new())
        assert after.result != "waiting"


def test_tables_show_the_instant_in_utc() -> None:
    from loopd_es.cli.query_cmds import _time

    assert (
        _time("2026-11-20T12:26:04.000+02:00") == _time("2026-11-20T10:26:04.000Z") == "2026-11-20 10:26:04"
    )
    assert _time(None) == "-" and _time("later") == "later"


def test_stamp_writes_state_text_at_the_precision_the_time_has() -> None:
    """State and read models keep text: a whole millisecond reads as the reference wrote it, finer as the log."""
    moment = datetime(2026, 10, 7, 12, 0, 0, 123000, tzinfo=UTC)
    assert stamp(moment) == "2026-10-07T12:00:00.123Z"
    assert stamp(moment.replace(microsecond=123456)) == "2026-10-07T12:00:00.123456Z"
    assert stamp(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-10-07T12:00:00.123Z"
    assert (stamp(None), stamp_or_none(None), stamp_or_none(moment)) == ("", None, "2026-10-07T12:00:00.123Z")


def test_stamped_builtins_writes_nested_times_as_state_text_in_json_shapes() -> None:
    """Outputs of a state (``replay --json``, ``cmd show``, tool answers) show times as :func:`stamp` does,
    however deep, and sequences as lists."""
    from loopd_es.domain.command_state import AwaitState

    at = datetime(2026, 11, 26, 11, 2, 10, tzinfo=UTC)
    waiting = AwaitState(goal_id="g", requested_at=at)
    out = stamped_builtins({"awaits": (waiting,), "ended": at.replace(microsecond=5), "none": None})
    assert out == {
        "awaits": [{**msgspec.to_builtins(waiting), "requested_at": "2026-11-26T11:02:10.000Z"}],
        "ended": "2026-11-26T11:02:10.000005Z",
        "none": None,
    }


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("2026-12-07T20:59:14.343Z", "2026-12-07T20:59:14.343999+00:00"),  # as `history` prints it
        ("2026-12-07T20:59:14.343123Z", "2026-12-07T20:59:14.343123+00:00"),  # to the µs: that instant
        ("2026-12-07T20:59:14Z", "2026-12-07T20:59:14.999999+00:00"),
        ("2026-12-07T20:59Z", "2026-12-07T20:59:59.999999+00:00"),
        ("2026-12-07", "2026-12-07T23:59:59.999999+00:00"),
        ("2026-12-07T21:59:14.3+01:00", "2026-12-07T20:59:14.399999+00:00"),
        ("20261207T205914Z", "2026-12-07T20:59:14.999999+00:00"),
    ],
)
def test_a_cut_time_covers_the_unit_it_is_written_to(text: str, end: str) -> None:
    """``--at`` with a time copied from ``history`` (milliseconds) left out the event shown there: events keep
    microseconds. A cut takes the whole unit its time is written to."""
    assert parse_cut(text).isoformat() == end


def test_history_at_a_printed_time_takes_its_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from loopd_es.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main("goal", "create", "g", "--objective", "o", "--read-only") == 0
    goal = capsys.readouterr().out.split()[0]
    assert main("history", goal) == 0
    created = next(line for line in capsys.readouterr().out.splitlines() if "goal.created" in line)
    day, clock = created.split()[1:3]  # "#1  2026-12-07 20:59:14.343  goal v1 goal.created"
    assert main("history", goal, "--at", f"{day}T{clock}Z") == 0
    out = capsys.readouterr().out
    assert "goal.created" in out and "0 events" not in out
