"""The host contract against a real ``opencode serve`` and the fake model server (both on 127.0.0.1).

One server for the module; every test makes its own sessions. The fake model decides each kind of turn by the
model it is asked for (``slow``, ``limited``, ``badreq``) or the prompt's ``CALL`` text. Without OpenCode the
tests skip locally and fail under ``CI=true`` (:func:`tests.opencode.server.opencode_dir`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from loopd_es.host import open_host
from loopd_es.testing import HostContract, TurnKind

from .test_opencode_host import PASSWORD, fake, opencode  # noqa: F401 - the module's server fixtures

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from loopd_es.host.base import PromptReceipt
    from loopd_es.host.events import EngineHost
    from tests.opencode.server import OpenCodeServer

pytestmark = pytest.mark.slow
_MODEL_OF: dict[TurnKind, str] = {"slow": "fake/slow", "rate-limit": "fake/limited", "error": "fake/badreq"}


class OpenCodeWorker:
    """OpenCode's worker is its model: each kind of turn is a fake model (or a ``CALL`` prompt)."""

    models = ("fake/good", "fake/other")
    agents = ("build", "plan")

    async def turn(
        self,
        host: EngineHost,
        session_id: str,
        kind: TurnKind,
        *,
        prompt_id: str,
        model: str | None = None,
        agent: str | None = None,
    ) -> PromptReceipt:
        text = (
            'CALL bash {"command": "echo hi", "description": "say hi"}'
            if kind == "tool"
            else f"a {kind} turn"
        )
        return await host.prompt(
            session_id, text, model=_MODEL_OF.get(kind, model), agent=agent, prompt_id=prompt_id
        )

    async def probe(self, host: EngineHost, session_id: str) -> None:
        import uuid

        await host.notify(session_id, "probe", notification_id=f"probe-{uuid.uuid4().hex}")


class TestOpenCodeHost(HostContract):
    @pytest.fixture
    async def host(
        self,
        opencode: OpenCodeServer,  # noqa: F811 - the fixture imported above
        monkeypatch: pytest.MonkeyPatch,
    ) -> AsyncIterator[EngineHost]:
        monkeypatch.setenv("LOOPD_ES_OPENCODE_PASSWORD", PASSWORD)
        opened = await open_host(f"opencode:{opencode.url}")
        yield opened  # type: ignore[misc]
        await opened.aclose()

    @pytest.fixture
    def worker(self) -> OpenCodeWorker:
        return OpenCodeWorker()
