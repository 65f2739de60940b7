"""The simulated host's event stream: what a real host reports (idle, busy, error, messages with usage, tool
calls), in order, to subscribers in this process or in another one (through the events file)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from loopd_es.host import SimulatedHost
from loopd_es.host.events import (
    AnyHostEvent,
    EngineHost,
    MessageUpdated,
    SessionError,
    SessionIdle,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
)
from loopd_es.host.sim_script import HostScript, ScriptUsage
from tests.waits import scaled_timeout

pytestmark = pytest.mark.anyio


async def _collect(host: SimulatedHost, count: int, act: object) -> list[AnyHostEvent]:
    got: list[AnyHostEvent] = []
    ready = anyio.Event()

    async def listen() -> None:
        stream = host.events()
        ready.set()
        async for event in stream:
            got.append(event)
            if len(got) == count:
                return

    with anyio.fail_after(scaled_timeout(5)):
        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            await ready.wait()
            await act()  # type: ignore[operator]
    return got


async def test_a_prompt_answered_by_the_worker_reports_what_a_real_host_does() -> None:
    host = SimulatedHost()
    assert isinstance(host, EngineHost)
    worker = await host.create_worker(title="w")
    sid = worker.session_id

    async def act() -> None:
        await host.prompt(sid, "do it", prompt_id="msg_p1")
        await host.tool_call(sid, "c1")
        await host.tool_call(sid, "c1", done=True)
        await host.reply(sid, input=10, output=5, cost=0.25)

    events = await _collect(host, 7, act)
    kinds = [type(e) for e in events]
    assert kinds == [
        MessageUpdated,
        SessionStatusChanged,
        ToolCallStarted,
        ToolCallEnded,
        MessageUpdated,
        SessionStatusChanged,
        SessionIdle,
    ]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    first, answer = events[0], events[4]
    assert isinstance(first, MessageUpdated) and first.message.role == "user"
    assert first.message.message_id == "msg_p1"
    assert isinstance(answer, MessageUpdated)
    assert answer.message.parent_id == "msg_p1" and answer.message.completed
    assert (answer.message.input, answer.message.output, answer.message.cost) == (10, 5, 0.25)
    transcript = await host.messages(sid)
    assert [m.role for m in transcript] == ["user", "assistant"]


async def test_a_prompt_id_is_delivered_once() -> None:
    host = SimulatedHost()
    sid = (await host.create_worker(title="w")).session_id
    await host.prompt(sid, "one", prompt_id="msg_1")
    await host.prompt(sid, "one again", prompt_id="msg_1")
    state = await host.snapshot()
    assert [p.text for p in state.prompts] == ["one"]
    assert len(await host.messages(sid)) == 1


async def test_auto_reply_answers_with_the_scripted_usage_and_goes_idle() -> None:
    host = SimulatedHost(HostScript(auto_reply=True, reply_usage=ScriptUsage(input=7, output=3, cost=0.5)))
    sid = (await host.create_worker(title="w")).session_id
    events = await _collect(host, 5, lambda: host.prompt(sid, "go", prompt_id="msg_a"))
    assert isinstance(events[2], MessageUpdated) and events[2].message.completed
    assert events[2].message.input == 7
    assert isinstance(events[-1], SessionIdle)
    assert await host.session_status(sid) == "idle"


async def test_a_failure_reports_the_error_as_the_host_saw_it() -> None:
    host = SimulatedHost()
    sid = (await host.create_worker(title="w")).session_id
    error = {"statusCode": 429, "responseHeaders": {"retry-after": "30"}}
    events = await _collect(host, 3, lambda: _busy_then_fail(host, sid, error))
    assert isinstance(events[0], SessionStatusChanged) and events[0].status == "busy"
    assert isinstance(events[1], SessionError) and events[1].error == error


async def _busy_then_fail(host: SimulatedHost, sid: str, error: dict[str, object]) -> None:
    await host.go_busy(sid)
    assert await host.session_status(sid) == "busy"
    await host.fail(sid, dict(error))


async def test_notices_are_shown_once_per_notification_id() -> None:
    host = SimulatedHost()
    assert await host.notify("owner", "hello", notification_id="n1") is True
    assert await host.notify("owner", "hello", notification_id="n1") is False
    assert [n.text for n in await host.notifications()] == ["hello"]


async def test_another_process_sees_the_events_through_the_file(tmp_path: Path) -> None:
    script = tmp_path / "host.json"
    script.write_text("{}")
    engine_side = SimulatedHost.from_file(script)
    control_side = SimulatedHost.from_file(script)  # another process would open the same files
    sid = (await control_side.create_worker(title="w")).session_id

    async def act() -> None:
        await control_side.go_busy(sid)
        await control_side.go_idle(sid)

    events = await _collect(engine_side, 3, act)
    assert [type(e) for e in events] == [SessionStatusChanged, SessionStatusChanged, SessionIdle]
    assert all(e.session_id == sid for e in events)
