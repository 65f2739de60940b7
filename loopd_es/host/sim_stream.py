"""The simulated host's event stream, transcript and owner notices, plus the controls that script them.

Events emitted inside one host transaction are numbered from the state's ``next_event`` and published when
the transaction ends: to in-process subscribers when the state lives in memory, and by appending them to
``<stem>.events.ndjson`` (under the state lock, so the file is in ``seq`` order) when it lives in a file, so
that an engine in another process sees what ``loopd-es host ...`` or a test scripted.

The controls (:meth:`SimEvents.reply`, :meth:`SimEvents.go_idle`, ...) are what a real worker would do on its
own: answer the prompt and use tokens, go busy or idle, fail with a provider error, open and close tool
calls. They are not part of the port.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio

from ..private_files import PRIVATE_FILE
from .events import (
    DECODER,
    ENCODER,
    AnyHostEvent,
    MessageUpdated,
    SessionError,
    SessionIdle,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
    TranscriptMessage,
)
from .sim_script import NOTIFICATIONS_CAP, TRANSCRIPT_CAP, NotificationRecord, SimSession, SimState

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectSendStream

T = TypeVar("T")
_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.05


class SimEvents:
    """Mixed into :class:`~loopd_es.host.simulated.SimulatedHost`: the engine-facing half of the host."""

    _pending: list[AnyHostEvent]
    _subscribers: list[MemoryObjectSendStream[AnyHostEvent]]
    events_path: Path | None

    async def _transact(self, fn: Callable[[SimState], T]) -> T:  # pragma: no cover - provided by the host
        raise NotImplementedError

    def _session(self, state: SimState, op: str, session_id: str) -> SimSession:  # pragma: no cover
        raise NotImplementedError

    def _now(self) -> str:  # pragma: no cover
        raise NotImplementedError

    async def _port(
        self, op: str, session_id: str | None, fn: Callable[[SimState], T]
    ) -> T:  # pragma: no cover - provided by the host (a port call, held while its name is held)
        raise NotImplementedError

    # -- emitting --------------------------------------------------------------------------------------

    def _emit(self, state: SimState, make: Callable[[int], AnyHostEvent]) -> None:
        """Number an event and queue it for publication when the current transaction ends."""
        self._pending.append(make(state.next_event))
        state.next_event += 1

    def _publish(self, events: list[AnyHostEvent]) -> None:
        """Hand ``events`` to subscribers: the events file (file state) or in-process streams (memory)."""
        if not events:
            return
        if self.events_path is not None:
            data = b"".join(ENCODER.encode(e) + b"\n" for e in events)
            fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            return
        for stream in list(self._subscribers):
            for event in events:
                try:
                    stream.send_nowait(event)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._subscribers.remove(stream)
                    break

    async def events(self) -> AsyncIterator[AnyHostEvent]:
        """The events emitted from now on (see :class:`~loopd_es.host.events.EngineHost`)."""
        if self.events_path is not None:
            async for event in self._tail(self.events_path):
                yield event
            return
        send, receive = anyio.create_memory_object_stream[AnyHostEvent](math.inf)
        self._subscribers.append(send)
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            send.close()

    @staticmethod
    async def _tail(path: Path) -> AsyncIterator[AnyHostEvent]:
        """Follow the events file from its current end, polling (2 ms, backing off to 50 ms when quiet)."""
        try:
            offset = os.stat(path).st_size
        except FileNotFoundError:
            offset = 0
        carry = b""
        delay = _POLL_MIN_S
        while True:
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                offset += len(chunk)
                lines = (carry + chunk).split(b"\n")
                carry = lines.pop()
                for line in lines:
                    if line.strip():
                        yield DECODER.decode(line)
                delay = _POLL_MIN_S
                continue
            await anyio.sleep(delay)
            delay = min(_POLL_MAX_S, delay * 2)

    # -- the port: transcript and notices ---------------------------------------------------------------

    async def messages(self, session_id: str, *, limit: int = 200) -> list[TranscriptMessage]:
        def run(state: SimState) -> list[TranscriptMessage]:
            self._session(state, "messages", session_id)
            return list(state.transcripts.get(session_id, [])[-limit:])

        return await self._port("messages", session_id, run)

    def streamed_messages(self, session_id: str, *, limit: int) -> list[TranscriptMessage] | None:
        """Never: the simulated host's stream is a file other processes append to, read by polling, so it
        cannot vouch for a transcript without reading its state (which :meth:`messages` does)."""
        return None

    async def notify(self, session_id: str, text: str, *, notification_id: str) -> bool:
        def run(state: SimState) -> bool:
            if any(n.notification_id == notification_id for n in state.notifications):
                return False
            state.notifications.append(
                NotificationRecord(notification_id=notification_id, session_id=session_id, text=text)
            )
            del state.notifications[:-NOTIFICATIONS_CAP]
            return True

        return await self._port("notify", session_id, run)

    async def notifications(self) -> list[NotificationRecord]:
        """Every notice shown so far (the last 1000), oldest first."""
        return await self._transact(lambda state: list(state.notifications))

    # -- what a worker does (controls) -------------------------------------------------------------------

    def _add_message(self, state: SimState, session_id: str, message: TranscriptMessage) -> None:
        transcript = state.transcripts.setdefault(session_id, [])
        transcript[:] = [m for m in transcript if m.message_id != message.message_id]
        transcript.append(message)
        del transcript[:-TRANSCRIPT_CAP]
        self._emit(state, lambda seq: MessageUpdated(session_id=session_id, seq=seq, message=message))

    def _go_idle(self, state: SimState, session: SimSession) -> None:
        session.status, session.then = "idle", []
        self._emit(state, lambda seq: SessionStatusChanged(session_id=session.id, seq=seq, status="idle"))
        self._emit(state, lambda seq: SessionIdle(session_id=session.id, seq=seq))

    def _answer(
        self,
        state: SimState,
        session_id: str,
        *,
        input: int,
        output: int,
        cost: float,
        duration_ms: float,
        complete: bool,
        text: str,
    ) -> TranscriptMessage | None:
        """An assistant message answering the session's latest user message (``None`` without one)."""
        transcript = state.transcripts.get(session_id, [])
        prompt = next((m for m in reversed(transcript) if m.role == "user"), None)
        if prompt is None:
            return None
        answer_id = f"msg_sim_a{state.next_message:05d}"
        existing = (
            next(  # an answer still being written is continued; a finished one is followed by a new one
                (
                    m
                    for m in transcript
                    if m.role == "assistant" and m.parent_id == prompt.message_id and not m.completed
                ),
                None,
            )
        )
        if existing is not None:
            answer_id = existing.message_id
        else:
            state.next_message += 1
        message = TranscriptMessage(
            message_id=answer_id,
            role="assistant",
            parent_id=prompt.message_id,
            completed=complete,
            created_at=self._now(),
            input=input,
            output=output,
            cost=cost,
            duration_ms=duration_ms,
            text=text,
        )
        self._add_message(state, session_id, message)
        return message

    async def reply(
        self,
        session_id: str,
        *,
        input: int = 100,
        output: int = 50,
        cost: float = 0.001,
        duration_ms: float = 1000.0,
        complete: bool = True,
        idle: bool = True,
        text: str = "",
    ) -> TranscriptMessage | None:
        """The worker answers its latest prompt (using tokens); when ``complete`` and ``idle`` it then stops."""

        def run(state: SimState) -> TranscriptMessage | None:
            session = self._session(state, "reply", session_id)
            message = self._answer(
                state,
                session_id,
                input=input,
                output=output,
                cost=cost,
                duration_ms=duration_ms,
                complete=complete,
                text=text,
            )
            if complete and idle:
                self._go_idle(state, session)
            return message

        return await self._transact(run)

    async def user_message(self, session_id: str, message_id: str, text: str = "") -> None:
        """A user message not sent by the engine appears in the transcript (someone typed in the session)."""

        def run(state: SimState) -> None:
            self._session(state, "user_message", session_id)
            message = TranscriptMessage(message_id=message_id, role="user", created_at=self._now(), text=text)
            self._add_message(state, session_id, message)

        await self._transact(run)

    async def go_idle(self, session_id: str) -> None:
        """The session reports ``session.status idle`` and ``session.idle`` (what a host emits at a turn's end)."""

        def run(state: SimState) -> None:
            self._go_idle(state, self._session(state, "go_idle", session_id))

        await self._transact(run)

    async def go_busy(self, session_id: str, status: Literal["busy", "retry"] = "busy") -> None:
        """The session reports ``busy`` (or ``retry``) now and on every status poll until it goes idle."""

        def run(state: SimState) -> None:
            session = self._session(state, "go_busy", session_id)
            session.status, session.then = status, []
            self._emit(state, lambda seq: SessionStatusChanged(session_id=session_id, seq=seq, status=status))

        await self._transact(run)

    async def fail(self, session_id: str, error: dict[str, Any]) -> None:
        """The run fails with ``error`` as a host reports it (``{"statusCode": 429, ...}``); the session idles."""

        def run(state: SimState) -> None:
            session = self._session(state, "fail", session_id)
            self._emit(state, lambda seq: SessionError(session_id=session_id, seq=seq, error=error))
            self._go_idle(state, session)  # as OpenCode: the error, then an idle pair

        await self._transact(run)

    async def tool_call(self, session_id: str, call_id: str, *, done: bool = False) -> None:
        """The worker opens (or, with ``done``, closes) the tool call ``call_id``."""

        def run(state: SimState) -> None:
            self._session(state, "tool_call", session_id)
            if done:
                self._emit(state, lambda seq: ToolCallEnded(session_id=session_id, seq=seq, call_id=call_id))
            else:
                self._emit(
                    state, lambda seq: ToolCallStarted(session_id=session_id, seq=seq, call_id=call_id)
                )

        await self._transact(run)
