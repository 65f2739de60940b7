"""The stream mirror (``loopd_es.host.opencode_mirror``): a worker's messages as ``/event`` tells them, so a
proven turn goes from the idle to the next prompt without reading the transcript.

Against a scripted OpenCode (``httpx.MockTransport``) that tells every message and part on its bus as OpenCode
does; the real server's mirror is compared with its reads in ``tests/integration/test_opencode_host.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from loopd_es.host import opencode_json as j
from loopd_es.host.opencode_events import transcript_message
from loopd_es.host.opencode_mirror import KEEP, SESSIONS, StreamMirror
from tests.unit.test_opencode_turn_path import FakeOpenCode, Turns, turns

pytestmark = pytest.mark.anyio


@dataclass
class StreamingOpenCode(FakeOpenCode):
    """A scripted OpenCode whose bus tells each prompt and answer with its parts (``bus`` until drained)."""

    bus: list[dict[str, Any]] = field(default_factory=list)
    parts_made: int = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        reply = super().handle(request)
        if request.url.path.endswith("/prompt_async"):
            sid = request.url.path.split("/")[2]
            self.bus += self._told(sid, self.sessions[sid][-1])
        return reply

    def answer(
        self, sid: str, text: str = "done", *, parts: list[dict[str, Any]] | None = None, **extra: Any
    ) -> list[dict[str, Any]]:
        after = super().answer(sid, text, parts=parts, **extra)
        told = self._told(sid, self.sessions[sid][-1])
        return [*self.drain(), *told, *after]

    def drain(self) -> list[dict[str, Any]]:
        out, self.bus = self.bus, []
        return out

    def _told(self, sid: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A message's bus events: the message, then each part (given an id, as OpenCode's parts have)."""
        events = [{"type": "message.updated", "properties": {"sessionID": sid, "info": row["info"]}}]
        for part in row["parts"]:
            self.parts_made += 1
            part.update(id=f"prt_{self.parts_made:04d}", messageID=row["info"]["id"], sessionID=sid)
            events.append({"type": "message.part.updated", "properties": {"sessionID": sid, "part": part}})
        return events


def _stream_connected(t: Turns) -> None:
    t.host._mirror.connect(True)  # as while events() reads the stream


async def test_a_proven_turn_sends_its_prompt_without_reading_the_transcript(tmp_path: Path) -> None:
    fake = StreamingOpenCode()
    async with turns(tmp_path, fake=fake) as t:
        _stream_connected(t)
        goal_id, sid = await t.started()
        fake.requests.clear()
        await t.hear(fake.answer(sid, "first answer"))
        assert fake.requests == [f"GET /session/{sid}/message?limit=50", f"POST /session/{sid}/prompt_async"]
        for turn in range(3, 6):
            fake.requests.clear()
            await t.hear(fake.answer(sid, f"answer {turn - 1}"))
            await t.engine.run_due()
            assert fake.requests == [f"POST /session/{sid}/prompt_async"], (
                f"turn {turn}: the seed read is enough"
            )
            prompts = [r for r in fake.sessions[sid] if r["info"]["role"] == "user"]
            assert len(prompts) == turn and f"answer {turn - 1}" in prompts[-1]["parts"][0]["text"]  # quoted
        state = await t.engine.service.load(goal_id)
        assert state.run_count == 5 and state.tokens_used == 60  # four answers of 15, each counted once


@asynccontextmanager
async def one_turn_heard(tmp_path: Path) -> AsyncIterator[tuple[Turns, str]]:
    """An engine on a streaming OpenCode whose goal's first turn was answered (the mirror seeded by its read)."""
    fake = StreamingOpenCode()
    async with turns(tmp_path, fake=fake) as t:
        _stream_connected(t)
        _, sid = await t.started()
        await t.hear(fake.answer(sid))
        yield t, sid


async def test_after_the_stream_reconnects_the_next_turn_reads_again(tmp_path: Path) -> None:
    async with one_turn_heard(tmp_path) as (t, sid):
        fake = t.fake
        _stream_connected(t)  # a reconnect: events sent in the gap are lost, the mirror with them
        fake.requests.clear()
        await t.hear(fake.answer(sid))
        assert fake.requests == [f"GET /session/{sid}/message?limit=50", f"POST /session/{sid}/prompt_async"]


@pytest.mark.parametrize("kind", ["message.removed", "message.part.removed", "session.compacted"])
async def test_an_event_that_removes_messages_drops_the_mirror(tmp_path: Path, kind: str) -> None:
    async with one_turn_heard(tmp_path) as (t, sid):
        assert t.host.streamed_messages(sid, limit=2) is not None
        await t.hear([{"type": kind, "properties": {"sessionID": sid, "messageID": "msg_x", "partID": "p"}}])
        assert t.host.streamed_messages(sid, limit=2) is None


async def test_an_event_the_engine_cannot_read_drops_every_mirror(tmp_path: Path) -> None:
    async with one_turn_heard(tmp_path) as (t, sid):
        bad = {"sessionID": sid, "info": {"id": 7, "role": "assistant"}}
        assert await t.host._translate(json.dumps({"type": "message.updated", "properties": bad})) == []
        assert t.host.streamed_messages(sid, limit=2) is None


# -- the mirror alone ------------------------------------------------------------------------------------


def _row(message_id: str, role: str = "assistant", text: str = "", **info: Any) -> j.MessageRow:
    parts = (
        [{"type": "text", "id": f"prt_{message_id}", "messageID": message_id, "text": text}] if text else []
    )
    return msgspec.convert({"info": {"id": message_id, "role": role, **info}, "parts": parts}, j.MessageRow)


def _updated(message_id: str, role: str = "assistant", **info: Any) -> dict[str, Any]:
    return {"sessionID": "s", "info": {"id": message_id, "role": role, **info}}


def _part(message_id: str, text: str, part_id: str | None = None) -> dict[str, Any]:
    part = {"type": "text", "id": part_id or f"prt_{message_id}", "messageID": message_id, "text": text}
    return {"sessionID": "s", "part": part}


def _texts(mirror: StreamMirror, limit: int = 10) -> list[tuple[str, str]] | None:
    got = mirror.messages("s", limit)
    return None if got is None else [(m.message_id, m.text) for m in got]


def test_nothing_is_mirrored_without_a_connected_stream_and_a_seed() -> None:
    mirror = StreamMirror(transcript_message)
    assert mirror.begin_read("s") is None  # no stream: a read seeds nothing
    mirror.connect(True)
    mirror.feed("message.updated", _updated("m1"), "s")
    assert _texts(mirror) is None  # events before any seed: what came before them is unknown
    mirror.seed(mirror.begin_read("s"), [_row("m1", text="a")], 10)
    assert _texts(mirror) == [("m1", "a")]
    mirror.connect(False)
    assert _texts(mirror) is None


def test_events_that_arrive_during_the_seed_read_are_applied_again_on_top() -> None:
    """The read may or may not show them: applied again in order, the mirror ends at their state."""
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    token = mirror.begin_read("s")
    mirror.feed("message.updated", _updated("m2", parentID="m1"), "s")
    mirror.feed("message.part.updated", _part("m2", "partial"), "s")
    mirror.feed(
        "message.part.delta", {"messageID": "m2", "partID": "prt_m2", "field": "text", "delta": "+"}, "s"
    )
    mirror.seed(token, [_row("m1", "user", "ask"), _row("m2", text="parti")], 10)  # the read saw less
    assert _texts(mirror) == [("m1", "ask"), ("m2", "partial+")]


def test_a_reconnect_during_the_seed_read_seeds_nothing() -> None:
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    token = mirror.begin_read("s")
    mirror.connect(False)
    mirror.connect(True)
    mirror.seed(token, [_row("m1", text="a")], 10)
    assert _texts(mirror) is None


def test_the_mirror_answers_only_windows_it_holds_whole() -> None:
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    mirror.seed(mirror.begin_read("s"), [_row("m1", text="a"), _row("m2", text="b")], 2)  # maybe more before
    assert _texts(mirror, 2) == [("m1", "a"), ("m2", "b")]
    assert _texts(mirror, 3) is None
    mirror.feed("message.updated", _updated("m3"), "s")
    assert [m for m, _ in _texts(mirror, 3) or []] == ["m1", "m2", "m3"]  # listed in the order made
    mirror.seed(mirror.begin_read("s"), [_row("m1", text="a")], 5)  # fewer than asked: the whole session
    assert _texts(mirror, 5) == [("m1", "a")]


def test_the_mirror_keeps_the_newest_messages_in_the_order_they_were_made() -> None:
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    mirror.seed(mirror.begin_read("s"), [_row("z_first", text="0")], 10)
    for n in range(KEEP + 5):
        mirror.feed("message.updated", _updated(f"a{n:04d}"), "s")  # ids that sort before the first's
    got = mirror.messages("s", KEEP)
    assert got is not None and len(got) == KEEP and got[-1].message_id == f"a{KEEP + 4:04d}"
    assert got[0].message_id == "a0005" and mirror.messages("s", KEEP + 1) is None


def test_an_update_of_a_message_older_than_the_window_is_not_taken_for_a_new_one() -> None:
    """OpenCode updates a turn's prompt after the turn (its diff summary); one outside the seeded window must not
    be listed last, as if it were new."""
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    rows = [_row("m2", "user", "ask", time={"created": 20}), _row("m3", text="b", time={"created": 30})]
    mirror.seed(mirror.begin_read("s"), rows, 2)  # m1 (made at 10) is further back
    mirror.feed("message.updated", _updated("m4", "user", time={"created": 40}), "s")
    assert [m for m, _ in _texts(mirror, 3) or []] == ["m2", "m3", "m4"]
    mirror.feed("message.part.updated", _part("m0", "a part of a message it does not hold"), "s")
    assert [m for m, _ in _texts(mirror, 3) or []] == ["m2", "m3", "m4"]
    mirror.feed("message.updated", _updated("m1", "user", time={"created": 10}), "s")
    assert _texts(mirror, 3) is None  # dropped: read again rather than guess where it goes


def test_an_unreadable_event_during_the_seed_read_leaves_no_mirror_and_no_error() -> None:
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    token = mirror.begin_read("s")
    mirror.feed("message.updated", {"sessionID": "s", "info": {"id": 7}}, "s")  # no mirror yet to check it
    mirror.seed(token, [_row("m1", text="a")], 10)  # the read itself succeeds
    assert _texts(mirror) is None


def test_only_the_latest_seeded_sessions_are_mirrored() -> None:
    mirror = StreamMirror(transcript_message)
    mirror.connect(True)
    for n in range(SESSIONS + 1):
        mirror.seed(mirror.begin_read(f"s{n}"), [], 10)
    assert mirror.messages("s0", 1) is None and mirror.messages("s1", 1) == []
    assert mirror.messages(f"s{SESSIONS}", 1) == []
