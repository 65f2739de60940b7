"""Failure texts word for word (issue #22, item 3): the error's own message in ``lastError``, the blocker, and the
owner's notice, as the reference writes them, after five session errors on the engine's real event path."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.engine.core import EngineConfig

from ._engine_harness import rig

pytestmark = pytest.mark.anyio


async def test_five_session_errors_keep_the_last_message_word_for_word(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        for n in range(1, 6):
            await r.host.fail(sid, {"name": "APIError", "data": {"message": f"error {n}", "statusCode": 500}})
            await r.pump()
            state = await r.state(gid)
            assert state.last_error == f"error {n}"
            if n < 5:
                await r.advance(60)  # past the backoff: the next turn runs
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == "Failed 5 times. Last error: error 5"
        assert state.blocker.needed == "User intervention required. Use retry to attempt again."
        failed = [e.data_dict() async for e in r.store.read_stream(f"goal-{gid}") if e.type == "run.failed"]
        assert [f["error"] for f in failed] == [f"error {n}" for n in range(1, 6)]
        notes = [n.text for n in await r.host.notifications()]
        assert notes == ['Loop goal "g" blocked after 5 failures. Last error: error 5.']


async def test_an_error_without_a_message_is_shown_as_json_without_headers(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.fail(sid, {"statusCode": 503, "responseHeaders": {"authorization": "SECRET"}})
        await r.pump()
        assert (await r.state(gid)).last_error == '{"statusCode":503}'
