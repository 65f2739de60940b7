"""An OpenCode that cannot be reached is told once per outage, and once when it answers again, not on every
reconnect of the event stream (it printed a warning every 5 s for as long as it lasted). Against a scripted
OpenCode (``httpx.MockTransport``); the hung server (``kill -STOP``) is in tests/integration/test_opencode_e2e.py."""

from __future__ import annotations

import logging

import httpx
import pytest

from loopd_es.host.errors import HostError, HostUnavailableError
from loopd_es.host.events import ReportsHealth, SessionIdle
from loopd_es.host.opencode import OpenCodeHost

pytestmark = pytest.mark.anyio

STREAM = (
    b'data: {"type":"server.connected","properties":{}}\n\n'
    b'data: {"type":"session.idle","properties":{"sessionID":"ses_1"}}\n\n'
)


@pytest.mark.parametrize("listener", [True, False])
async def test_refused_connections_are_one_outage_told_once_and_its_end_once(
    listener: bool, caplog: pytest.LogCaptureFixture
) -> None:
    attempts = 0

    def opencode(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        if attempts <= 4:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=STREAM)

    told: list[HostError | None] = []
    host = OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(opencode))
    assert isinstance(host, ReportsHealth)
    if listener:
        host.on_health = told.append
    caplog.set_level(logging.WARNING, logger="loopd_es.host.opencode")
    try:
        events = host.events()
        first = await events.__anext__()  # through four refused connections
        await events.aclose()
    finally:
        await host.aclose()
    assert isinstance(first, SessionIdle) and attempts == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if listener:
        assert len(told) == 2 and isinstance(told[0], HostUnavailableError) and told[1] is None, told
        assert "ConnectError" in str(told[0])
        assert warnings == []  # the engine says it (once), not the host on every retry
    else:
        assert len(warnings) == 2 and "does not answer" in warnings[0] and "answers again" in warnings[1]
