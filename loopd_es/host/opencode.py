"""The OpenCode host: a real ``opencode serve`` driven over its HTTP API and ``/event`` stream (httpx + httpx-sse).

URL: ``opencode:http://127.0.0.1:4096`` (``LOOPD_ES_OPENCODE_PASSWORD`` or ``OPENCODE_SERVER_PASSWORD`` for a
server started with a password). What OpenCode does, and so what this adapter relies on (verified against
opencode-ai 1.18.33, ``shared/reference/opencode-host.md``):

- Identity rides on prompts: ``prompt_async`` carries ``model`` + ``agent`` + the same ``tools`` map every time
  (the model and the tools map are sticky in OpenCode, the agent is not). Switching is ``"next-prompt"``, and
  because OpenCode accepts any name and fails later, a switch is validated against ``/provider`` (usable =
  connected) and ``/agent`` (hidden ones dropped) **before** it is accepted.
- The client chooses the prompt's ``messageID`` (``msg…``); it is the run's fence, and a prompt id that is
  already in the transcript is not sent again (a resend after a crash is a no-op; a ``fresh`` id, made up by a
  fenced engine a moment before, is not looked up: no one else can have sent it).
- ``/session/status`` is a sparse map (absent = idle); a session that does not exist is told apart by a 404 on
  ``GET /session/{id}``. While the event stream is read, the statuses it tells are used instead of polling.
- ``/event`` has no resume id: after a reconnect the engine reconciles from status and messages. OpenCode sends
  ``server.heartbeat`` every 10 s, so a stream silent for :data:`STREAM_SILENT_S` is a server that hangs without
  dropping the connection (``kill -STOP``): it is dropped and reconnected like a closed one. A host that cannot
  be reached is told once per outage (:attr:`OpenCodeHost.on_health`), not on every retry. Streamed text
  (``message.part.delta``) counts as activity, idle pairs may repeat or come out of order (the engine's
  two-stage idle handles that), and ``permission.asked`` is answered by the configured policy so a headless
  worker never hangs.
- Usage is per assistant message (tokens and cost); a tool turn has two assistant messages with the same
  parent, each with its own usage.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx
import httpx_sse
import msgspec

from . import opencode_json as j
from .base import (
    AgentCatalog,
    ForkedWorker,
    ModelCatalog,
    PromptReceipt,
    SessionIdentity,
    SessionStatus,
    SwitchResult,
    transcript_text,
)
from .errors import (
    HostConfigError,
    HostError,
    HostRejectedError,
    HostReplyError,
    HostTimeoutError,
    HostUnavailableError,
    NotASessionError,
    SessionNotFoundError,
)
from .opencode_catalog import CatalogChecks, agent_catalog, model_catalog
from .opencode_events import normalise_error as normalise_error
from .opencode_events import transcript_message, translate_event
from .opencode_mirror import StreamMirror
from .opencode_wire import _message_id, _model_of, _split_model, _status_kind, fork_point

if TYPE_CHECKING:
    from .events import AnyHostEvent, TranscriptMessage

T = TypeVar("T")
log = logging.getLogger("loopd_es.host.opencode")

PASSWORD_ENVS: Final = ("LOOPD_ES_OPENCODE_PASSWORD", "OPENCODE_SERVER_PASSWORD")
PermissionPolicy = Literal["allow", "reject"]
SESSION_PREFIX: Final = "ses"
"""Every OpenCode session id starts with it (``ses_…``); OpenCode answers another id on a session path with a 500."""
STREAM_SILENT_S: Final = 25.0
"""How long the event stream may say nothing, not even OpenCode's heartbeat (every 10 s), before it counts as
hung (docs/reference/opencode-host.md#s4)."""
STATUS_TIMEOUT_S: Final = 10.0
"""A status poll's timeout: maintenance polls every worker, and a hung server must not hold it 30 s per goal."""
STATUS_TTL_S: Final = 0.05
ALIVE_TTL_S: Final = 30.0
ACTIVITY_EVERY_S: Final = 1.0
"""Streamed text is reported as activity at most once a second per session (deltas come at ~2 Hz or more)."""


class OpenCodeHost:
    """A worker host on a running ``opencode serve``; implements :class:`~loopd_es.host.events.EngineHost`."""

    def __init__(
        self,
        base_url: str,
        *,
        password: str | None = None,
        tools: Mapping[str, bool] | None = None,
        permission: PermissionPolicy = "reject",
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        stream_silent_s: float = STREAM_SILENT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tools = dict(tools or {})
        self.permission = permission
        auth = httpx.BasicAuth("opencode", password) if password else None
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            auth=auth,
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
        )
        self._seq = 0
        self._closed = False
        self.stream_silent_s = stream_silent_s
        self.on_health: Callable[[HostError | None], None] | None = None
        """Told once when the server stops answering (the error) and once when it answers again (``None``);
        without it, each is one warning in the log."""
        self._down: HostError | None = None
        self._check = CatalogChecks(self.list_models, self.list_agents)
        self._last_activity: dict[str, float] = {}
        self._open_tools: dict[str, set[str]] = {}
        self._users: set[str] = set()
        self._statuses: tuple[float, dict[str, j.StatusInfo]] | None = None
        self._alive: dict[str, float] = {}
        self._streamed: dict[str, SessionStatus] | None = None
        self._forks: bool | None = None
        self._mirror = StreamMirror(transcript_message)
        """Whether the server forks sessions (read from ``/doc`` once, when a fork is first asked for)."""
        """Each session's latest status as told on the ``/event`` stream being read (``None``: no stream)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> OpenCodeHost:
        """``opencode:http://HOST:PORT`` → a host; the password comes from the environment.

        :raises HostConfigError: for a URL that is not http(s).
        """
        base = url.strip().removeprefix("opencode:")
        if not base.startswith(("http://", "https://")):
            raise HostConfigError(url, "use opencode:http://HOST:PORT (the address `opencode serve` prints)")
        try:  # a port past 65535, a bracket left open: said here, not as a crash at the first connect
            parts = urlsplit(base)
            _ = parts.port
            httpx.URL(base)
        except (ValueError, httpx.InvalidURL) as e:
            raise HostConfigError(url, f"{e}; use opencode:http://HOST:PORT") from None
        if not parts.hostname:
            raise HostConfigError(url, "no host name; use opencode:http://HOST:PORT")
        password = next((os.environ[name] for name in PASSWORD_ENVS if os.environ.get(name)), None)
        return cls(base, password=password, **options)

    @property
    def url(self) -> str:
        return f"opencode:{self.base_url}"

    # -- HTTP -----------------------------------------------------------------------------------------

    async def _call(
        self, operation: str, method: str, path: str, *, session_id: str | None = None, **kwargs: Any
    ) -> bytes | None:
        """One request; host errors translated here and only here (a 404 on a session path: no such session).

        Returns the reply's body (``None`` when empty); :meth:`_read` decodes it into a Struct.
        """
        if method != "GET":
            self._statuses = None  # a prompt, abort or summary may change what the status map says
            if session_id is not None and self._streamed is not None:
                self._streamed.pop(session_id, None)  # until the stream tells what this request did
        try:
            reply = await self._client.request(method, path, **kwargs)
        except httpx.TimeoutException as e:
            raise HostTimeoutError(operation, session_id=session_id, detail=str(e)) from e
        except httpx.HTTPError as e:
            raise HostUnavailableError(operation, session_id=session_id, detail=str(e)) from e
        if reply.status_code == 404 and session_id is not None:
            raise SessionNotFoundError(operation, session_id=session_id, detail=reply.text)
        if reply.status_code in (400, 404, 409, 422):
            raise HostRejectedError(operation, session_id=session_id, detail=reply.text)
        if reply.status_code >= 400:
            raise HostUnavailableError(
                operation, session_id=session_id, detail=f"{reply.status_code}: {reply.text}"
            )
        if reply.status_code == 204 or not reply.content:
            return None
        return reply.content

    async def _read(
        self,
        into: type[T],
        operation: str,
        method: str,
        path: str,
        *,
        session_id: str | None = None,
        empty: T | None = None,
        **kwargs: Any,
    ) -> T:
        """:meth:`_call`, its reply decoded strictly as ``into`` (``empty`` when there is none, if given).

        :raises HostReplyError: naming the field when OpenCode answered something else.
        """
        body = await self._call(operation, method, path, session_id=session_id, **kwargs)
        if body is None and empty is not None:
            return empty
        try:
            return msgspec.json.decode(body or b"null", type=into)
        except msgspec.DecodeError as e:
            raise HostReplyError(operation, str(e), session_id=session_id) from None

    # -- sessions -------------------------------------------------------------------------------------

    async def create_worker(
        self, *, title: str, model: str | None = None, agent: str | None = None
    ) -> SessionIdentity:
        body: dict[str, Any] = {"title": title or "loopd-es worker"}  # no title costs OpenCode an LLM call
        if model is not None:
            await self._check.model("create", None, model)
            provider, model_id = _split_model(model)
            body["model"] = {"providerID": provider, "id": model_id}
        if agent is not None:
            await self._check.agent("create", None, agent)
            body["agent"] = agent
        info = await self._read(j.SessionInfo, "create", "POST", "/session", json=body)
        return SessionIdentity(session_id=info.id, model=model or _model_of(info), agent=agent or info.agent)

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        model: str | None = None,
        agent: str | None = None,
        prompt_id: str | None = None,
        fresh: bool = False,
    ) -> PromptReceipt:
        message_id = _message_id(prompt_id) if prompt_id is not None else None
        if message_id is not None and not fresh and await self._has_message(session_id, message_id):
            return PromptReceipt(
                session_id=session_id, prompt_id=prompt_id or message_id, model=model, agent=agent
            )
        body: dict[str, Any] = {"parts": [{"type": "text", "text": text}]}
        if model is not None:
            await self._check.model("prompt", session_id, model)
            provider, model_id = _split_model(model)
            body["model"] = {"providerID": provider, "modelID": model_id}
        if agent is not None:
            await self._check.agent("prompt", session_id, agent)
            body["agent"] = agent
        if message_id is not None:
            body["messageID"] = message_id
        if self.tools:
            body["tools"] = self.tools
        await self._call(
            "prompt", "POST", f"/session/{session_id}/prompt_async", session_id=session_id, json=body
        )
        return PromptReceipt(
            session_id=session_id, prompt_id=prompt_id or message_id or "", model=model, agent=agent
        )

    async def session_status(self, session_id: str) -> SessionStatus:
        """As the port says: an unreachable host or a missing session is ``"unknown"``, never an error.

        While :meth:`events` reads the stream, a session's status is the one the stream last told (OpenCode
        announces every change there, in order), so the turn path does not poll; a session the stream has
        not told about since it connected, or that this host has just sent a prompt, abort or summary to,
        is polled. One engine decision reads the status several times within milliseconds: the polled map
        is reused for :data:`STATUS_TTL_S` (and dropped by anything this host sends), and a session seen
        alive recently is not looked up again to tell "idle" from "gone" (a 404 forgets it).
        """
        try:
            now = time.monotonic()
            status = self._streamed.get(session_id) if self._streamed is not None else None
            if status is None:
                if self._statuses is None or now - self._statuses[0] > STATUS_TTL_S:
                    statuses = await self._read(
                        dict[str, j.StatusInfo],
                        "status",
                        "GET",
                        "/session/status",
                        empty={},
                        timeout=STATUS_TIMEOUT_S,
                    )
                    self._statuses = (now, statuses)
                entry = self._statuses[1].get(session_id)
                status = "idle" if entry is None else _status_kind(entry.type)
            # idle is also what a missing session looks like: only GET /session/{id} tells them apart
            if status == "idle" and now - self._alive.get(session_id, -math.inf) > ALIVE_TTL_S:
                await self._call(
                    "status", "GET", f"/session/{session_id}", session_id=session_id, timeout=STATUS_TIMEOUT_S
                )
                self._alive[session_id] = now
        except SessionNotFoundError:
            self._alive.pop(session_id, None)
            return "unknown"
        except HostError:
            return "unknown"
        return status

    async def abort(self, session_id: str) -> None:
        await self._call(
            "get", "GET", f"/session/{session_id}", session_id=session_id
        )  # abort says true to anything
        await self._call("abort", "POST", f"/session/{session_id}/abort", session_id=session_id)

    async def session_identity(self, session_id: str) -> SessionIdentity:
        info = await self._read(
            j.SessionInfo, "identity", "GET", f"/session/{session_id}", session_id=session_id
        )
        return SessionIdentity(session_id=session_id, model=_model_of(info), agent=info.agent)

    async def compact(self, session_id: str, *, model: str | None = None) -> None:
        if model is None:
            model = (await self.session_identity(session_id)).model
        if model is None:
            raise HostRejectedError("compact", session_id=session_id, detail="no model to summarise with")
        provider, model_id = _split_model(model)
        # blocks until OpenCode's compaction turn ends, which can take as long as a turn
        await self._call(
            "compact",
            "POST",
            f"/session/{session_id}/summarize",
            session_id=session_id,
            json={"providerID": provider, "modelID": model_id},
            timeout=None,
        )

    async def messages(self, session_id: str, *, limit: int = 200) -> list[TranscriptMessage]:
        """As the port says; read while the event stream is connected, it also seeds the session's mirror."""
        token = self._mirror.begin_read(session_id)
        try:
            rows = await self._read(
                list[j.MessageRow],
                "messages",
                "GET",
                f"/session/{session_id}/message",
                session_id=session_id,
                params={"limit": limit},
                empty=[],
            )
        except BaseException:
            self._mirror.end_read(token)
            raise
        self._mirror.seed(token, rows, limit)
        return [transcript_message(row.info, row.parts) for row in rows]

    def streamed_messages(self, session_id: str, *, limit: int) -> list[TranscriptMessage] | None:
        """As the port says: the session's mirror (:mod:`.opencode_mirror`), seeded by a read of the session
        made while the event stream was connected, and kept by every message and part event since."""
        return self._mirror.messages(session_id, limit)

    async def fork_worker(self, session_id: str, *, through: str | None, title: str) -> ForkedWorker:
        """``POST /session/{id}/fork`` copies the messages *before* its ``messageID``: so the message after
        ``through`` is named (none: the whole session). A server whose ``/doc`` lists no fork gets a new
        session primed with the transcript (``noReply``)."""
        transcript = await self.messages(session_id, limit=100_000)
        kept, after = fork_point(transcript, through, session_id)
        if not kept:
            worker = await self.create_worker(title=title)
            return ForkedWorker(session_id=worker.session_id, source_session_id=session_id, method="new")
        if await self._can_fork():
            body: dict[str, Any] = {} if after is None else {"messageID": after}
            info = await self._read(
                j.SessionInfo, "fork", "POST", f"/session/{session_id}/fork", session_id=session_id, json=body
            )
            with contextlib.suppress(HostError):  # the title is cosmetic; the fork stands without it
                await self._call("fork", "PATCH", f"/session/{info.id}", json={"title": title})
            return ForkedWorker(
                session_id=info.id, source_session_id=session_id, method="fork", kept_messages=len(kept)
            )
        worker = await self.create_worker(title=title)
        await self._call(
            "fork",
            "POST",
            f"/session/{worker.session_id}/prompt_async",
            session_id=worker.session_id,
            json={"parts": [{"type": "text", "text": transcript_text(kept)}], "noReply": True},
        )
        return ForkedWorker(
            session_id=worker.session_id,
            source_session_id=session_id,
            method="primed",
            kept_messages=len(kept),
        )

    async def _can_fork(self) -> bool:
        """Whether the server's OpenAPI document (``GET /doc``) offers ``POST /session/{sessionID}/fork``."""
        if self._forks is None:
            doc = await self._read(j.OpenApiDoc, "doc", "GET", "/doc")
            self._forks = "post" in doc.paths.get("/session/{sessionID}/fork", {})
        return self._forks

    async def _has_message(self, session_id: str, message_id: str) -> bool:
        """Whether the session holds the message with this id: asked by id (``GET .../message/{id}``), so a
        resend after a burst of any length of later messages is still recognised (no window)."""
        try:
            await self._call(
                "message", "GET", f"/session/{session_id}/message/{message_id}", session_id=session_id
            )
        except SessionNotFoundError as e:
            if "Message not found" in e.detail:
                return False  # OpenCode 1.18 answers 404 "Message not found: <id>" for an unknown message
            raise
        return True

    async def notify(self, session_id: str, text: str, *, notification_id: str) -> bool:
        """Put ``text`` in the owner's session without asking for a reply (``noReply``); shown once per id.

        :raises NotASessionError: for an owner that is no OpenCode session (``cli``: OpenCode answers such a path
            with a 500, which would read as an outage and be retried for ever).
        """
        if self._down is not None:  # a hung server would hold each notice for the whole request timeout
            raise HostUnavailableError("notify", session_id=session_id, detail="the server does not answer")
        if not session_id.startswith(SESSION_PREFIX):
            raise NotASessionError(
                "notify", session_id=session_id, detail="OpenCode session ids start with ses"
            )
        message_id = "msg_" + hashlib.sha256(notification_id.encode()).hexdigest()[:26]
        if await self._has_message(session_id, message_id):
            return False
        await self._call(
            "notify",
            "POST",
            f"/session/{session_id}/prompt_async",
            session_id=session_id,
            json={"parts": [{"type": "text", "text": text}], "noReply": True, "messageID": message_id},
        )
        return True

    # -- catalogs and switches ------------------------------------------------------------------------

    async def list_models(self) -> ModelCatalog:
        try:
            reply = await self._read(j.Providers, "list_models", "GET", "/provider")
        except HostError:
            return model_catalog(None, self.url)
        return model_catalog(reply, self.url)

    async def list_agents(self) -> AgentCatalog:
        try:
            reply = await self._read(list[j.AgentEntry], "list_agents", "GET", "/agent", empty=[])
        except HostError:
            return agent_catalog(None, self.url)
        return agent_catalog(reply, self.url)

    async def switch_model(self, session_id: str, model: str) -> SwitchResult:
        await self._call("switch_model", "GET", f"/session/{session_id}", session_id=session_id)
        await self._check.model("switch_model", session_id, model)
        return "next-prompt"

    async def switch_agent(self, session_id: str, agent: str) -> SwitchResult:
        await self._call("switch_agent", "GET", f"/session/{session_id}", session_id=session_id)
        await self._check.agent("switch_agent", session_id, agent)
        return "next-prompt"

    # -- the event stream -----------------------------------------------------------------------------

    @property
    def streaming(self) -> bool:
        """True while the event stream is connected: from then on no host event is missed (tests wait on it)."""
        return self._streamed is not None

    async def events(self) -> AsyncGenerator[AnyHostEvent, None]:
        """Host events from now on, reconnecting (with backoff) when the stream drops or goes silent, until
        closed. A connection that fails, or a stream silent past :data:`STREAM_SILENT_S` (a hung server), is an
        outage, told once through :attr:`on_health`; a stream that drops and reconnects at once is not."""
        delay = 0.1
        silent = httpx.Timeout(self.stream_silent_s)  # each read, the heartbeats included
        while not self._closed:
            connected = False
            try:
                async with httpx_sse.aconnect_sse(self._client, "GET", "/event", timeout=silent) as source:
                    source.response.raise_for_status()
                    delay = 0.1
                    self._streamed = {}  # no resume: what happened before this connection is polled
                    self._mirror.connect(True)  # nor mirrored: each session's mirror is seeded again
                    try:
                        async for sse in source.aiter_sse():
                            if not connected:  # OpenCode's first event (server.connected): it answers
                                connected = True
                                self._health(None)
                            for event in await self._translate(sse.data):
                                yield event
                    finally:
                        self._streamed = None
                        self._mirror.connect(False)
            except (httpx.HTTPError, httpx_sse.SSEError) as e:
                if self._closed:
                    return
                timed_out = isinstance(e, httpx.TimeoutException)
                if timed_out or not connected:
                    self._health(
                        HostUnavailableError(f"event stream at {self.base_url} ({type(e).__name__})")
                    )
                log.info(  # each retry only with --verbose: the outage itself is told once (_health)
                    "OpenCode event stream at %s dropped (%s); reconnecting in %.1f s",
                    self.base_url,
                    type(e).__name__,
                    delay,
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _health(self, error: HostError | None) -> None:
        """The server stopped answering (``error``) or answers again (``None``): told once per change."""
        if (error is None) == (self._down is None):
            return
        self._down = error
        if self.on_health is not None:
            self.on_health(error)
        elif error is not None:
            log.warning("OpenCode at %s does not answer (%s); retrying with backoff", self.base_url, error)
        else:
            log.warning("OpenCode at %s answers again", self.base_url)

    async def _translate(self, data: str) -> list[AnyHostEvent]:
        """One ``/event`` payload as host events; one that does not decode is logged (naming the field) and
        dropped, so one odd event never stops the stream."""
        try:
            raw = msgspec.json.decode(data, type=j.BusEvent)
            kind = raw.type
            props = msgspec.json.decode(raw.properties)
            if not isinstance(props, dict):
                raise msgspec.ValidationError(
                    f"Expected `object`, got `{type(props).__name__}` - at `$.properties`"
                )
            if kind == "permission.asked":
                await self._answer_permission(j.convert(props, j.PermissionProps))
                return []
            session_id = props.get("sessionID")
            if not isinstance(session_id, str):
                return []
            if self._streamed is not None:
                self._told(kind, props, session_id, self._streamed)
            self._mirror.feed(kind, props, session_id)
            translated = translate_event(
                kind, props, self._open_tools, self._activity(kind, session_id), self._users
            )
        except msgspec.DecodeError as e:
            log.warning("OpenCode sent an event this engine cannot read, dropped: %s", e)
            self._mirror.forget()  # it may have been about a mirrored message
            return []
        return [self._stamp(event) for event in translated]

    def _told(
        self, kind: object, props: dict[str, Any], session_id: str, streamed: dict[str, SessionStatus]
    ) -> None:
        """Keep the session's latest status as the stream tells it (read by :meth:`session_status`)."""
        if kind == "session.idle":
            streamed[session_id] = "idle"
        elif kind == "session.status":
            status = _status_kind(j.convert(props, j.StatusProps).status.type)
            if status == "unknown":  # a kind this adapter does not know: ask the status map instead
                streamed.pop(session_id, None)
            else:
                streamed[session_id] = status
        elif kind == "session.deleted":
            streamed.pop(session_id, None)
            self._alive.pop(session_id, None)

    def _activity(self, kind: object, session_id: str) -> bool:
        """Whether a streamed-text delta should be reported as activity now (throttled per session)."""
        if kind != "message.part.delta":
            return False
        now = time.monotonic()
        if now - self._last_activity.get(session_id, 0.0) < ACTIVITY_EVERY_S:
            return False
        self._last_activity[session_id] = now
        return True

    def _stamp(self, event: AnyHostEvent) -> AnyHostEvent:
        self._seq += 1
        return msgspec.structs.replace(event, seq=self._seq)

    async def _answer_permission(self, props: j.PermissionProps) -> None:
        request_id = props.id
        if request_id is None:
            return
        reply = "once" if self.permission == "allow" else "reject"
        with contextlib.suppress(HostError):
            await self._call("permission", "POST", f"/permission/{request_id}/reply", json={"reply": reply})
        log.info(
            "answered OpenCode permission %s (%s) for session %s: %s",
            request_id,
            props.permission,
            props.sessionID,
            reply,
        )

    async def aclose(self) -> None:
        self._closed = True
        await self._client.aclose()


__all__ = ("OpenCodeHost", "normalise_error", "translate_event")
