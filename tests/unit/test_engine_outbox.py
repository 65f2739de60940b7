"""The notification outbox: keyed by cause, shown once, recorded delivered once, whoever gets there first."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest

from loopd_es.app.service import Ctx
from loopd_es.engine.outbox import STREAM, Outbox
from loopd_es.host.opencode import OpenCodeHost

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


async def test_a_notice_to_an_owner_that_is_no_opencode_session_is_recorded_undeliverable_once(
    tmp_path: Path,
) -> None:
    """A goal created from the CLI has the owner ``cli``. OpenCode answers ``GET /session/cli/message/…`` with a
    500 (its id check), which read as an outage: the notice was asked for again on every maintenance pass, for
    ever, one request per notice. It is settled instead (``notification.undeliverable``), read in
    ``loopd-es notifications``, and never sent again."""
    requests: list[str] = []

    def opencode(request: httpx.Request) -> httpx.Response:
        requests.append(request.url.path)
        return httpx.Response(500, json={"name": "UnknownError", "data": {"message": "Expected ses"}})

    host = OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(opencode))
    try:
        async with rig(tmp_path) as r:
            gid = await r.create()
            state = msgspec.structs.replace(await r.state(gid), owner_session_id="cli")
            outbox = Outbox(r.store, host, r.clock)
            await outbox.request(state, "complete", "done", "cause-1", Ctx.new())
            assert await outbox.deliver() == 0
            assert not outbox.pending and not outbox.pending_for(gid)
            recorded = [e async for e in r.store.read_stream(STREAM)]
            assert [e.type for e in recorded] == ["notification.requested", "notification.undeliverable"]
            assert "'cli' is not a session of the host" in recorded[1].data_dict()["reason"]
            assert requests == []  # OpenCode is not even asked
            again = Outbox(r.store, host, r.clock)
            await again.load()  # a restarted engine: nothing left to deliver
            assert not again.pending and await again.deliver() == 0
    finally:
        await host.aclose()
