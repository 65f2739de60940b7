"""The mirror's pass, in-process on a real SQLite log: torn tails, rotation, the settle rule, idempotency."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.clock import WALL, Clock, FakeClock, from_us
from loopd_es.events.catalogue import new_event
from loopd_es.events.envelope import NO_STREAM
from loopd_es.events.goal import GoalProgressReported
from loopd_es.events.imported import stamped
from loopd_es.importer.mirror import MirrorCache, MirrorPass, mirror_pass
from loopd_es.importer.plan import apply_plan, build_plan
from loopd_es.importer.segments import _listing, read_ledger_bytes
from loopd_es.log import open_store
from loopd_es.testing.loopd_project import Project, _rotate

pytestmark = pytest.mark.anyio


def _project(tmp_path: Path) -> Project:
    project = Project(tmp_path / "p", torn_at=0, rotate_at=0, pace=0)
    project.echo = False
    project.write_state()
    return project


async def _pass(tmp_path: Path, project: Project, settle: float = 0.0, clock: Clock = WALL) -> MirrorPass:
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        return await mirror_pass(store, project.base.parents[1], settle=settle, clock=clock)


def _at(mtime_ns: int) -> FakeClock:
    """A clock standing at a file time (``st_mtime_ns``)."""
    return FakeClock(from_us(mtime_ns // 1000))


def _modified(project: Project) -> datetime:
    """When ``state.json`` was last written, as the mirror's settle window reads it."""
    return from_us(os.stat(project.base / "state.json").st_mtime_ns // 1000)


async def _sources(tmp_path: Path) -> list[str]:
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        out = []
        for stream in await store.streams():
            async for env in store.read_stream(stream):
                prov = stamped(env.data)[1]
                out.append(prov.source if prov else "")
        return out


def test_rotated_segments_read_as_one_ledger_oldest_first(tmp_path: Path) -> None:
    ledger = tmp_path / "events.ndjson"
    (tmp_path / "events.ndjson.2").write_bytes(b"a\n")
    (tmp_path / "events.ndjson.1").write_bytes(b"b")  # cut mid-line before it was rotated
    ledger.write_bytes(b"c\n")
    (tmp_path / "events.ndjson.bak").write_bytes(b"not a segment\n")
    assert read_ledger_bytes(ledger) == b"a\nb\nc\n"
    ledger.unlink()  # renamed away, not yet recreated: the newest segment is the tail
    assert read_ledger_bytes(ledger) == b"a\nb"
    (tmp_path / "events.ndjson.1").unlink()
    assert _listing(ledger) is None  # .2 without .1: a rotation half done, read again


async def test_a_torn_tail_is_mirrored_once_when_it_is_whole(tmp_path: Path) -> None:
    project = _project(tmp_path)
    project.step(0, "create")
    project.step(0, "run")
    first = await _pass(tmp_path, project)
    assert first.imported and first.ledger_lines == (1, 2)
    line = json.dumps({"version": 1, "eventID": "e3", "goalID": "70000000-0000-4000-8000-000000000000"})
    whole = line[:-1] + ', "type": "goal.progress", "timestamp": "2026-12-03T10:00:00.000Z"'
    whole += ', "summary": "s", "next": "n"}\n'
    with (project.base / "events.ndjson").open("a") as f:
        f.write(whole[:30])
    torn = await _pass(tmp_path, project)
    assert torn.torn_line == 3 and torn.ledger_lines == ()
    with (project.base / "events.ndjson").open("a") as f:
        f.write(whole[30:])
    mended = await _pass(tmp_path, project)
    assert mended.ledger_lines == (3,) and mended.torn_line is None
    assert (await _pass(tmp_path, project)).appended == 0
    assert sorted(s for s in await _sources(tmp_path) if s.startswith("ledger:")) == [
        "ledger:1",
        "ledger:2",
        "ledger:3",
    ]


async def test_line_numbers_run_on_across_a_rotation(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for action in ("create", "run", "progress"):
        project.step(0, action)
    await _pass(tmp_path, project)
    _rotate(project.base / "events.ndjson")
    project.step(0, "done")
    _rotate(project.base / "events.ndjson")
    project.step(1, "create")
    done = await _pass(tmp_path, project)
    assert done.ledger_lines == (4, 5) and done.ledger_count == 5
    ledger = [s for s in await _sources(tmp_path) if s.startswith("ledger:")]
    assert sorted(ledger) == [f"ledger:{n}" for n in range(1, 6)]


async def test_snapshot_corrections_wait_until_state_json_settles(tmp_path: Path) -> None:
    project = _project(tmp_path)
    await _pass(tmp_path, project)
    project.step(0, "create")
    project.step(0, "run")
    project.step(0, "done")  # tokensUsed reaches 100 only in state.json: a correction
    mtime = _modified(project)
    early = await _pass(tmp_path, project, settle=10, clock=FakeClock(mtime + timedelta(seconds=1)))
    assert early.ledger_lines == (1, 2, 3)
    assert early.settle_in == pytest.approx(9)
    assert not any(
        s.startswith("state:") for s in await _sources(tmp_path) if s != "state:goal.workerSessionID"
    )
    settled = await _pass(tmp_path, project, settle=10, clock=FakeClock(mtime + timedelta(seconds=11)))
    assert settled.settle_in is None and settled.ledger_lines == () and settled.appended > 0
    assert "state:runtime" in await _sources(tmp_path)
    assert (
        await _pass(tmp_path, project, settle=10, clock=FakeClock(mtime + timedelta(seconds=12)))
    ).appended == 0


async def test_a_goal_known_only_from_state_json_waits_for_its_created_line(tmp_path: Path) -> None:
    project = _project(tmp_path)
    await _pass(tmp_path, project)
    project.step(0, "create")
    (project.base / "events.ndjson").unlink()  # the state write landed; its ledger line has not yet
    mtime = _modified(project)
    waiting = await _pass(tmp_path, project, settle=10, clock=FakeClock(mtime))
    assert waiting.appended == 0
    assert (
        await _pass(tmp_path, project, settle=10, clock=FakeClock(mtime + timedelta(seconds=10)))
    ).streams == ("goal-70000000-0000-4000-8000-000000000000",)


async def test_a_cached_mirror_rereads_streams_something_else_appended_to(tmp_path: Path) -> None:
    project = _project(tmp_path)
    project.step(0, "create")
    cache = MirrorCache()
    gid = "70000000-0000-4000-8000-000000000000"
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        directory = project.base.parents[1]
        await mirror_pass(store, directory, cache=cache)  # the one-shot import
        project.step(0, "run")
        assert (await mirror_pass(store, directory, cache=cache)).ledger_lines == (2,)
        # something else (an engine, a reconcile) continues the goal's stream
        await store.append(f"goal-{gid}", [new_event(GoalProgressReported(goal_id=gid, summary="x"))])
        project.step(0, "progress")
        done = await mirror_pass(store, directory, cache=cache)
        assert done.ledger_lines == (3,)
        assert await store.stream_version(f"goal-{gid}") == len(cache.held[f"goal-{gid}"].ids)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["mirror-loopd", "{missing}"], 2, "no such directory; nothing was imported"),
        (["mirror-loopd", "{missing}", "--follow"], 2, "no such directory; nothing was imported"),
        (["mirror-loopd", "{empty}", "--follow"], 2, "the file does not exist (is this an opencode-loopd"),
        (["mirror-loopd", "{empty}", "--settle", "-1"], 2, "--settle must be 0 or more seconds, got -1.0"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    (tmp_path / "empty").mkdir()
    where = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    argv = [a.format(**where) for a in args]
    assert main("--store", f"sqlite:{tmp_path / 'log.db'}", *argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_catch_up_pass_says_what_it_mirrored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path)
    project.step(0, "create")
    store = ("--store", f"sqlite:{tmp_path / 'log.db'}")
    directory = str(project.base.parents[1])
    assert main(*store, "mirror-loopd", directory) == 0
    assert "imported" in capsys.readouterr().out
    project.step(0, "run")
    project.step(0, "progress")
    assert main(*store, "mirror-loopd", directory) == 0
    assert "(ledger lines 2-3)" in capsys.readouterr().out
    assert main(*store, "mirror-loopd", directory) == 0
    assert "is up to date in the log" in capsys.readouterr().out


def test_a_ledger_truncated_in_place_is_refused_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Truncated (copytruncate, ``: > events.ndjson``), the ledger's new lines reuse numbers already mirrored:
    a pass took them for mirrored and skipped them for good, exit 0. It now refuses and writes nothing."""
    project = _project(tmp_path)
    project.step(0, "create")
    project.step(0, "run")
    project.step(0, "progress")
    store = ("--store", f"sqlite:{tmp_path / 'log.db'}")
    directory = str(project.base.parents[1])
    assert main(*store, "mirror-loopd", directory) == 0
    ledger = project.base / "events.ndjson"
    last = ledger.read_bytes().splitlines()[-1]
    ledger.write_bytes(last + b"\n")  # one line left where three were mirrored
    capsys.readouterr()
    assert main(*store, "read", "--json") == 0
    before = capsys.readouterr().out
    assert main(*store, "mirror-loopd", directory) == 2
    err = capsys.readouterr().err
    assert "the ledger has 1 line(s), but line 3 was mirrored already" in err and err.count("\n") == 1
    assert main(*store, "read", "--json") == 0
    assert capsys.readouterr().out == before


async def test_a_first_pass_killed_part_way_is_finished_by_the_next(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for goal, action in ((0, "create"), (1, "create"), (0, "run"), (1, "run")):
        project.step(goal, action)
    directory = project.base.parents[1]
    plan = build_plan(directory)
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        # what a kill -9 during the one-shot import leaves: import.started and the first stream only
        await store.append(plan.stream, [plan.started], NO_STREAM)
        await store.append(plan.batches[0].stream, list(plan.batches[0].events), NO_STREAM)
        project.step(0, "progress")
        done = await mirror_pass(store, directory)
        assert not done.imported
        assert set(done.streams) == {plan.batches[0].stream, plan.batches[1].stream}
        assert done.ledger_lines == (2, 4, 5)  # goal 1's lines, and the new one of goal 0
    once = tmp_path / "once"
    once.mkdir()
    async with await open_store(f"sqlite:{once / 'log.db'}") as store:
        await apply_plan(store, build_plan(directory))
    mirrored = [s for s in await _sources(tmp_path) if s.startswith("ledger:")]
    assert sorted(mirrored) == sorted(s for s in await _sources(once) if s.startswith("ledger:"))


async def test_a_quiet_state_json_does_not_settle_a_torn_tail(tmp_path: Path) -> None:
    project = _project(tmp_path)
    await _pass(tmp_path, project)
    line = project.prepare(0, "create")  # state.json shows the goal; its line is half written
    data = (json.dumps(line) + "\n").encode()
    with (project.base / "events.ndjson").open("ab") as f:
        f.write(data[:20])
    newest = max(os.stat(project.base / n).st_mtime_ns for n in ("state.json", "events.ndjson"))
    waiting = await _pass(
        tmp_path, project, settle=1, clock=_at(newest + 5_000_000_000)
    )  # state.json quiet 5 s
    assert waiting.torn_line == 1 and waiting.appended == 0 and waiting.settle_in == pytest.approx(15)
    with (project.base / "events.ndjson").open("ab") as f:
        f.write(data[20:])
    whole = await _pass(tmp_path, project, settle=1, clock=_at(newest + 5_000_000_000))
    assert whole.ledger_lines == (1,)
    # the goal's stream starts from its line, not from state.json ahead of it (the line then skipped)
    assert [s for s in await _sources(tmp_path) if s][0] == "ledger:1"


async def test_a_torn_tail_left_for_long_lets_the_snapshot_settle(tmp_path: Path) -> None:
    project = _project(tmp_path)
    await _pass(tmp_path, project)
    line = project.prepare(0, "create")
    with (project.base / "events.ndjson").open("ab") as f:
        f.write(json.dumps(line).encode()[:20])  # the writer died mid-line
    newest = max(os.stat(project.base / n).st_mtime_ns for n in ("state.json", "events.ndjson"))
    done = await _pass(tmp_path, project, settle=1, clock=_at(newest + 20_000_000_000))
    assert done.settle_in is None and done.streams == ("goal-70000000-0000-4000-8000-000000000000",)


async def test_a_first_pass_on_a_busy_project_mirrors_the_ledger_at_once(tmp_path: Path) -> None:
    project = _project(tmp_path)
    for action in ("create", "run", "done"):  # tokensUsed reaches 100 only in state.json: a correction
        project.step(0, action)
    mtime = os.stat(project.base / "state.json").st_mtime_ns
    busy = await _pass(tmp_path, project, settle=10, clock=_at(mtime))
    assert not busy.imported and busy.ledger_lines == (1, 2, 3) and busy.settle_in == pytest.approx(10)
    sources = await _sources(tmp_path)
    assert "state:runtime" not in sources
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        assert await store.stream_version(busy.stream) == 1  # import.started: later passes continue
    settled = await _pass(tmp_path, project, settle=10, clock=_at(mtime + 10_000_000_000))
    assert settled.ledger_lines == () and "state:runtime" in await _sources(tmp_path)
    once = tmp_path / "once"
    once.mkdir()
    async with await open_store(f"sqlite:{once / 'log.db'}") as store:
        await apply_plan(store, build_plan(project.base.parents[1]))
    assert await _sources(once) == [*await _sources(tmp_path), ""]  # the import's own import.completed
