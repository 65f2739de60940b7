"""Replay through a real SQLite log: one stream, a cut by position or time, snapshots, the whole log, the CLI."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopd_es.cli.main import main
from loopd_es.clock import parse_rfc3339
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.reducers import reducer_versions
from loopd_es.errors import CorruptLogError
from loopd_es.events import goal as g
from loopd_es.events import run as r
from loopd_es.events.catalogue import decode_payload, new_event
from loopd_es.events.envelope import Envelope, NewEvent, Recorded
from loopd_es.log import open_store
from loopd_es.log.base import READ_BATCH, LogStore
from loopd_es.replay import SnapshotStore, replay_all, replay_goal, replay_stream

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LogStore]:
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as s:
        yield s


async def _fill(store: LogStore, goal_id: str = "a", runs: int = 30) -> None:
    stream = f"goal-{goal_id}"
    await store.append(
        stream,
        [new_event(g.GoalCreated(goal_id=goal_id, name="A", objective="o", owner_session_id="o"))],
        "no_stream",
    )
    for n in range(1, runs + 1):
        batch = [
            r.RunStarted(
                goal_id=goal_id, run_id=f"r{n}", generation=n, prompt_message_id=f"m{n}", turn_count=n
            ),
            g.GoalUsageAccounted(goal_id=goal_id, message_ids=(f"a{n}",), token_delta=10, cost_delta=0.01),
            r.RunCompleted(goal_id=goal_id, run_id=f"r{n}", generation=n),
        ]
        await store.append(stream, [new_event(e) for e in batch], "exists")


async def test_snapshot_plus_tail_equals_full_replay(store: LogStore, tmp_path: Path) -> None:
    await _fill(store)
    full = await replay_stream(store, "goal-a")
    assert full.state.tokens_used == 300 and full.version == 91 and full.snapshot_version is None
    snaps = SnapshotStore(tmp_path / "snaps", reducer_versions(), every=40)
    first = await replay_stream(store, "goal-a", snapshots=snaps)
    assert first.state == full.state and snaps.load("goal-a") is not None
    await _fill(store, "b", 2)
    await store.append("goal-a", [new_event(g.GoalPaused(goal_id="a"))], "exists")
    again = await replay_stream(store, "goal-a", snapshots=snaps)
    assert again.snapshot_version == 91 and again.folded == 1
    assert again.state == (await replay_stream(store, "goal-a")).state
    assert again.state.status == "paused"


async def test_a_snapshot_keeps_the_state_times_aware_and_equal(store: LogStore, tmp_path: Path) -> None:
    """State times are datetimes: a snapshot (msgpack) gives them back as the same aware UTC instants."""
    at = parse_rfc3339("2026-12-02T12:00:00.123456Z")
    await store.append(
        "goal-t",
        [
            new_event(g.GoalCreated(goal_id="t", name="T", objective="o", owner_session_id="o", at=at)),
            new_event(
                r.RunStarted(
                    goal_id="t",
                    run_id="r1",
                    generation=1,
                    prompt_message_id="m1",
                    turn_count=1,
                    deadline=at + timedelta(minutes=5),
                    at=at,
                )
            ),
            new_event(g.GoalProgressReported(goal_id="t", summary="s", at=at + timedelta(seconds=1))),
            new_event(
                r.RunFailed(
                    goal_id="t",
                    run_id="r1",
                    error="e",
                    consecutive_failures=1,
                    retry_after=at + timedelta(seconds=2),
                    generation=1,
                    at=at,
                )
            ),
        ],
        "no_stream",
    )
    full = await replay_stream(store, "goal-t")
    snaps = SnapshotStore(tmp_path / "snaps", reducer_versions(), every=1)
    await replay_stream(store, "goal-t", snapshots=snaps)
    again = await replay_stream(store, "goal-t", snapshots=snaps)
    assert again.snapshot_version == 4 and again.folded == 0 and again.state == full.state
    s = again.state
    times = (
        s.created_at,
        s.turn_started_at,
        s.last_run_at,
        s.retry_after,
        s.last_progress and s.last_progress.at,
    )
    assert times == (at, at, at, at + timedelta(seconds=2), at + timedelta(seconds=1))
    assert all(t is not None and t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in times)


async def test_cut_by_position_and_time(store: LogStore, tmp_path: Path) -> None:
    await _fill(store, runs=3)
    cut = await replay_stream(store, "goal-a", until=3)
    assert cut.position == 3 and cut.state.phase == "running" and cut.state.tokens_used == 10
    envelopes = [e async for e in store.read_stream("goal-a")]
    assert fold(envelopes[:3], initial("a")) == cut.state
    at = parse_rfc3339(envelopes[1].recorded_at)
    timed = await replay_stream(store, "goal-a", at=at)
    assert timed.position <= 4 and timed.state.run_generation >= 1
    assert (await replay_stream(store, "goal-a", at=at - timedelta(days=1))).folded == 0
    snaps = SnapshotStore(tmp_path / "snaps", reducer_versions(), every=2)
    await replay_stream(store, "goal-a", snapshots=snaps)
    early = await replay_stream(store, "goal-a", until=2, snapshots=snaps)
    assert early.snapshot_version is None and early.position == 2  # a later snapshot is never used for a cut


async def test_stale_snapshots_are_discarded(tmp_path: Path) -> None:
    old = SnapshotStore(tmp_path / "snaps", {"goal": 0})
    old.save("goal-a", 1, 1, "2026-01-01T00:00:00Z", initial("a"))
    new = SnapshotStore(tmp_path / "snaps", reducer_versions())
    assert new.load("goal-a") is None
    assert new.discard_stale() == [old.key] and not old.dir.exists()


async def test_whole_log_and_goal_with_links(store: LogStore) -> None:
    await _fill(store, "a", 2)
    await _fill(store, "b", 1)
    await store.append("misc", [new_event(g.GoalCleared(goal_id="zz"))], "any")
    states = await replay_all(store)
    assert sorted(states) == ["goal-a", "goal-b", "misc"]
    assert states["misc"].summary() == "misc: 1 events, last goal.cleared"
    assert (await replay_all(store, until=1))["goal-a"].state.exists
    goal, linked = await replay_goal(store, "a")
    assert goal.state.name == "A" and goal.state.budget_turn_count == 2 and linked == []


async def test_envelope_payloads_decode_to_typed_events(store: LogStore) -> None:
    await _fill(store, runs=1)
    types = [type(decode_payload(e)).__name__ async for e in store.read_all()]
    assert types == ["GoalCreated", "RunStarted", "GoalUsageAccounted", "RunCompleted"]


def test_cli_replay_and_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    url = f"sqlite:{tmp_path / 'log.db'}"

    async def fill() -> None:
        async with await open_store(url) as s:
            await _fill(s, runs=2)

    anyio.run(fill)
    assert main("--store", url, "replay") == 0
    assert "goal a 'A': active/idle, turns 2/50" in capsys.readouterr().out
    assert main("--store", url, "replay", "--stream", "goal-a", "--json") == 0
    state = msgspec.json.decode(capsys.readouterr().out)
    assert state["tokens_used"] == 20 and state["version"] == 7
    assert main("--store", url, "replay", "--stream", "goal-a", "--until", "3") == 0
    assert "position 3" in capsys.readouterr().out
    assert main("--store", url, "replay", "--stream", "goal-nope") == 2
    assert main("--store", url, "replay", "--at", "yesterday") == 2
    assert "invalid --at" in capsys.readouterr().err
    assert main("events") == 0
    assert "goal.created (v3)" in capsys.readouterr().out
    assert main("events", "--schema") == 0
    assert '"goal.created"' in capsys.readouterr().out


async def test_the_default_stream_rows_read_finds_a_gap_too() -> None:
    """A backend without its own ``read_stream_rows`` (memory, NDJSON) gets the default over its reads, which
    counts versions across batches as the SQLite and PostgreSQL reads do: a missing event is a corrupt log."""
    import uuid

    from loopd_es.log.memory import MemoryLog

    class Lossy(MemoryLog):
        async def read_batches(self, **kwargs: Any) -> AsyncIterator[list[Envelope]]:
            async for batch in super().read_batches(**kwargs):
                yield [e for e in batch if e.version != 1]  # the first event: the rest read contiguous

    store = await Lossy.open(f"lossy-{uuid.uuid4().hex}")
    async with store:
        await _fill(store, runs=1)
        assert [b.first_version async for b in store.read_stream_rows("goal-a", from_version=3)] == [3]
        with pytest.raises(CorruptLogError, match="gap in its versions between 1 and 4"):
            await replay_stream(store, "goal-a")


def test_cli_replay_of_a_corrupt_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A read that fails during a replay (a line changed after it was written) is the corrupt-log message and
    exit code 4, for one stream and the whole log; it was "internal error: ExceptionGroup", exit 1."""
    import anyio

    path = tmp_path / "log.ndjson"

    async def fill() -> None:
        async with await open_store(f"ndjson:{path}") as s:
            await _fill(s, runs=2)

    anyio.run(fill)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"version":3', b'"version":9')
    path.write_bytes(b"".join(lines))
    for args in (("--stream", "goal-a", "--no-snapshots"), ()):
        assert main("--store", f"ndjson:{path}", "replay", *args) == 4
        err = capsys.readouterr().err
        assert "corrupt log: line 3 of" in err and "ExceptionGroup" not in err, err


async def test_a_cut_inside_a_later_batch_stops_the_read_ahead(store: LogStore) -> None:
    """Reading runs one batch ahead of folding: a cut in the third batch folds exactly up to it, and a
    whole-log replay of the same stream agrees with the stream's own."""
    await _fill(store, runs=(2 * READ_BATCH) // 3 + 10)  # three events a run: a little over two batches
    stream = await replay_stream(store, "goal-a")
    assert stream.version == 3 * ((2 * READ_BATCH) // 3 + 10) + 1
    assert (await replay_all(store))["goal-a"].state == stream.state
    until = 2 * READ_BATCH + 4
    cut = await replay_stream(store, "goal-a", until=until)
    events = [e async for e in store.read_stream("goal-a")][:until]
    assert cut.version == until and cut.state == fold(events, initial("a"))
    assert (await replay_all(store, until=until))["goal-a"].state == cut.state


async def test_a_replay_folds_the_cheap_rows_exactly_as_the_envelopes(store: LogStore) -> None:
    """SQLite hands a replay ``Recorded`` rows (no ids, no causal links); folding them gives the state the
    whole envelopes give, anomalies included (a stale run, an event of another goal, an unreadable payload)."""
    await _fill(store, runs=3)
    odd = [
        new_event(r.RunCompleted(goal_id="a", run_id="r1", generation=1)),  # stale: refused, an anomaly
        new_event(g.GoalPaused(goal_id="b")),  # another goal's event on this stream
        NewEvent(type="goal.progress", data={"goal_id": "a", "summary": 3}),  # does not decode
    ]
    await store.append("goal-a", odd, "exists")
    recorded = [e for b in [b async for b in store.read_recorded(stream="goal-a")] for e in b]
    envelopes = [e async for e in store.read_stream("goal-a")]
    assert {type(e) for e in recorded} == {Recorded} and len(recorded) == len(envelopes) == 13
    by_envelopes = fold(envelopes, initial("a"))
    assert by_envelopes.anomaly_count == 3
    assert fold(recorded, initial("a")) == by_envelopes
    assert (await replay_stream(store, "goal-a")).state == by_envelopes
    assert (await replay_all(store))["goal-a"].state == by_envelopes


async def test_a_gap_in_a_streams_versions_is_a_corrupt_log_not_a_wrong_state(tmp_path: Path) -> None:
    """A replay of one stream counts its rows' versions (they are contiguous in a sound log); a row deleted
    behind the log's back is reported as corruption, never folded as if the versions ran on."""
    path = tmp_path / "log.db"
    async with await open_store(f"sqlite:{path}") as store:
        await _fill(store, runs=3)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM events WHERE stream = 'goal-a' AND version = 5")
    async with await open_store(f"sqlite:{path}", create=False) as store:
        with pytest.raises(CorruptLogError, match="gap in its versions between 1 and 10"):
            await replay_stream(store, "goal-a")
        assert (await replay_stream(store, "goal-a", until=4)).version == 4
        with pytest.raises(CorruptLogError, match="'goal-a' has a gap in its versions"):
            await replay_all(store)  # a whole-log replay counts a goal's rows too
        assert (await replay_all(store, until=4))["goal-a"].version == 4


async def test_a_whole_log_replay_of_rows_folds_as_one_of_recorded_events(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite hands a whole-log replay the goals' events as four-column rows and their places at the end; the
    states, versions, positions and times are those of the contract's default (every event recorded), for every
    cut, with goals, a command and another stream interleaved."""
    await _fill(store, "a", 3)
    await _fill(store, "b", 2)
    await store.append("misc", [new_event(g.GoalCleared(goal_id="zz"))], "any")
    await _fill(store, "c", 1)
    await store.append("goal-a", [new_event(g.GoalPaused(goal_id="a"))], "exists")
    await store.append("goal-", [new_event(g.GoalPaused(goal_id="x"))], "any")
    head = await store.head()
    for until in (None, 0, 1, 5, 11, 20, head - 1, head):
        by_rows = await replay_all(store, until=until)
        with monkeypatch.context() as m:
            m.setattr(store, "read_log_rows", functools.partial(LogStore.read_log_rows, store))
            by_recorded = await replay_all(store, until=until)
        assert by_rows == by_recorded and list(by_rows) == sorted(by_rows), until
    assert by_rows["goal-a"].state.status == "paused" and by_rows["goal-a"].position == head - 1
