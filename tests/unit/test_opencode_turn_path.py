"""The OpenCode host calls one engine turn makes, counted against a scripted OpenCode (``httpx.MockTransport``).

The overhead of a turn (issue #13: idle → next ``prompt_async``) is mostly round trips to OpenCode, so these
tests pin how many there are: one transcript read and the prompt. A redundant call coming back (a status poll
the event stream already answered, a second transcript read, the transcript look-up for a prompt id made up
a moment before) fails them. The real server is exercised by ``tests/integration/test_opencode_*``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from loopd_es.clock import FakeClock
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.operations import Operations
from loopd_es.host.opencode import OpenCodeHost
from loopd_es.log import open_store
from loopd_es.sagas.crashpoints import CRASH_TRACE_ENV, Crash, arm

if TYPE_CHECKING:
    from loopd_es.host.events import AnyHostEvent

pytestmark = pytest.mark.anyio


@dataclass
class FakeOpenCode:
    """Just enough of ``opencode serve`` for a turn: sessions, prompts, transcripts, status, catalogs."""

    sessions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    stream: bytes = b""

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        limit = request.url.params.get("limit")
        self.requests.append(f"{method} {path}" + (f"?limit={limit}" if limit else ""))
        parts = path.strip("/").split("/")
        if path == "/event":
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self.stream)
        if path == "/provider":
            models = {"good": {"name": "Good"}}
            return httpx.Response(
                200, json={"all": [{"id": "fake", "models": models}], "connected": ["fake"]}
            )
        if path == "/agent":
            return httpx.Response(200, json=[{"name": "build", "mode": "primary"}])
        if path == "/session/status":
            return httpx.Response(200, json={sid: {"type": "busy"} for sid in self.busy})
        if path == "/session" and method == "POST":
            sid = f"ses_{len(self.sessions) + 1}"
            self.sessions[sid] = []
            return httpx.Response(200, json={"id": sid, "agent": "build"})
        sid = parts[1]
        if sid not in self.sessions:
            return httpx.Response(404, json={"name": "NotFoundError"})
        if len(parts) == 2:
            return httpx.Response(200, json={"id": sid, "agent": "build"})
        if parts[2] == "message" and len(parts) == 4:  # one message by id, as OpenCode 1.18 answers it
            found = [r for r in self.sessions[sid] if r["info"]["id"] == parts[3]]
            if not found:
                return httpx.Response(404, json={"name": "NotFoundError", "data": {
                    "message": f"Message not found: {parts[3]}"}})  # fmt: skip
            return httpx.Response(200, json=found[0])
        if parts[2] == "message":
            rows = self.sessions[sid]
            return httpx.Response(200, json=rows[-int(limit or 100) :])
        if parts[2] == "prompt_async":
            body = json.loads(request.content)
            info = {"id": body["messageID"], "role": "user", "time": {"created": 1}}
            self.sessions[sid].append({"info": info, "parts": body["parts"]})
            self.busy.add(sid)
            return httpx.Response(204)
        return httpx.Response(404, json={"name": "NotFoundError"})

    def answer(
        self, sid: str, text: str = "done", *, parts: list[dict[str, Any]] | None = None, **extra: Any
    ) -> list[dict[str, Any]]:
        """The worker answers the latest prompt; returns the bus events OpenCode sends for it
        (docs/reference/opencode-host.md#s4 order).

        ``extra`` overrides the assistant message's fields (``finish``, ``error``); ``parts`` are added to it.
        """
        prompt = next(r["info"]["id"] for r in reversed(self.sessions[sid]) if r["info"]["role"] == "user")
        info: dict[str, Any] = {
            "id": f"msg_answer_{len(self.sessions[sid])}",
            "role": "assistant",
            "parentID": prompt,
            "time": {"created": 2, "completed": 3},
            "tokens": {"input": 10, "output": 5},
            "cost": 0.001,
            "finish": "stop",
            **extra,
        }
        info = {k: v for k, v in info.items() if v is not None}
        self.sessions[sid].append({"info": info, "parts": [{"type": "text", "text": text}, *(parts or [])]})
        self.busy.discard(sid)
        return [
            {"type": "message.updated", "properties": {"sessionID": sid, "info": info}},
            {"type": "session.status", "properties": {"sessionID": sid, "status": {"type": "busy"}}},
            {"type": "session.status", "properties": {"sessionID": sid, "status": {"type": "idle"}}},
            {"type": "session.idle", "properties": {"sessionID": sid}},
        ]


@dataclass
class Turns:
    fake: FakeOpenCode
    host: OpenCodeHost
    engine: Engine
    ops: Operations

    async def started(self) -> tuple[str, str]:
        """A goal created with its first turn sent; its id and its worker session."""
        created = await self.ops.create("g", "objective", model="fake/good", agent="build")
        assert created.goal_id is not None
        await self.engine.catch_up()
        return created.goal_id, next(iter(self.fake.sessions))

    async def hear(self, bus_events: list[dict[str, Any]]) -> None:
        """The bus events as the host reads them off ``/event``, each handed to the engine."""
        for raw in bus_events:
            translated: list[AnyHostEvent] = await self.host._translate(json.dumps(raw))
            for event in translated:
                await self.engine.on_host_event(event)


@asynccontextmanager
async def bare_host() -> AsyncIterator[tuple[FakeOpenCode, OpenCodeHost]]:
    """An OpenCode host on a scripted OpenCode, no engine."""
    fake = FakeOpenCode()
    host = OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(fake.handle))
    try:
        yield fake, host
    finally:
        await host.aclose()


async def _fence(goal_id: str | None = None) -> None:
    """A lease check that always passes: the engine as ``loopd-es run`` builds it (fenced)."""


@asynccontextmanager
async def turns(
    tmp_path: Path, *, fenced: bool = True, confirm_idle_ms: int = 0, fake: FakeOpenCode | None = None
) -> AsyncIterator[Turns]:
    """An engine started on ``tmp_path``'s log (new or left by an earlier engine) and a scripted OpenCode."""
    fake = fake or FakeOpenCode()
    host = OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(fake.handle))
    host._streamed = {}  # as while events() reads the stream
    clock = FakeClock()
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as store:
        engine = Engine(
            store,
            host,
            clock,
            EngineConfig(confirm_idle_ms=confirm_idle_ms),
            directory=str(tmp_path),
            guard=_fence if fenced else None,
        )
        ops = Operations(store, host, clock=clock, directory=str(tmp_path), owner="owner-1")
        await engine.start()
        engine.next_maintenance = None
        try:
            yield Turns(fake, host, engine, ops)
        finally:
            await host.aclose()


async def test_a_turn_reads_the_transcript_once_and_sends_the_prompt(tmp_path: Path) -> None:
    async with turns(tmp_path) as t:
        goal_id, sid = await t.started()
        for turn in range(2, 5):
            t.fake.requests.clear()
            await t.hear(t.fake.answer(sid))
            await t.engine.run_due()
            assert t.fake.requests == [
                f"GET /session/{sid}/message?limit=50",  # confirm, usage and the continuation's quotes
                f"POST /session/{sid}/prompt_async",
            ], f"turn {turn}"
        state = await t.engine.service.load(goal_id)
        assert state.run_count == 4 and state.tokens_used == 45  # three answers of 15, each counted once
        prompts = [r for r in t.fake.sessions[sid] if r["info"]["role"] == "user"]
        assert len(prompts) == 4 and "done" in prompts[-1]["parts"][0]["text"]  # quotes the last answer


async def test_an_unfenced_caller_still_looks_for_its_prompt_id_before_sending(tmp_path: Path) -> None:
    async with turns(tmp_path, fenced=False) as t:
        _, sid = await t.started()
        t.fake.requests.clear()
        await t.hear(t.fake.answer(sid))
        prompt_id = t.fake.sessions[sid][-1]["info"]["id"]
        assert (
            t.fake.requests
            == [
                f"GET /session/{sid}/message?limit=50",
                f"GET /session/{sid}/message/{prompt_id}",  # the prompt id's look-up, by id: no lease fences this caller
                f"POST /session/{sid}/prompt_async",
            ]
        )


async def test_the_status_comes_from_the_stream_and_a_prompt_makes_it_polled_again(tmp_path: Path) -> None:
    async def told(kind: str) -> None:
        status = {"sessionID": sid, "status": {"type": kind}}
        await host._translate(json.dumps({"type": "session.status", "properties": status}))

    async with bare_host() as (fake, host):
        sid = (await host.create_worker(title="w")).session_id
        assert await host.session_status(sid) == "idle"  # no stream: polled, and the session looked up
        assert fake.requests[-2:] == ["GET /session/status", f"GET /session/{sid}"]
        host._streamed = {}  # as while events() reads the stream
        fake.requests.clear()
        for kind in ("busy", "idle"):
            await told(kind)
            assert await host.session_status(sid) == kind
        assert fake.requests == []  # told by the stream (the session was seen alive a moment ago)
        await host.prompt(sid, "next", prompt_id="msg_next", fresh=True)
        fake.requests.clear()
        assert await host.session_status(sid) == "busy"  # the stream has not told what the prompt did yet
        assert fake.requests == ["GET /session/status"]
        await told("idle")
        assert await host.session_status(sid) == "idle"
        host._streamed = None  # the stream dropped: what it told is not trusted, the status map is
        assert await host.session_status(sid) == "busy"


async def test_the_streamed_statuses_live_only_while_the_stream_is_read(tmp_path: Path) -> None:
    async with bare_host() as (fake, host):
        sid = (await host.create_worker(title="w")).session_id
        busy = {"type": "session.status", "properties": {"sessionID": sid, "status": {"type": "busy"}}}
        fake.stream = b"".join(
            f"data: {json.dumps(e)}\n\n".encode()
            for e in ({"type": "server.connected", "properties": {}}, busy, busy)
        )
        stream = host.events()
        await anext(stream)  # the first busy, handed over while the stream is open
        assert host._streamed == {sid: "busy"}
        await stream.aclose()
        assert host._streamed is None


async def test_a_missing_session_is_unknown_even_after_the_stream_told_it_idle(tmp_path: Path) -> None:
    async with bare_host() as (fake, host):
        host._streamed = {}
        await host._translate(json.dumps({"type": "session.idle", "properties": {"sessionID": "ses_gone"}}))
        assert await host.session_status("ses_gone") == "unknown"  # idle is checked against a 404


async def test_a_turn_of_many_tool_calls_reads_the_whole_confirmation_window(tmp_path: Path) -> None:
    async with turns(tmp_path) as t:
        _, sid = await t.started()
        prompt = t.fake.sessions[sid][-1]["info"]["id"]
        for n in range(60):  # one assistant message per tool call, all answering the same prompt
            info = {
                "id": f"msg_tool_{n:02d}",
                "role": "assistant",
                "parentID": prompt,
                "time": {"created": 2, "completed": 3},
                "finish": "tool-calls",
            }
            t.fake.sessions[sid].append({"info": info, "parts": []})
        t.fake.requests.clear()
        await t.hear(t.fake.answer(sid))
        assert t.fake.requests == [
            f"GET /session/{sid}/message?limit=50",  # no user message in it: the prompt is further back
            f"GET /session/{sid}/message?limit=200",
            f"POST /session/{sid}/prompt_async",
        ]


async def test_a_turn_its_transcript_proves_over_continues_at_the_first_idle(tmp_path: Path) -> None:
    """No quiet period when the transcript proves the end: the next prompt goes out at the first idle signal,
    with the engine's clock never advanced past the 2 s the reference would wait."""
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        for turn in range(2, 5):
            await t.hear(t.fake.answer(sid))
            prompts = [r for r in t.fake.sessions[sid] if r["info"]["role"] == "user"]
            assert len(prompts) == turn, f"turn {turn}"
        types = [e.type async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
        assert types.count("run.completed") == 3 and "run.idle_candidate" not in types


RUNNING_TOOL = {"type": "tool", "callID": "call_1", "state": {"status": "running"}}


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"finish": "tool-calls"}, "a tool turn's first message: the answer to the tool's result follows"),
        ({"finish": None, "error": {"name": "APIError"}}, "an error: session.error may come after the idle"),
        ({"finish": None}, "no finish (an abort during OpenCode's retry wait)"),
        ({"parts": [RUNNING_TOOL]}, "a tool part still running: a trailing part will follow"),
    ],
)
async def test_a_turn_its_transcript_cannot_prove_over_keeps_the_quiet_period(
    tmp_path: Path, answer: dict[str, Any], why: str
) -> None:
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        await t.hear(t.fake.answer(sid, **answer))
        assert len([r for r in t.fake.sessions[sid] if r["info"]["role"] == "user"]) == 1, why
        types = [e.type async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
        assert "run.idle_candidate" in types and "run.completed" not in types, why


async def test_an_idle_after_a_queued_prompt_is_not_proof(tmp_path: Path) -> None:
    """A user message after the answer (a prompt OpenCode queued) means the session has more to do."""
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        bus = t.fake.answer(sid)
        queued = {"id": "msg_queued", "role": "user", "time": {"created": 4}}
        t.fake.sessions[sid].append({"info": queued, "parts": [{"type": "text", "text": "more"}]})
        await t.hear(bus)
        types = [e.type async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
        assert "run.idle_candidate" in types and "run.completed" not in types


async def test_the_stale_half_of_an_idle_pair_does_not_stage_the_next_run(tmp_path: Path) -> None:
    """The status idle confirms the turn; the session.idle right behind it is about the turn just ended."""
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        await t.hear(t.fake.answer(sid))
        types = [e.type async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
        assert types[-1] == "run.started" and "run.idle_candidate" not in types
        t.fake.busy.discard(sid)  # an early idle of the new run (the prompt_async race) is still staged
        await t.hear([{"type": "session.idle", "properties": {"sessionID": sid}}])
        types = [e.type async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
        assert types[-1] == "run.idle_candidate"


def test_decisions_read_the_worker_status_exactly_when_their_decider_looks_at_it() -> None:
    """A decision pays a host round trip for the worker status only when its decider reads it (the turn path
    decides usage, the idle confirmation and the run start, none of which do)."""
    import importlib
    import inspect

    from loopd_es.app import service
    from loopd_es.domain import switching

    decide = importlib.import_module("loopd_es.domain.decide")  # the package re-exports a function as decide
    deciders = {**decide._DECIDERS, **switching.DECIDERS}
    readers = {cls for cls, fn in deciders.items() if "worker_status" in inspect.getsource(fn)}
    assert readers == set(service._STATUS_COMMANDS)


def _appends(trace: Path, goal_id: str) -> list[str]:
    """The goal's appends a crash trace saw, as ``before append goal-ID TYPE,TYPE`` labels less the prefix."""
    prefix = f"before append goal-{goal_id} "
    labels = (line.split(" ", 1)[1] for line in trace.read_text().splitlines())
    return [label[len(prefix) :] for label in labels if label.startswith(prefix)]


async def test_a_proven_turn_and_the_next_runs_start_are_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage of the turn's last answer, the confirmation and the next run's start: one append, the start
    caused by the confirmation (the answer's completion, heard just before the idle, commits nothing)."""
    trace = tmp_path / "trace"
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        for _ in range(2):
            bus = t.fake.answer(sid)
            monkeypatch.setenv(CRASH_TRACE_ENV, str(trace))
            await t.hear(bus)
            monkeypatch.delenv(CRASH_TRACE_ENV)
        events = [e async for e in t.engine.store.read_stream(f"goal-{goal_id}")]
    assert _appends(trace, goal_id) == ["goal.usage_accounted,run.completed,run.started"] * 2
    completed = [e for e in events if e.type == "run.completed"]
    for done in completed:
        start = events[events.index(done) + 1]
        assert start.type == "run.started" and start.causation_id == done.event_id
        assert start.correlation_id == done.correlation_id


async def test_a_tool_steps_usage_is_counted_when_heard_and_the_last_answers_with_the_confirmation(
    tmp_path: Path,
) -> None:
    """A tool step's answer (``finish: tool-calls``) counts at once, so a budget can stop a long turn midway;
    the answer that may end the turn waits for the idle's confirmation (docs/reference/loopd.md#s3-12: every
    assistant message counts once)."""
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        goal_id, sid = await t.started()
        step = t.fake.answer(sid, finish="tool-calls")[:1]  # the tool step's completed message, no idle
        await t.hear(step)
        assert (await t.engine.service.load(goal_id)).tokens_used == 15
        last = t.fake.answer(sid)
        await t.hear(last[:1])  # the last answer completed, its idle not yet heard
        assert (await t.engine.service.load(goal_id)).tokens_used == 15
        await t.hear(last[1:])
        state = await t.engine.service.load(goal_id)
        assert state.tokens_used == 30 and state.run_count == 2


async def test_a_turn_compaction_follows_keeps_its_own_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a plain turn's start cannot settle (compaction due, a pending switch) keeps the confirmation alone
    in its commit, then takes the ordinary way."""
    trace = tmp_path / "trace"
    async with turns(tmp_path, confirm_idle_ms=2000) as t:
        created = await t.ops.create("g", "objective", model="fake/good", agent="build", compact_every=1)
        assert created.goal_id is not None
        await t.engine.catch_up()
        sid = next(iter(t.fake.sessions))
        bus = t.fake.answer(sid)
        monkeypatch.setenv(CRASH_TRACE_ENV, str(trace))
        await t.hear(bus)
        monkeypatch.delenv(CRASH_TRACE_ENV)
    assert _appends(trace, created.goal_id)[:2] == [
        "goal.usage_accounted,run.completed",
        "compaction.started",
    ]


async def test_a_crash_anywhere_in_a_proven_turn_sends_no_prompt_twice_and_loses_none(tmp_path: Path) -> None:
    """A crash at each crash point of a proven turn's handling, then a restarted engine: the next prompt goes
    out exactly once, whether the crash came before the one commit or after it (then it is resent)."""
    points = 0
    while True:
        points += 1
        workdir = tmp_path / f"crash-{points}"
        workdir.mkdir()
        fake = FakeOpenCode()
        async with turns(workdir, confirm_idle_ms=0, fake=fake) as t:
            goal_id, sid = await t.started()
            bus = t.fake.answer(sid)
            arm(points)
            try:
                await t.hear(bus)
            except Crash:
                crashed = True
            else:
                crashed = False
            finally:
                arm(None)
        if not crashed:
            break
        async with turns(workdir, confirm_idle_ms=0, fake=fake) as t:  # the restart: resends what it must
            idle = [{"type": "session.idle", "properties": {"sessionID": sid}}]
            for _ in range(3):  # the idle a status poll finds: staged, then confirmed
                if len([r for r in fake.sessions[sid] if r["info"]["role"] == "user"]) == 2:
                    break
                await t.hear(idle)
            prompts = [r["info"]["id"] for r in fake.sessions[sid] if r["info"]["role"] == "user"]
            assert len(prompts) == 2 and len(set(prompts)) == 2, f"crash point {points}: {prompts}"
            state = await t.engine.service.load(goal_id)
            assert (state.run_count, state.active_prompt_message_id) == (2, prompts[1]), (
                f"crash point {points}"
            )
    assert points > 2  # the usage's commit and the turn's commit were both crashed at
