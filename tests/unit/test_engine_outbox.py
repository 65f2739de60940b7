"""The notification outbox: keyed by cause, shown once, recorded delivered once, whoever gets there first."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.app.service import Ctx
from loopd_es.engine.outbox import STREAM, Outbox

from ._engine_harness import rig

pytestmark = pytest.mark.anyio


async def test_two_processes_delivering_the_same_notice_show_and_record_it_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        state = await r.state(gid)
        first, second = Outbox(r.store, r.host, r.clock), Outbox(r.store, r.host, r.clock)
        await first.request(state, "blocked", "text one", "cause-1", Ctx.new())
        r.clock.advance(1)
        await second.request(state, "blocked", "text two, written later", "cause-1", Ctx.new())  # same cause
        assert not second.pending  # recorded before: nothing new
        # the second read the request before the first recorded its delivery (a race between processes)
        request = [e async for e in r.store.read_stream(STREAM)][0]
        second.observe(request)
        assert await second.deliver() == 0  # the host had shown it; the delivery is recorded once
        types = [e.type async for e in r.store.read_stream(STREAM)]
        assert types == ["notification.requested", "notification.delivered"]
        assert [n.text for n in await r.host.notifications()] == ["text one"]
