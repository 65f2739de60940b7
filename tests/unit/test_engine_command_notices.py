"""The engine tells a command's owner session of its exit and its watch pushes, exactly once
(docs/reference/loopd.md#s3-17)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.outbox import STREAM
from loopd_es.events import command as cmd
from loopd_es.events.catalogue import new_event
from loopd_es.host.errors import HostUnavailableError
from loopd_es.procs.paths import CommandPaths

from ._engine_harness import Rig, rig

if TYPE_CHECKING:
    from loopd_es.events.base import Event

pytestmark = pytest.mark.anyio
OWNER = "ses_owner"


def started(cid: str, owner: str | None = OWNER, **kw: Any) -> cmd.CommandStarted:
    return cmd.CommandStarted(
        command_id=cid,
        title="dev",
        command="python3",
        args=["app.py"],
        cwd="/",
        started_at=parse_rfc3339("2026-12-02T00:00:00.000000Z"),
        owner_session_id=owner,
        **kw,
    )


def exited(cid: str, **kw: Any) -> cmd.CommandExited:
    fields: dict[str, Any] = {"status": "exited", "end_reason": "exit", "exit_code": 0}
    return cmd.CommandExited(
        command_id=cid, ended_at=parse_rfc3339("2026-12-02T00:00:01.000000Z"), **{**fields, **kw}
    )


async def record(r: Rig, cid: str, *events: Event, correlation_id: str | None = None) -> None:
    await r.store.append(
        f"command-{cid}", [new_event(e, correlation_id=correlation_id) for e in events], "any"
    )


async def shown(r: Rig) -> list[tuple[str, str]]:
    return [(n.session_id, n.text) for n in await r.host.notifications()]


async def test_an_exit_tells_the_owner_once_also_after_a_restart(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        paths = CommandPaths(f"sqlite:{tmp_path / 'events.db'}")
        paths.ensure()
        paths.log("c1").write_bytes(b"\x1b[31mstarting\x1b[0m\r\nbye\r\n")  # the owner process's output log
        await record(r, "c1", started("c1"), exited("c1", exit_code=3))
        await r.engine.catch_up()
        assert await shown(r) == [
            (OWNER, '[command "dev" (python3 app.py) exited c1... exitCode=3 signal=none]\nstarting\nbye\n')
        ]
        again = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await again.start()
        await again.catch_up()
        assert len(await shown(r)) == 1
        types = [e.type async for e in r.store.read_stream(STREAM)]
        assert types == ["notification.requested", "notification.delivered"]
        request = [e.data_dict() async for e in r.store.read_stream(STREAM)][0]
        assert (request["kind"], request["goal_id"], request["command_id"]) == ("command", "", "c1")


async def test_no_owner_a_termination_or_imported_history_tell_nobody(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await record(r, "cli", started("cli", owner=None), exited("cli", exit_code=1))
        await record(
            r,
            "t",
            started("t"),
            cmd.SignalSent(command_id="t", signal="SIGTERM", reason="terminate"),
            exited("t", status="terminated", end_reason="terminate", exit_code=143, signal="SIGTERM"),
        )
        await record(r, "imp", started("imp"), exited("imp", exit_code=2), correlation_id="import-x")
        await record(r, "quiet", started("quiet", notify_on_exit=False), exited("quiet", exit_code=9))
        await r.engine.catch_up()
        assert await shown(r) == []


async def test_watch_pushes_and_notices_reach_the_owner_in_order(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await record(
            r,
            "w",
            started("w", watch=cmd.WatchSpec(filter="ERROR")),
            cmd.WatchMatched(
                command_id="w", lines=2, matches=2, pushes=1, text='[watch "dev"]\nERROR a\nERROR b'
            ),
            cmd.WatchSuspended(
                command_id="w", reason="flood", pushes=1, dropped=3, text='[watch "dev"] FLOOD: …'
            ),
        )
        await r.engine.catch_up()
        await record(r, "w", cmd.WatchSuspended(command_id="w", reason="cleared"), exited("w"))
        await r.engine.catch_up()
        texts = [t for _, t in await shown(r)]
        assert texts[:2] == ['[watch "dev"]\nERROR a\nERROR b', '[watch "dev"] FLOOD: …']
        assert len(texts) == 3 and texts[2].startswith(
            '[command "dev" (python3 app.py) exited w... exitCode=0'
        )


async def test_until_stop_is_the_owners_one_message(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        note = '[watch "dev"]\nboot\nREADY\n-- until "READY" matched (action=stop)'
        await record(
            r,
            "u",
            started("u", watch=cmd.WatchSpec(until="READY")),
            cmd.WatchMatched(command_id="u", lines=2, matches=1, pushes=1, until="READY", text=note),
            cmd.UntilStopped(command_id="u", until="READY"),
            cmd.SignalSent(command_id="u", signal="SIGTERM", reason="until"),
            exited("u", status="terminated", end_reason="until", exit_code=143, signal="SIGTERM"),
        )
        # the process ended by itself before the stop was claimed: still one message
        await record(
            r,
            "v",
            started("v", watch=cmd.WatchSpec(until="READY")),
            cmd.WatchMatched(command_id="v", lines=1, matches=1, pushes=1, until="READY", text="v-note"),
            exited("v"),
        )
        await r.engine.catch_up()
        assert [t for _, t in await shown(r)] == [note, "v-note"]


async def test_a_notice_recorded_but_not_delivered_is_delivered_once_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(tmp_path) as r:

        async def down(session_id: str, text: str, *, notification_id: str) -> bool:
            raise HostUnavailableError("notify", session_id=session_id)

        monkeypatch.setattr(r.host, "notify", down)
        await record(r, "c", started("c"), exited("c", exit_code=1))
        await r.engine.catch_up()
        assert [e.type async for e in r.store.read_stream(STREAM)] == ["notification.requested"]
        monkeypatch.undo()  # the engine "crashed"; the host is back
        for _ in range(2):
            fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
            await fresh.start()
            await fresh.catch_up()
        assert len(await shown(r)) == 1
        assert [e.type async for e in r.store.read_stream(STREAM)] == [
            "notification.requested",
            "notification.delivered",
        ]


async def test_an_exit_recorded_while_no_engine_ran_is_told_at_start(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await record(
            r, "late", started("late"), exited("late", status="missing", end_reason="missing", exit_code=None)
        )
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()
        [(_, text)] = await shown(r)
        assert text.startswith(
            '[command "dev" (python3 app.py) missing late... exitCode=unknown signal=none]'
        )


async def test_shared_members_tell_a_command_owner_once(tmp_path: Path) -> None:
    from loopd_es.engine.goal_fence import GoalFencedStore
    from loopd_es.engine.shares import Shares

    async with rig(tmp_path) as r:
        members = [Shares(r.store, name, r.clock, ttl_ms=10_000) for name in ("a", "b", "c")]
        for m in members:
            await m.join()
        for m in members:
            await m.refresh()
        engines = [
            Engine(GoalFencedStore(r.store, m), r.host, r.clock, EngineConfig(), shares=m) for m in members
        ]
        for cid in ("c1", "c2", "c3", "c4"):
            assert (
                sum(e.owns_command(cid) for e in engines) == 1
            )  # one deliverer per command, no claim needed
        await record(r, "c1", started("c1"), exited("c1", exit_code=5))
        for engine in engines:
            await engine.start()
            await engine.catch_up()
        for engine in engines:
            await engine.outbox.deliver()  # a maintenance pass everywhere: still shown once
        assert len(await shown(r)) == 1
        assert [e.type async for e in r.store.read_stream(STREAM)] == [
            "notification.requested",
            "notification.delivered",
        ]
