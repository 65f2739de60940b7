"""``SimulatedHost``: a deterministic worker host, scripted from a file, whose live state survives ``kill -9``.

It is the embedded default host (``sim:.loopd/host.json``) and the host every saga test runs against. Nothing
in it is random or timed: session and prompt ids count up, a session's status changes only when its script
says so (or a prompt, abort or :meth:`SimulatedHost.set_status` changes it; a prompt leaves it busy until the
worker's answer is done, as OpenCode does), and an injected failure fires on exactly the call it names. The
script and state formats are described in :mod:`loopd_es.host.sim_script`. Any call can be held at its start
until released (:mod:`loopd_es.host.sim_holds`), from this process or another.

Every call - including reads, because failures can target "the Nth call" - runs as one transaction: take the
state lock, load the state, count the call, apply it, save the state atomically, release. One thread hop per
call keeps file I/O off the event loop. Without a state path the state lives in memory (fast tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import anyio.to_thread
import msgspec

from ..clock import WALL, Clock, iso
from .base import (
    AgentCatalog,
    AgentInfo,
    ForkedWorker,
    ModelCatalog,
    ModelInfo,
    PromptReceipt,
    ProviderInfo,
    QuotaReport,
    SessionIdentity,
    SessionStatus,
    SwitchResult,
    Usable,
    transcript_text,
)
from .errors import (
    HostError,
    HostRejectedError,
    HostTimeoutError,
    HostUnavailableError,
    ProviderError,
    SessionNotFoundError,
    WorkerBusyError,
)
from .events import AnyHostEvent, SessionError, SessionStatusChanged, TranscriptMessage
from .sim_holds import SimHolds
from .sim_script import (
    JOURNAL_CAP,
    PROMPTS_CAP,
    CallRecord,
    ErrorKind,
    FailureRule,
    HostScript,
    PromptRecord,
    SimSession,
    SimState,
    check_rule,
    events_path_for,
    load_state,
    locked,
    read_script,
    save_state,
    state_path_for,
)
from .sim_stream import SimEvents

T = TypeVar("T")

_ERRORS: dict[ErrorKind, type[HostError]] = {
    "unavailable": HostUnavailableError,
    "timeout": HostTimeoutError,
    "rejected": HostRejectedError,
    "busy": WorkerBusyError,
    "session-not-found": SessionNotFoundError,
}


class SimulatedHost(SimHolds, SimEvents):
    """A :class:`~loopd_es.host.events.EngineHost` driven by a :class:`HostScript`; see the module docstring."""

    def __init__(
        self,
        script: HostScript | None = None,
        *,
        state_path: Path | None = None,
        url: str = "sim:memory",
        clock: Clock | None = None,
    ) -> None:
        self.script = (script or HostScript()).resolved(url)
        self.state_path = state_path
        self._url = url
        self._clock: Clock = clock or WALL
        self._memory = SimState.initial(self.script)
        self._pending: list[AnyHostEvent] = []
        self._subscribers = []
        self.events_path = events_path_for(state_path) if state_path is not None else None

    @classmethod
    def from_file(cls, path: Path, *, clock: Clock | None = None) -> SimulatedHost:
        """The host scripted by ``path`` (default catalog if missing), its state in ``<stem>.state.json``.

        Blocking (reads the script); :func:`loopd_es.host.open_host` calls it on a worker thread.

        :raises HostConfigError: when the script is invalid.
        """
        return cls(read_script(path), state_path=state_path_for(path), url=f"sim:{path}", clock=clock)

    @property
    def url(self) -> str:
        return self._url

    # -- the port --------------------------------------------------------------------------------------

    async def create_worker(
        self, *, title: str, model: str | None = None, agent: str | None = None
    ) -> SessionIdentity:
        def run(state: SimState) -> SessionIdentity:
            self._enter(state, "create_worker", None, title)
            chosen_model = model or self.script.default_model or self._first_usable(state)
            chosen_agent = agent or self.script.default_agent or self._first_agent()
            if chosen_model is not None:
                self._check_model(state, "create_worker", None, chosen_model)
            if chosen_agent is not None:
                self._check_agent(state, "create_worker", None, chosen_agent)
            sid = f"ses_sim_{state.next_session:04d}"
            state.next_session += 1
            state.sessions[sid] = SimSession(id=sid, title=title, model=chosen_model, agent=chosen_agent)
            self._record(state, "create_worker", sid, title, "ok")
            return SessionIdentity(session_id=sid, model=chosen_model, agent=chosen_agent)

        return await self._port("create_worker", None, run)

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
        def run(state: SimState) -> PromptReceipt:
            self._enter(state, "prompt", session_id, model)
            session = self._session(state, "prompt", session_id)
            if model is not None:
                self._check_model(state, "prompt", session_id, model)
            if agent is not None:
                self._check_agent(state, "prompt", session_id, agent)
            # a prompt id is delivered once: a resend after a crash is a no-op (looked up even when ``fresh``:
            # here the look-up costs nothing)
            if prompt_id is not None:
                sent = next((p for p in state.prompts if p.prompt_id == prompt_id), None)
                if sent is not None:
                    self._record(state, "prompt", session_id, model, "duplicate")
                    return PromptReceipt(
                        session_id=session_id, prompt_id=prompt_id, model=sent.model, agent=sent.agent
                    )
            pid = prompt_id or f"prm_sim_{state.next_prompt:04d}"
            state.next_prompt += 1
            session.model = model or session.model
            session.agent = agent or session.agent
            polls = self.script.prompt_busy_polls
            if polls is None:  # as OpenCode: busy until the answer is done
                session.status, session.then = "busy", []
            elif polls:
                busy: list[SessionStatus] = ["busy"] * (polls - 1)
                session.status, session.then = "busy", [*busy, "idle"]
            self._add_message(
                state,
                session_id,
                TranscriptMessage(message_id=pid, role="user", created_at=self._now(), text=text),
            )
            self._emit(state, lambda seq: SessionStatusChanged(session_id=session_id, seq=seq, status="busy"))
            if self.script.auto_reply:
                u = self.script.reply_usage
                self._answer(
                    state,
                    session_id,
                    input=u.input,
                    output=u.output,
                    cost=u.cost,
                    duration_ms=u.duration_ms,
                    complete=True,
                    text="",
                )
                self._go_idle(state, session)
            state.prompts.append(
                PromptRecord(
                    prompt_id=pid, session_id=session_id, model=session.model, agent=session.agent, text=text
                )
            )
            del state.prompts[:-PROMPTS_CAP]
            self._record(state, "prompt", session_id, model, "ok")
            return PromptReceipt(
                session_id=session_id, prompt_id=pid, model=session.model, agent=session.agent
            )

        return await self._port("prompt", session_id, run)

    async def session_status(self, session_id: str) -> SessionStatus:
        def run(state: SimState) -> SessionStatus:
            try:
                self._enter(state, "session_status", session_id, None)
            except HostError:
                return "unknown"
            session = state.sessions.get(session_id)
            if session is None:
                self._record(state, "session_status", session_id, None, "unknown")
                return "unknown"
            status = session.status
            if session.then:
                session.status = session.then.pop(0)
            self._record(state, "session_status", session_id, None, status)
            return status

        return await self._port("session_status", session_id, run)

    async def abort(self, session_id: str) -> None:
        def run(state: SimState) -> None:
            self._enter(state, "abort", session_id, None)
            session = self._session(state, "abort", session_id)
            # as OpenCode: a turn stopped mid-answer ends with MessageAbortedError, one stopped in a retry
            # wait without an error; both then report idle (an idle session reports nothing)
            if session.status == "busy":
                error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
                self._emit(state, lambda seq: SessionError(session_id=session_id, seq=seq, error=error))
            if session.status in ("busy", "retry"):
                self._go_idle(state, session)
            session.status, session.then = "idle", []
            self._record(state, "abort", session_id, None, "ok")

        await self._port("abort", session_id, run)

    async def session_identity(self, session_id: str) -> SessionIdentity:
        def run(state: SimState) -> SessionIdentity:
            self._enter(state, "session_identity", session_id, None)
            session = self._session(state, "session_identity", session_id)
            self._record(state, "session_identity", session_id, None, "ok")
            return SessionIdentity(session_id=session_id, model=session.model, agent=session.agent)

        return await self._port("session_identity", session_id, run)

    async def list_models(self) -> ModelCatalog:
        def run(state: SimState) -> ModelCatalog:
            now = self._now()
            s = self.script
            capability = s.model_capability
            try:
                self._enter(state, "list_models", None, None)
                self._record(state, "list_models", None, None, capability)
            except HostError:  # already journalled; the port reports a failed catalog, never raises
                capability = "unavailable"
            quota = QuotaReport(source=self._url, observed_at=now)
            if capability != "supported":
                return ModelCatalog(
                    capability=capability,
                    source=self._url,
                    observed_at=now,
                    switching=s.model_switching,
                    quota=quota,
                )
            providers = tuple(
                ProviderInfo(provider_id=p.id, name=p.name or p.id, connected=p.connected)
                for p in s.providers or ()
            )
            models = tuple(
                ModelInfo(
                    provider_id=m.provider,
                    model_id=m.id,
                    name=m.name or m.id,
                    usable=state.usable_overrides.get(m.ref, m.usable),
                    context_limit=m.context_limit,
                    output_limit=m.output_limit,
                )
                for m in s.models or ()
            )
            return ModelCatalog(
                capability="supported",
                source=self._url,
                observed_at=now,
                switching=s.model_switching,
                providers=providers,
                models=models,
                quota=quota,
            )

        return await self._port("list_models", None, run)

    async def list_agents(self) -> AgentCatalog:
        def run(state: SimState) -> AgentCatalog:
            now = self._now()
            s = self.script
            capability = s.agent_capability
            try:
                self._enter(state, "list_agents", None, None)
                self._record(state, "list_agents", None, None, capability)
            except HostError:  # already journalled; the port reports a failed catalog, never raises
                capability = "unavailable"
            agents: tuple[AgentInfo, ...] = ()
            if capability == "supported":
                agents = tuple(
                    AgentInfo(name=a.name, mode=a.mode, description=a.description)
                    for a in s.agents or ()
                    if a.name.strip()
                )
            return AgentCatalog(
                capability=capability,
                source=self._url,
                observed_at=now,
                switching=s.agent_switching,
                agents=agents,
            )

        return await self._port("list_agents", None, run)

    async def switch_model(self, session_id: str, model: str) -> SwitchResult:
        return await self._switch("switch_model", session_id, model)

    async def switch_agent(self, session_id: str, agent: str) -> SwitchResult:
        return await self._switch("switch_agent", session_id, agent)

    async def _switch(
        self, op: Literal["switch_model", "switch_agent"], session_id: str, value: str
    ) -> SwitchResult:
        """One model or agent switch: forced results first, then the scripted switching mode."""

        def run(state: SimState) -> SwitchResult:
            forced = self._enter(state, op, session_id, value)
            session = self._session(state, op, session_id)
            mode = self.script.model_switching if op == "switch_model" else self.script.agent_switching
            result = forced or mode
            if result == "session":
                self._check_idle(state, session, op, value)
                if op == "switch_model":
                    self._check_model(state, op, session_id, value)
                    session.model = value
                else:
                    self._check_agent(state, op, session_id, value)
                    session.agent = value
            outcome: SwitchResult = "applied" if result == "session" else result
            self._record(state, op, session_id, value, outcome)
            return outcome

        return await self._port(op, session_id, run)

    async def compact(self, session_id: str, *, model: str | None = None) -> None:
        def run(state: SimState) -> None:
            self._enter(state, "compact", session_id, model)
            self._session(state, "compact", session_id)
            self._record(state, "compact", session_id, model, "ok")

        await self._port("compact", session_id, run)

    async def fork_worker(self, session_id: str, *, through: str | None, title: str) -> ForkedWorker:
        """The fork of the port; a script with ``can_fork: false`` plays a host without one (primes instead)."""

        def run(state: SimState) -> ForkedWorker:
            self._enter(state, "fork_worker", session_id, through)
            source = self._session(state, "fork_worker", session_id)
            messages = state.transcripts.get(session_id, [])
            kept: list[TranscriptMessage] = []
            if through is not None:
                at = next((i for i, m in enumerate(messages) if m.message_id == through), None)
                if at is None:
                    self._record(state, "fork_worker", session_id, through, "error:host-rejected")
                    raise HostRejectedError(
                        "fork_worker",
                        session_id=session_id,
                        detail=f"message {through} is not in the session",
                    )
                kept = messages[: at + 1]
            sid = f"ses_sim_{state.next_session:04d}"
            state.next_session += 1
            state.sessions[sid] = SimSession(id=sid, title=title, model=source.model, agent=source.agent)
            method: Literal["fork", "primed", "new"] = "new"
            if kept and self.script.can_fork:
                method = "fork"
                state.transcripts[sid] = list(kept)
            elif kept:
                method = "primed"
                primer = TranscriptMessage(
                    message_id=f"prm_sim_{state.next_prompt:04d}",
                    role="user",
                    created_at=self._now(),
                    text=transcript_text(kept),
                )
                state.next_prompt += 1
                self._add_message(state, sid, primer)
            self._record(state, "fork_worker", session_id, through, f"{method}:{sid}")
            return ForkedWorker(
                session_id=sid, source_session_id=session_id, method=method, kept_messages=len(kept)
            )

        return await self._port("fork_worker", session_id, run)

    async def aclose(self) -> None:
        return None

    # -- controls for tests and the CLI (not part of the port; never counted or journalled) ----------------

    async def set_status(
        self, session_id: str, status: SessionStatus, *, then: Sequence[SessionStatus] = ()
    ) -> None:
        """Make ``session_id`` report ``status`` now, then each of ``then`` on the following polls."""

        def run(state: SimState) -> None:
            session = self._session(state, "set_status", session_id)
            session.status, session.then = status, list(then)

        await self._transact(run)

    async def inject(self, rule: FailureRule) -> None:
        """Add a failure rule at run time (kept in the state file, so other processes see it too)."""
        check_rule(rule, self._url)

        def run(state: SimState) -> None:
            state.failures.append(rule)

        await self._transact(run)

    async def clear_failures(self) -> None:
        """Drop the failures injected at run time (the script's own stay)."""

        def run(state: SimState) -> None:
            state.failures.clear()

        await self._transact(run)

    async def set_model_usable(self, ref: str, usable: Usable) -> None:
        """Change what the catalog says about ``ref`` from now on (e.g. a provider being disabled)."""

        def run(state: SimState) -> None:
            state.usable_overrides[ref] = usable

        await self._transact(run)

    async def snapshot(self) -> SimState:
        """A copy of the live state: sessions, counters, the call journal, prompts."""
        return await self._transact(lambda state: msgspec.convert(msgspec.to_builtins(state), SimState))

    async def journal(self, *ops: str) -> list[CallRecord]:
        """The recorded calls (the last :data:`JOURNAL_CAP`), only those of ``ops`` when given."""
        state = await self.snapshot()
        return [c for c in state.calls if not ops or c.op in ops]

    async def reset(self) -> None:
        """Forget all live state and start again from the script."""

        def run(state: SimState) -> None:
            fresh = SimState.initial(self.script)
            for field in msgspec.structs.fields(SimState):
                setattr(state, field.name, getattr(fresh, field.name))

        await self._transact(run)

    # -- machinery -------------------------------------------------------------------------------------

    async def _transact(self, fn: Callable[[SimState], T]) -> T:
        if self.state_path is None:
            self._pending = []
            try:
                return fn(self._memory)
            finally:
                self._publish(self._pending)
                self._pending = []
        return await anyio.to_thread.run_sync(self._transact_file, fn, self.state_path)

    def _transact_file(self, fn: Callable[[SimState], T], path: Path) -> T:
        with locked(path):
            state = load_state(path) or SimState.initial(self.script)
            self._pending = []
            try:
                return fn(state)
            finally:
                # failed calls count too ("fails on the 2nd call" must hold across processes)
                save_state(path, state)
                self._publish(self._pending)  # under the lock: the events file stays in seq order
                self._pending = []

    def _enter(
        self, state: SimState, op: str, session_id: str | None, arg: str | None
    ) -> SwitchResult | None:
        """Count the call and fire the first matching failure rule: raise its error or return its result."""
        total = state.counters[op] = state.counters.get(op, 0) + 1
        per_session = 0
        if session_id is not None:
            key = f"{op}@{session_id}"
            per_session = state.counters[key] = state.counters.get(key, 0) + 1
        for rule in (*self.script.rules(), *state.failures):
            if rule.op not in (op, "*") or (rule.session is not None and rule.session != session_id):
                continue
            count = per_session if rule.session is not None else total
            if rule.on_call is not None and rule.on_call != count:
                continue
            if rule.result is not None:
                return rule.result
            error = self._error(rule, op, session_id)
            self._record(state, op, session_id, arg, f"error:{error.reason}")
            raise error
        return None

    @staticmethod
    def _error(rule: FailureRule, op: str, session_id: str | None) -> HostError:
        if rule.error == "provider" and rule.provider is not None:
            return ProviderError(op, rule.provider, session_id=session_id)
        assert rule.error is not None and rule.error != "provider"
        return _ERRORS[rule.error](op, session_id=session_id, detail=rule.detail)

    def _record(
        self, state: SimState, op: str, session_id: str | None, arg: str | None, outcome: str
    ) -> None:
        state.calls_total += 1
        state.calls.append(
            CallRecord(n=state.calls_total, op=op, session_id=session_id, arg=arg, outcome=outcome)
        )
        del state.calls[:-JOURNAL_CAP]

    def _session(self, state: SimState, op: str, session_id: str) -> SimSession:
        session = state.sessions.get(session_id)
        if session is None:
            self._record(state, op, session_id, None, "error:session-not-found")
            raise SessionNotFoundError(
                op, session_id=session_id, detail="no such session in the simulated host"
            )
        return session

    def _check_idle(self, state: SimState, session: SimSession, op: str, arg: str) -> None:
        if session.status in ("busy", "retry"):
            self._record(state, op, session.id, arg, "error:busy")
            raise WorkerBusyError(op, session_id=session.id, detail=f"session is {session.status}")

    def _check_model(self, state: SimState, op: str, session_id: str | None, ref: str) -> None:
        if self.script.model_capability != "supported":
            return
        found = next((m for m in self.script.models or () if m.ref == ref), None)
        usable = state.usable_overrides.get(ref, found.usable) if found is not None else False
        if usable is False:
            self._record(state, op, session_id, ref, "error:rejected")
            raise HostRejectedError(
                op, session_id=session_id, detail=f"model {ref} is not available on this host"
            )

    def _check_agent(self, state: SimState, op: str, session_id: str | None, name: str) -> None:
        if self.script.agent_capability == "supported" and name not in {
            a.name for a in self.script.agents or ()
        }:
            self._record(state, op, session_id, name, "error:rejected")
            raise HostRejectedError(
                op, session_id=session_id, detail=f"agent {name} is not available on this host"
            )

    def _first_usable(self, state: SimState) -> str | None:
        for m in self.script.models or ():
            if state.usable_overrides.get(m.ref, m.usable) is True:
                return m.ref
        return None

    def _first_agent(self) -> str | None:
        return next((a.name for a in self.script.agents or () if a.mode != "subagent"), None)

    def _now(self) -> str:
        return iso(self._clock.now())
