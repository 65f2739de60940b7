"""The host's event stream: the facts a worker host reports about its sessions, as they happen.

These are exactly what OpenCode's event bus tells a plugin (docs/reference/loopd.md#s2-3), normalised:

- ``session.idle`` and ``session.status`` (``idle`` / ``busy`` / ``retry``): the worker stopped or is acting;
- ``session.error``: the run failed; ``error`` is the error as the host reported it (``statusCode``,
  ``responseHeaders``, ``message`` ...), classified later by :mod:`loopd_es.domain.provider_limit`;
- ``message.updated``: a user or assistant message appeared or changed; an assistant message carries its
  ``parent_id`` (the prompt it answers), whether it completed, and its token and cost usage;
  ``message.part.updated``: a part of a message changed (work in progress); ``session.execution.succeeded``: a
  v2 host says the execution finished;
- ``tool.started`` / ``tool.ended``: a tool call opened or closed (the plugin's before/after hooks);
- ``session.compacted``: the host finished summarising the session.

A host numbers its events (``seq``) in the order it emits them. A subscriber sees the events emitted after it
subscribed, like an SSE stream: events missed while nobody listened are not replayed, so the engine recovers
them by polling status and reading the transcript (:meth:`EngineHost.messages`), as the reference's
maintenance does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import msgspec

from .base import WorkerHost

if TYPE_CHECKING:
    from .errors import HostError

Role = Literal["user", "assistant"]


class TranscriptMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a session's transcript with the usage the host reports for it."""

    message_id: str
    role: Role
    parent_id: str | None = None
    completed: bool = False
    created_at: str = ""
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    duration_ms: float = 0.0
    text: str = ""
    finish: str | None = None
    """Why the model stopped (OpenCode: ``stop``, ``tool-calls``, ...); ``None`` when not told (an error)."""
    error: str | None = None
    """The error the message ended with (its name), if any."""
    tools_running: int = 0
    """Tool parts of the message still pending or running."""


class HostEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """One fact the host reported about ``session_id``; ``seq`` orders a host's events."""

    session_id: str
    seq: int = 0


class SessionIdle(HostEvent, frozen=True, kw_only=True, tag="session.idle"):
    """The session stopped working (one signal of the two the engine needs to confirm a run's end)."""


class SessionStatusChanged(HostEvent, frozen=True, kw_only=True, tag="session.status"):
    """The session's status changed; ``idle`` counts as an idle signal.

    A ``retry`` status says the host is retrying a refused model call by itself: ``message`` is the
    provider's text (the only hint of a quota or rate limit until the retries run out), ``attempt`` the
    retry number and ``next_at_ms`` when the next attempt goes (epoch milliseconds).
    """

    status: Literal["idle", "busy", "retry"]
    message: str | None = None
    attempt: int | None = None
    next_at_ms: int | None = None


class SessionError(HostEvent, frozen=True, kw_only=True, tag="session.error"):
    """The run failed; ``error`` is what the host reported, unclassified."""

    error: dict[str, Any]


class MessageUpdated(HostEvent, frozen=True, kw_only=True, tag="message.updated"):
    """A message of the session appeared or changed (a completed assistant message carries usage)."""

    message: TranscriptMessage


class MessagePartUpdated(HostEvent, frozen=True, kw_only=True, tag="message.part.updated"):
    """A part (text, a tool step) of message ``message_id`` changed: work in progress on that message."""

    message_id: str


class ExecutionSucceeded(HostEvent, frozen=True, kw_only=True, tag="session.execution.succeeded"):
    """The host says the session's current execution finished (v2 hosts): the turn's answer is complete."""


class ToolCallStarted(HostEvent, frozen=True, kw_only=True, tag="tool.started"):
    """The worker started a tool call; the run is not over while it is open."""

    call_id: str


class ToolCallEnded(HostEvent, frozen=True, kw_only=True, tag="tool.ended"):
    """A tool call closed."""

    call_id: str


class SessionCompacted(HostEvent, frozen=True, kw_only=True, tag="session.compacted"):
    """The host finished compacting the session."""


AnyHostEvent = (
    SessionIdle
    | SessionStatusChanged
    | SessionError
    | MessageUpdated
    | MessagePartUpdated
    | ExecutionSucceeded
    | ToolCallStarted
    | ToolCallEnded
    | SessionCompacted
)

ENCODER = msgspec.json.Encoder()
DECODER: msgspec.json.Decoder[AnyHostEvent] = msgspec.json.Decoder(AnyHostEvent)


@runtime_checkable
class EngineHost(WorkerHost, Protocol):
    """A worker host the engine can run goals on: the port plus its event stream, transcript and notices."""

    def events(self) -> AsyncIterator[AnyHostEvent]:
        """The events emitted from now on, in ``seq`` order, until the iterator is closed."""
        ...

    async def messages(self, session_id: str, *, limit: int = 200) -> list[TranscriptMessage]:
        """The last ``limit`` messages of the session, oldest first.

        :raises SessionNotFoundError: when the session does not exist.
        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...

    def streamed_messages(self, session_id: str, *, limit: int) -> list[TranscriptMessage] | None:
        """The last ``limit`` messages of the session as the host's event stream told them, equal to what
        :meth:`messages` would return now, without asking the host; ``None`` when the host cannot vouch for
        them (no stream, a stream that reconnected, a session it has not read since), so the caller reads.

        The engine proves a turn's end from them, so a host answers only what it knows to be complete.
        """
        ...

    async def notify(self, session_id: str, text: str, *, notification_id: str) -> bool:
        """Show ``text`` to the owner session; a ``notification_id`` already shown is not shown again.

        Returns whether it was shown now (``False``: it had been shown before).

        :raises HostUnavailableError: when the host cannot be reached.
        """
        ...


@runtime_checkable
class ReportsHealth(Protocol):
    """A host that tells when it stops answering and when it answers again (OpenCode, through its event
    stream: a refused connection, or a server that hangs without dropping it)."""

    on_health: Callable[[HostError | None], None] | None
    """Called once when the host stops answering (with the error) and once when it answers again (``None``)."""
