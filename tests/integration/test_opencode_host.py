"""The OpenCode host against a real ``opencode serve`` and the fake model server, both on 127.0.0.1.

One server for the module (it takes seconds to start); every test makes its own sessions. What each test
checks is what the engine relies on: prompts carry the identity and a client-chosen message id, a resend is a
no-op, events arrive as host events, usage comes per assistant message, provider errors are classifiable,
switches are validated before they are accepted, permissions never leave a worker hanging.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from loopd_es.domain.provider_limit import classify
from loopd_es.host import open_host
from loopd_es.host.errors import HostRejectedError, HostUnavailableError, SessionNotFoundError
from loopd_es.host.events import (
    AnyHostEvent,
    MessageUpdated,
    SessionError,
    SessionIdle,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
)
from loopd_es.host.opencode import OpenCodeHost
from tests.waits import alet_time_pass, await_until

from ..opencode.fake_llm import FakeLLM
from ..opencode.server import OpenCodeServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
PASSWORD = "s3cret-for-tests"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLM]:
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def opencode(fake: FakeLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenCodeServer]:
    server = OpenCodeServer(tmp_path_factory.mktemp("opencode"), fake, password=PASSWORD)
    server.start()
    yield server
    server.stop()


class Recorder:
    """Collects the host's events in a background task; ``wait`` blocks until one matches."""

    def __init__(self) -> None:
        self.events: list[AnyHostEvent] = []

    async def run(self, host: OpenCodeHost, ready: anyio.Event) -> None:
        stream = host.events()
        ready.set()
        async for event in stream:
            self.events.append(event)

    async def wait(self, match: Callable[[AnyHostEvent], bool], within: float = 30) -> AnyHostEvent:
        found = await await_until(
            f"a host event passing {getattr(match, '__name__', 'the match')}",
            lambda: next((e for e in self.events if match(e)), None),
            within=within,
        )
        assert found is not None
        return found


@pytest.fixture
async def host(opencode: OpenCodeServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenCodeHost]:
    monkeypatch.setenv("LOOPD_ES_OPENCODE_PASSWORD", PASSWORD)  # the server asks for it on every route
    opened = await open_host(f"opencode:{opencode.url}")
    assert isinstance(opened, OpenCodeHost)
    yield opened
    await opened.aclose()


@pytest.fixture
async def recorder(host: OpenCodeHost) -> AsyncIterator[Recorder]:
    rec = Recorder()
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run, host, ready)
        await ready.wait()
        await await_until("the event stream to connect", lambda: host.streaming)
        yield rec
        tg.cancel_scope.cancel()


def prompt_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


async def test_catalogs_offer_connected_models_and_visible_agents(host: OpenCodeHost) -> None:
    models = await host.list_models()
    assert models.capability == "supported" and models.switching == "next-prompt"
    assert models.usable("fake/good") and models.usable("fake/other")
    assert not models.usable("fake/nope")
    agents = (await host.list_agents()).names()
    assert {"build", "plan"} <= set(agents)
    assert not {"compaction", "summary", "title"} & set(agents)  # hidden agents are not offered
    assert models.quota.status == "unknown"


async def test_a_prompt_runs_one_turn_with_its_identity_and_usage(
    host: OpenCodeHost, recorder: Recorder, fake: FakeLLM
) -> None:
    worker = await host.create_worker(title="turn")
    pid = prompt_id()
    receipt = await host.prompt(
        worker.session_id, "write the guide", model="fake/other", agent="plan", prompt_id=pid
    )
    assert receipt.prompt_id == pid
    answer = await recorder.wait(
        lambda e: isinstance(e, MessageUpdated) and e.message.parent_id == pid and e.message.completed
    )
    await recorder.wait(lambda e: isinstance(e, SessionIdle) and e.session_id == worker.session_id)
    assert isinstance(answer, MessageUpdated) and answer.session_id == worker.session_id
    transcript = await host.messages(worker.session_id)
    user = next(m for m in transcript if m.message_id == pid)
    assistant = next(m for m in transcript if m.parent_id == pid)
    assert user.role == "user" and assistant.role == "assistant" and assistant.completed
    assert assistant.input > 0 and assistant.output > 0 and assistant.cost > 0
    assert fake.models_used(worker.session_id) == ["other"]
    identity = await host.session_identity(worker.session_id)
    assert (identity.model, identity.agent) == ("fake/other", "plan")
    assert await host.session_status(worker.session_id) == "idle"


async def test_a_prompt_id_already_in_the_transcript_is_not_sent_again(
    host: OpenCodeHost, recorder: Recorder, fake: FakeLLM
) -> None:
    worker = await host.create_worker(title="resend")
    pid = prompt_id()
    await host.prompt(worker.session_id, "once", model="fake/good", prompt_id=pid)
    await recorder.wait(lambda e: isinstance(e, SessionIdle) and e.session_id == worker.session_id)
    await host.prompt(worker.session_id, "once", model="fake/good", prompt_id=pid)  # a resend after a crash
    await alet_time_pass(0.5, "a second request to the model, were one sent, reaches it")
    assert len(fake.models_used(worker.session_id)) == 1
    assert [m.message_id for m in await host.messages(worker.session_id) if m.role == "user"] == [pid]


async def test_switches_are_validated_before_they_are_accepted(host: OpenCodeHost) -> None:
    worker = await host.create_worker(title="switch", model="fake/good", agent="build")
    assert await host.switch_model(worker.session_id, "fake/other") == "next-prompt"
    assert await host.switch_agent(worker.session_id, "plan") == "next-prompt"
    with pytest.raises(HostRejectedError):
        await host.switch_model(worker.session_id, "fake/nope")
    with pytest.raises(HostRejectedError):
        await host.switch_agent(worker.session_id, "nope")
    with pytest.raises(HostRejectedError):
        await host.prompt(worker.session_id, "x", model="fake/nope")
    with pytest.raises(SessionNotFoundError):
        await host.switch_model("ses_doesnotexist", "fake/other")


async def test_an_unknown_session_is_told_apart_from_an_idle_one(host: OpenCodeHost) -> None:
    worker = await host.create_worker(title="idle")
    assert await host.session_status(worker.session_id) == "idle"
    assert await host.session_status("ses_doesnotexist") == "unknown"  # absent from the map, like an idle one
    with pytest.raises(SessionNotFoundError):
        await host.abort("ses_doesnotexist")


async def test_abort_mid_stream_reports_the_abort_and_goes_idle(
    host: OpenCodeHost, recorder: Recorder, fake: FakeLLM
) -> None:
    worker = await host.create_worker(title="abort")
    pid = prompt_id()
    await host.prompt(worker.session_id, "take your time", model="fake/slow", prompt_id=pid)
    # mid-stream: the answer is being written (an abort before the model answers reports no error)
    await recorder.wait(lambda e: isinstance(e, MessageUpdated) and e.message.parent_id == pid)
    await await_until("the slow model to be asked", lambda: fake.models_used(worker.session_id))
    assert fake.models_used(worker.session_id) == ["slow"]
    assert await host.session_status(worker.session_id) == "busy"
    await host.abort(worker.session_id)
    error = await recorder.wait(lambda e: isinstance(e, SessionError) and e.session_id == worker.session_id)
    assert isinstance(error, SessionError) and error.error.get("name") == "MessageAbortedError"
    await recorder.wait(lambda e: isinstance(e, SessionIdle) and e.session_id == worker.session_id)


async def test_a_rate_limit_shows_as_retry_status_then_a_classifiable_error(
    host: OpenCodeHost, recorder: Recorder
) -> None:
    worker = await host.create_worker(title="limited")
    await host.prompt(worker.session_id, "hit the limit", model="fake/limited", prompt_id=prompt_id())
    await recorder.wait(
        lambda e: (
            isinstance(e, SessionStatusChanged) and e.session_id == worker.session_id and e.status == "retry"
        )
    )
    error = await recorder.wait(
        lambda e: isinstance(e, SessionError) and e.session_id == worker.session_id, 30
    )
    assert isinstance(error, SessionError)
    assert error.error["statusCode"] == 429 and error.error["code"] == "rate_limit_exceeded"
    verdict = classify(error.error, "session-error", datetime.now(UTC))
    assert verdict is not None and verdict.kind == "rate-limit", verdict


async def test_tool_calls_open_and_close(host: OpenCodeHost, recorder: Recorder) -> None:
    worker = await host.create_worker(title="tools")
    text = 'CALL bash {"command": "echo hi", "description": "say hi"}'
    await host.prompt(worker.session_id, text, model="fake/good", agent="build", prompt_id=prompt_id())
    started = await recorder.wait(
        lambda e: isinstance(e, ToolCallStarted) and e.session_id == worker.session_id
    )
    assert isinstance(started, ToolCallStarted)
    await recorder.wait(
        lambda e: (
            isinstance(e, ToolCallEnded)
            and e.session_id == worker.session_id
            and e.call_id == started.call_id
        )
    )
    await recorder.wait(lambda e: isinstance(e, SessionIdle) and e.session_id == worker.session_id)
    assistants = [m for m in await host.messages(worker.session_id) if m.role == "assistant"]
    assert len(assistants) == 2 and all(m.completed and m.output > 0 for m in assistants)  # usage per message


async def test_a_permission_ask_is_answered_so_the_worker_never_hangs(
    host: OpenCodeHost, recorder: Recorder
) -> None:
    worker = await host.create_worker(title="permission")
    text = 'CALL read {"filePath": "/etc/hostname"}'  # outside the project: OpenCode asks
    await host.prompt(worker.session_id, text, model="fake/good", agent="build", prompt_id=prompt_id())
    await recorder.wait(lambda e: isinstance(e, SessionIdle) and e.session_id == worker.session_id, 30)


async def test_notifications_are_shown_once_without_a_model_call(host: OpenCodeHost, fake: FakeLLM) -> None:
    owner = await host.create_worker(title="owner")
    before = len(fake.requests)
    assert await host.notify(owner.session_id, "Loop goal done", notification_id="note-1") is True
    assert await host.notify(owner.session_id, "Loop goal done", notification_id="note-1") is False
    users = [m for m in await host.messages(owner.session_id) if m.role == "user"]
    assert [m.text for m in users] == ["Loop goal done"]
    assert len(fake.requests) == before


async def test_already_sent_is_decided_by_the_message_id_after_any_burst(
    host: OpenCodeHost, fake: FakeLLM
) -> None:
    """The first notice is recognised as sent after 30 later messages (a window of the newest 20 would not)."""
    owner = await host.create_worker(title="owner")
    assert await host.notify(owner.session_id, "first", notification_id="burst-first") is True
    for i in range(30):
        assert await host.notify(owner.session_id, f"later {i}", notification_id=f"burst-{i}") is True
    assert await host.notify(owner.session_id, "first", notification_id="burst-first") is False
    users = [m.text for m in await host.messages(owner.session_id) if m.role == "user"]
    assert users.count("first") == 1 and len(users) == 31


async def test_without_the_password_nothing_gets_through(opencode: OpenCodeServer) -> None:
    host = OpenCodeHost(opencode.url)
    try:
        with pytest.raises(HostUnavailableError):
            await host.create_worker(title="nope")
        assert (await host.list_models()).capability == "unavailable"
    finally:
        await host.aclose()


async def test_an_unreachable_server_is_a_host_error(tmp_path: Path) -> None:
    host = OpenCodeHost("http://127.0.0.1:9", timeout=2)
    try:
        assert await host.session_status("ses_x") == "unknown"
        with pytest.raises(HostUnavailableError):
            await host.session_identity("ses_x")
        assert (await host.list_models()).capability == "unavailable"
    finally:
        await host.aclose()


async def test_the_stream_mirror_equals_a_read_at_every_turns_end(
    host: OpenCodeHost, recorder: Recorder, fake: FakeLLM
) -> None:
    """The engine proves a turn's end and quotes its last messages from the stream's mirror of the session,
    with no read on the path: at each turn's end it must equal what a read returns, whatever the turn did
    (text, a tool call, streamed chunks, a provider error, an abort)."""
    worker = await host.create_worker(title="mirror")
    sid = worker.session_id
    assert host.streamed_messages(sid, limit=50) is None  # nothing read since the stream connected
    assert await host.messages(sid, limit=50) == []  # the seed: an empty session, held whole
    assert host.streamed_messages(sid, limit=50) == []
    turns = [
        ("fake/good", "write the guide", False),
        ("fake/good", 'CALL bash {"command": "echo hi", "description": "say hi"}', False),
        ("fake/burst", "stream a lot", False),
        ("fake/badreq", "refused", True),
        ("fake/slow", "take your time", True),  # aborted mid-stream
        ("fake/other", "and once more", False),
    ]
    for model, text, fails in turns:
        pid = prompt_id()
        seen = len(recorder.events)
        await host.prompt(sid, text, model=model, agent="build", prompt_id=pid)
        if model == "fake/slow":

            def answers_prompt(e: AnyHostEvent, pid: str = pid) -> bool:
                return isinstance(e, MessageUpdated) and e.message.parent_id == pid

            await recorder.wait(answers_prompt)
            await await_until("the slow model to be asked", lambda: "slow" in fake.models_used(sid))
            await host.abort(sid)

        # the turn's end: its idle, after its error when it fails (a failing turn's first idle may come first)
        def ended(e: AnyHostEvent, seen: int = seen, fails: bool = fails) -> bool:
            later = recorder.events[seen:]
            errors = [i for i, x in enumerate(later) if isinstance(x, SessionError) and x.session_id == sid]
            idles = [i for i, x in enumerate(later) if isinstance(x, SessionIdle) and x.session_id == sid]
            return bool(idles) and (not fails or (bool(errors) and idles[-1] > errors[0]))

        await recorder.wait(ended)
        mirrored = host.streamed_messages(sid, limit=50)
        read = await host.messages(sid, limit=50)
        assert mirrored is not None, model
        assert [m.message_id for m in mirrored] == [m.message_id for m in read], model
        assert mirrored == read, model
    assert any(m.role == "assistant" and m.error for m in read)  # the failing turns were mirrored too
    assert host.streamed_messages(sid, limit=2) == read[-2:]
