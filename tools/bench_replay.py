"""Replay speed: decode+fold of 1M events, a 10k-event goal from scratch and from its snapshot, and the
``eventsourcing`` library rebuilding an aggregate from the same 10k events, measured in the same run; then a
fleet: ``--fleet-goals`` goals of ``--fleet-events`` events each in one SQLite log, every goal rebuilt by
``replay_all`` (one pass over the log) against ``eventsourcing`` rebuilding every aggregate from its SQLite store,
``--fleet-rounds`` times in alternating order (the ratio is the median of the per-round ratios).

Usage: ``python tools/bench_replay.py [--events 1000000] [--goal-events 10000] [--fleet-goals 10000]
[--fleet-events 100]`` (``--fleet-goals 0`` skips the fleet; needs ``pip install eventsourcing`` for the
comparisons; it is not a loopd-es dependency). Prints one JSON object.

The 1M-event figure folds the way ``loopd-es replay`` does (:class:`~loopd_es.domain.reducers.LogFold`, fed
4096 envelopes at a time) minus SQLite. The 10k-event goal is also split into its two halves, measured
separately: reading the stream's rows from SQLite into envelopes (``read_ms``, the floor no fold can go below)
and decoding the payloads and folding them (``decode_fold_ms``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopd_es.clock import parse_rfc3339
from loopd_es.domain.reducers import LogFold, StreamFold, reducer_versions, start
from loopd_es.events import goal as g
from loopd_es.events import run as r
from loopd_es.events.catalogue import new_event
from loopd_es.events.envelope import ENVELOPE_DECODER, ENVELOPE_ENCODER, Envelope
from loopd_es.log import open_store
from loopd_es.log.base import READ_BATCH
from loopd_es.replay import SnapshotStore, replay_all, replay_stream

if TYPE_CHECKING:
    from loopd_es.events.base import Event


def goal_traffic(goal_id: str, count: int) -> list[Event]:
    """A realistic goal: created, then turns of start / progress / usage / completion, the odd failure."""
    events: list[Event] = [
        g.GoalCreated(
            goal_id=goal_id,
            name=f"goal {goal_id}",
            objective="make the tests pass",
            owner_session_id="ses_owner",
            config=g.GoalConfig(model="openai/gpt-5", checks=("make test",)),
        )
    ]
    n = 0
    while len(events) < count:
        n += 1
        events.append(
            r.RunStarted(
                goal_id=goal_id,
                run_id=f"run-{n}",
                generation=n,
                prompt_message_id=f"msg_{n:08d}",
                turn_count=n,
                deadline=parse_rfc3339("2026-12-02T12:05:00.000Z"),
                at=parse_rfc3339("2026-12-02T12:00:00.000Z"),
            )
        )
        events.append(
            g.GoalProgressReported(
                goal_id=goal_id,
                summary=f"step {n} done: refactored the parser",
                next="wire the CLI",
                at=parse_rfc3339("2026-12-02T12:01:00.000Z"),
            )
        )
        events.append(
            g.GoalUsageAccounted(
                goal_id=goal_id,
                message_ids=(f"asst-{n}",),
                token_delta=1234,
                cost_delta=0.0123,
                time_delta_seconds=12.5,
            )
        )
        if n % 10 == 0:
            events.append(
                r.RunFailed(
                    goal_id=goal_id,
                    run_id=f"run-{n}",
                    error="overloaded",
                    consecutive_failures=1,
                    retry_after=parse_rfc3339("2026-12-02T12:00:02.000Z"),
                )
            )
        else:
            events.append(r.RunCompleted(goal_id=goal_id, run_id=f"run-{n}", generation=n))
    return events[:count]


def encoded_log(total: int, goals: int) -> list[bytes]:
    """NDJSON envelope lines for ``total`` events spread over ``goals`` interleaved goal streams."""
    per = total // goals
    streams = [goal_traffic(f"g{k}", per) for k in range(goals)]
    lines = []
    position = 0
    for version in range(per):
        for k in range(goals):
            position += 1
            e = streams[k][version]
            env = Envelope(
                position=position,
                stream=f"goal-g{k}",
                version=version + 1,
                event_id=f"00000000-0000-4000-8000-{position:012d}",
                type=e.event_type,
                schema_version=e.schema_version,
                recorded_at="2026-12-02T12:00:00.000000Z",
                causation_id=None,
                correlation_id=None,
                data=_raw(e),
            )
            lines.append(ENVELOPE_ENCODER.encode(env))
    return lines


def _raw(e: Event) -> Any:
    import msgspec

    return msgspec.Raw(msgspec.json.encode(e))


def bench_decode_fold(lines: list[bytes]) -> dict[str, Any]:
    """Envelope decode + payload decode + fold of every line, a log-read batch at a time."""
    decode = ENVELOPE_DECODER.decode
    t0 = time.perf_counter()
    folding = LogFold()
    for i in range(0, len(lines), READ_BATCH):
        folding.feed([decode(line) for line in lines[i : i + READ_BATCH]])
    states = folding.result()
    dt = time.perf_counter() - t0
    t0 = time.perf_counter()
    for line in lines:
        decode(line)
    envelopes_s = time.perf_counter() - t0
    anomalies = sum(f.state.anomaly_count for f in states.values())
    return {
        "events": len(lines),
        "seconds": round(dt, 3),
        "events_per_s": round(len(lines) / dt),
        "us_per_event": round(dt / len(lines) * 1e6, 3),
        "of_which_envelope_decode_us": round(envelopes_s / len(lines) * 1e6, 3),
        "aggregates": len(states),
        "anomalies": anomalies,
    }


async def bench_goal(path: Path, count: int, repeats: int) -> dict[str, Any]:
    events = goal_traffic("big", count)
    async with await open_store(f"sqlite:{path}") as store:
        for i in range(0, count, 1000):
            await store.append("goal-big", [new_event(e) for e in events[i : i + 1000]], "any")
        scratch, reads, folds = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            folded = await replay_stream(store, "goal-big")
            scratch.append(time.perf_counter() - t0)
        for _ in range(repeats):  # the two halves of a scratch replay, each on its own
            t0 = time.perf_counter()
            batches = [batch async for batch in store.read_batches(stream="goal-big")]
            reads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            folding = StreamFold(start("goal-big"))
            for batch in batches:
                folding.feed(batch)
            alone = folding.result()
            folds.append(time.perf_counter() - t0)
        assert alone.state == folded.state
        snaps = SnapshotStore.beside(path, reducer_versions(), every=1)
        await replay_stream(store, "goal-big", snapshots=snaps)
        snapped = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            from_snap = await replay_stream(store, "goal-big", snapshots=snaps)
            snapped.append(time.perf_counter() - t0)
        assert from_snap.state == folded.state and from_snap.snapshot_version == count
    return {
        "events": count,
        "from_scratch_ms": _ms(scratch),
        "read_ms": _ms(reads),
        "decode_fold_ms": _ms(folds),
        "from_snapshot_ms": _ms(snapped, 3),
        "tokens": folded.state.tokens_used,
    }


def _ms(seconds: list[float], digits: int = 2) -> float:
    return round(statistics.median(seconds) * 1000, digits)


def eventsourcing_rebuild(path: Path, count: int) -> Callable[[], float] | None:
    """A goal of ``count`` events saved by ``eventsourcing`` to SQLite at ``path``, and a function that
    rebuilds it from the store and returns the seconds it took (None without the library)."""
    try:
        from eventsourcing.application import Application
    except ImportError:
        return None
    Goal = _es_goal_class()

    os.environ.update({"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)})

    class Goals(Application[Any]):
        pass

    app = Goals()
    goal = Goal(name="big")
    for n in range(1, count):
        goal.turn(run_id=f"run-{n}", tokens=1234, summary=f"step {n} done: refactored the parser")
        if n % 1000 == 0:
            app.save(goal)
    app.save(goal)

    def rebuild() -> float:
        t0 = time.perf_counter()
        got: Any = app.repository.get(goal.id)
        seconds = time.perf_counter() - t0
        assert got.turns == count - 1
        return seconds

    return rebuild


async def interleaved(path: Path, rebuild: Callable[[], float], rounds: int) -> dict[str, Any]:
    """``replay_stream`` of the 10k goal and the peer's rebuild, in alternating order, round after round:
    the median of the per-round ratios (a neighbour's load hits both alike)."""
    mine, peer = [], []
    async with await open_store(f"sqlite:{path}", create=False) as store:
        for r in range(rounds):
            for which in ("mine", "peer") if r % 2 == 0 else ("peer", "mine"):
                if which == "peer":
                    peer.append(rebuild())
                    continue
                t0 = time.perf_counter()
                await replay_stream(store, "goal-big")
                mine.append(time.perf_counter() - t0)
    return {
        "rounds": rounds,
        "loopd_es_ms": _ms(mine),
        "eventsourcing_ms": _ms(peer),
        "ratio": round(statistics.median(p / m for m, p in zip(mine, peer, strict=True)), 2),
        "target": ">= 10x",
    }


async def build_fleet(path: Path, goals: int, per_goal: int) -> None:
    """A ``goals * per_goal``-event SQLite log, each goal appended whole."""
    async with await open_store(f"sqlite:{path}") as store:
        for k in range(goals):
            await store.append(
                f"goal-f{k}", [new_event(e) for e in goal_traffic(f"f{k}", per_goal)], "no_stream"
            )


async def time_fleets(
    path: Path, goals: int, rounds: int, peer: Callable[[], float] | None
) -> tuple[list[float], list[float]]:
    """Seconds to rebuild every goal of the fleet log in one pass (``replay_all``), ``rounds`` times on one
    open store (as the peer keeps its own open), alternating with ``peer`` (its seconds) when there is one."""
    mine: list[float] = []
    theirs: list[float] = []
    async with await open_store(f"sqlite:{path}", create=False) as store:
        for k in range(rounds):
            if peer is not None and k % 2:
                theirs.append(peer())
            t0 = time.perf_counter()
            states = await replay_all(store)
            mine.append(time.perf_counter() - t0)
            assert len(states) == goals and all(
                f.state.exists and not f.state.anomaly_count for f in states.values()
            )
            if peer is not None and not k % 2:
                theirs.append(peer())
    return mine, theirs


@functools.cache
def _es_goal_class() -> Any:
    """The ``eventsourcing`` goal aggregate (defined once: the library registers each class by its topic)."""
    from eventsourcing.domain import Aggregate, event

    class Goal(Aggregate):
        @event("Created")
        def __init__(self, name: str) -> None:
            self.name = name
            self.tokens = 0
            self.turns = 0

        @event("Turn")
        def turn(self, run_id: str, tokens: int, summary: str) -> None:
            self.turns += 1
            self.tokens += tokens

    return Goal


def eventsourcing_fleet(path: Path, goals: int, per_goal: int) -> Callable[[], float] | None:
    """The same fleet in ``eventsourcing`` (one aggregate per goal, saved whole); returns a function that
    rebuilds every aggregate and gives the seconds it took (None without the library)."""
    try:
        from eventsourcing.application import Application
    except ImportError:
        return None
    os.environ.update({"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)})
    goal_cls = _es_goal_class()

    class Fleet(Application[Any]):
        pass

    app = Fleet()
    ids = []
    for k in range(goals):
        goal = goal_cls(name=f"f{k}")
        for n in range(1, per_goal):
            goal.turn(run_id=f"run-{n}", tokens=1234, summary=f"step {n} done: refactored the parser")
        app.save(goal)
        ids.append(goal.id)

    def rebuild() -> float:
        t0 = time.perf_counter()
        turns = sum(app.repository.get(i).turns for i in ids)
        seconds = time.perf_counter() - t0
        assert turns == goals * (per_goal - 1)
        return seconds

    return rebuild


def fleets(directory: Path, goals: int, per_goal: int, rounds: int) -> dict[str, Any]:
    """Both fleets rebuilt ``rounds`` times, back to back in alternating order: the medians, and the median
    of the per-round ratios (a single timing each side moved the ratio by a fifth from run to run)."""
    path = directory / "fleet.db"
    anyio.run(build_fleet, path, goals, per_goal)
    peer = eventsourcing_fleet(directory / "es-fleet.db", goals, per_goal)
    mine, theirs = anyio.run(time_fleets, path, goals, rounds, peer)
    events = goals * per_goal
    out: dict[str, Any] = {
        "fleet": {
            "goals": goals,
            "events": events,
            "rounds": rounds,
            "rebuild_s": round(statistics.median(mine), 3),
            "events_per_s": round(events / statistics.median(mine)),
        },  # fmt: skip
        "eventsourcing_fleet": None,
    }
    if theirs:
        out["eventsourcing_fleet"] = {
            "goals": goals,
            "events": events,
            "rebuild_s": round(statistics.median(theirs), 3),
        }
        ratios = [p / m for p, m in zip(theirs, mine, strict=True)]
        out["fleet_ratios_per_round"] = [round(x, 2) for x in ratios]
        out["ratio_eventsourcing_over_fleet"] = round(statistics.median(ratios), 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--goals", type=int, default=2000)
    parser.add_argument("--goal-events", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fleet-goals", type=int, default=10_000)
    parser.add_argument("--fleet-events", type=int, default=100)
    parser.add_argument("--fleet-rounds", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, Any] = {}
    lines = encoded_log(args.events, args.goals)
    result["decode_fold"] = bench_decode_fold(lines)
    del lines
    with tempfile.TemporaryDirectory() as tmp:
        result["goal_10k"] = anyio.run(bench_goal, Path(tmp) / "log.db", args.goal_events, args.repeats)
        rebuild = eventsourcing_rebuild(Path(tmp) / "es.db", args.goal_events)
        es = None
        if rebuild is not None:
            es = {"events": args.goal_events, "rebuild_ms": _ms([rebuild() for _ in range(args.repeats)])}
            result["interleaved"] = anyio.run(
                interleaved, Path(tmp) / "log.db", rebuild, args.repeats * 2 + 1
            )
    result["eventsourcing"] = es
    if es:
        goal = result["goal_10k"]
        result["ratio_eventsourcing_over_scratch"] = round(es["rebuild_ms"] / goal["from_scratch_ms"], 2)
        # what the ratio would be if decoding and folding cost nothing: the SQLite read alone
        result["ratio_eventsourcing_over_read_only"] = round(es["rebuild_ms"] / goal["read_ms"], 2)
        result["ratio_eventsourcing_over_snapshot"] = round(es["rebuild_ms"] / goal["from_snapshot_ms"], 1)
    if args.fleet_goals:
        with tempfile.TemporaryDirectory() as tmp:
            result |= fleets(Path(tmp), args.fleet_goals, args.fleet_events, args.fleet_rounds)
    result["targets"] = {
        "decode_fold_events_per_s": 400_000,
        "scratch_vs_eventsourcing": 10,
        "fleet_vs_eventsourcing": 10,
        "snapshot_ms": 2,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
