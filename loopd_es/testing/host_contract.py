"""The behaviour every worker host must have, as a test suite: the simulated host and OpenCode both pass it.

The simulated host stands in for OpenCode in most tests, so it must not drift from what OpenCode was measured
to do (``shared/reference/opencode-host.md``). Subclass :class:`HostContract` and give it two fixtures:
``host`` (an open :class:`~loopd_es.host.events.EngineHost`) and ``worker`` (a
:class:`~loopd_es.testing.host_worker.ContractWorker` that gets each kind of turn from that host's worker)::

    class TestMyHost(HostContract):
        @pytest.fixture
        async def host(self): ...
        @pytest.fixture
        def worker(self): return SimulatedWorker(("p/a", "p/b"), ("build", "plan"))

It covers status (idle, busy, retry, unknown), idle signals (which may repeat), usage per assistant message,
tool calls, provider errors and 429s, aborts, "already sent" decided by the prompt's own message id, model and
agent switches, and holding a call (:class:`~loopd_es.host.holds.HeldHost`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import anyio
import pytest

from ..domain.provider_limit import classify
from ..host.errors import HostRejectedError, SessionNotFoundError
from ..host.events import (
    AnyHostEvent,
    EngineHost,
    MessageUpdated,
    SessionError,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
)
from ..host.holds import HeldHost
from .host_worker import ContractWorker, Recorder, is_idle, new_prompt_id


class HostContract:
    """Every test here runs against every host; a host passes all of them or the fake has drifted."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    async def host(self) -> AsyncIterator[EngineHost]:
        """An open host (overridden per host)."""
        raise NotImplementedError
        yield  # pragma: no cover

    @pytest.fixture
    def worker(self) -> ContractWorker:
        """The host's worker (overridden per host)."""
        raise NotImplementedError

    @pytest.fixture
    async def recorder(self, host: EngineHost) -> AsyncIterator[Recorder]:
        """The host's events from now on, in the background."""
        rec = Recorder()
        async with anyio.create_task_group() as tg:
            tg.start_soon(rec.run, host)
            yield rec
            tg.cancel_scope.cancel()

    async def _session(self, host: EngineHost, worker: ContractWorker, recorder: Recorder, title: str) -> str:
        made = await host.create_worker(title=title, model=worker.models[0], agent=worker.agents[0])
        await recorder.live(host, worker, made.session_id)
        return made.session_id

    async def _status_becomes(
        self, host: EngineHost, session_id: str, status: str, recorder: Recorder
    ) -> None:
        """Wait until a status poll says ``status`` (re-polled on every event the host emits)."""
        with anyio.fail_after(30):
            while await host.session_status(session_id) != status:
                with anyio.move_on_after(0.5):
                    await recorder.wait(lambda e: e.session_id == session_id, after=len(recorder.events))

    # -- catalogs and sessions ------------------------------------------------------------------------

    async def test_catalogs_offer_the_workers_models_and_agents(
        self, host: EngineHost, worker: ContractWorker
    ) -> None:
        models = await host.list_models()
        assert models.capability == "supported" and models.quota.status == "unknown"
        assert all(models.usable(m) for m in worker.models)
        assert not models.usable("nope/never")
        assert set(worker.agents) <= set((await host.list_agents()).names())

    async def test_a_new_session_is_idle_and_an_unknown_one_is_unknown(
        self, host: EngineHost, worker: ContractWorker
    ) -> None:
        made = await host.create_worker(title="new", model=worker.models[0], agent=worker.agents[0])
        assert await host.session_status(made.session_id) == "idle"
        identity = await host.session_identity(made.session_id)
        assert identity.session_id == made.session_id and identity.model == worker.models[0]
        assert await host.session_status("ses_doesnotexist") == "unknown"  # not "idle": it is not there
        with pytest.raises(SessionNotFoundError):
            await host.session_identity("ses_doesnotexist")
        with pytest.raises(SessionNotFoundError):
            await host.abort("ses_doesnotexist")

    # -- turns ----------------------------------------------------------------------------------------

    async def test_an_answer_carries_usage_and_is_in_the_transcript_at_the_idle(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "answer")
        pid = new_prompt_id()
        start = len(recorder.events)
        receipt = await worker.turn(host, sid, "answer", prompt_id=pid, model=worker.models[1])
        assert receipt.prompt_id == pid and receipt.session_id == sid
        await recorder.wait(_answered(pid), after=start)
        await recorder.wait(lambda e: is_idle(e, sid), after=start)
        # at the idle the answer is already readable (later updates of the turn add nothing the engine needs)
        transcript = await host.messages(sid)
        assert [m.message_id for m in transcript if m.role == "user"][-1] == pid
        answers = [m for m in transcript if m.parent_id == pid]
        assert len(answers) == 1 and answers[0].role == "assistant" and answers[0].completed
        assert answers[0].input > 0 and answers[0].output > 0 and answers[0].cost > 0
        await self._status_becomes(host, sid, "idle", recorder)

    async def test_a_prompt_keeps_the_session_busy_until_aborted_then_it_is_reusable(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "abort")
        start = len(recorder.events)
        await worker.turn(host, sid, "slow", prompt_id=new_prompt_id())
        await recorder.wait(
            lambda e: isinstance(e, SessionStatusChanged) and e.session_id == sid and e.status == "busy",
            after=start,
        )
        await self._status_becomes(host, sid, "busy", recorder)
        assert not any(is_idle(e, sid) for e in recorder.events[start:])  # no answer, no idle
        aborted = len(recorder.events)
        await host.abort(sid)
        await recorder.wait(lambda e: is_idle(e, sid), after=aborted)
        await self._status_becomes(host, sid, "idle", recorder)
        errors = [e for e in recorder.events[aborted:] if isinstance(e, SessionError) and e.session_id == sid]
        assert all(
            e.error.get("name") == "MessageAbortedError" for e in errors
        )  # an abort is no provider error
        pid = new_prompt_id()
        again = len(recorder.events)
        await worker.turn(host, sid, "answer", prompt_id=pid, model=worker.models[0])
        await recorder.wait(_answered(pid), after=again)

    async def test_a_tool_turn_opens_and_closes_the_call_with_usage_per_assistant_message(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "tools")
        pid = new_prompt_id()
        start = len(recorder.events)
        await worker.turn(host, sid, "tool", prompt_id=pid, model=worker.models[0])
        started = await recorder.wait(
            lambda e: isinstance(e, ToolCallStarted) and e.session_id == sid, after=start
        )
        assert isinstance(started, ToolCallStarted)
        await recorder.wait(
            lambda e: isinstance(e, ToolCallEnded) and e.session_id == sid and e.call_id == started.call_id,
            after=start,
        )
        ended = recorder.events.index(
            next(e for e in recorder.events[start:] if isinstance(e, ToolCallEnded) and e.session_id == sid)
        )
        await recorder.wait(lambda e: is_idle(e, sid), after=ended)
        answers = [m for m in await host.messages(sid) if m.parent_id == pid]
        # two assistant messages answer one prompt: the first completed one is not the end of the turn
        assert len(answers) == 2 and all(m.completed and m.output > 0 for m in answers)

    async def test_a_rate_limit_shows_as_retry_then_a_classifiable_429_then_idle(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "limited")
        start = len(recorder.events)
        await worker.turn(host, sid, "rate-limit", prompt_id=new_prompt_id())
        await recorder.wait(
            lambda e: isinstance(e, SessionStatusChanged) and e.session_id == sid and e.status == "retry",
            after=start,
        )
        error = await recorder.wait(
            lambda e: isinstance(e, SessionError) and e.session_id == sid, after=start
        )
        assert isinstance(error, SessionError) and error.error["statusCode"] == 429
        verdict = classify(error.error, "session-error", datetime.now(UTC))
        assert verdict is not None and verdict.kind == "rate-limit", verdict
        await recorder.wait(lambda e: is_idle(e, sid), after=recorder.events.index(error))
        await self._status_becomes(host, sid, "idle", recorder)

    async def test_an_error_the_host_does_not_retry_ends_the_turn_idle(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "error")
        start = len(recorder.events)
        await worker.turn(host, sid, "error", prompt_id=new_prompt_id())
        error = await recorder.wait(
            lambda e: isinstance(e, SessionError) and e.session_id == sid, after=start
        )
        assert isinstance(error, SessionError) and error.error["statusCode"] == 400
        assert classify(error.error, "session-error", datetime.now(UTC)) is None  # not a provider limit
        retries = [
            e for e in recorder.events[start:] if isinstance(e, SessionStatusChanged) and e.status == "retry"
        ]
        assert retries == []
        await recorder.wait(lambda e: is_idle(e, sid), after=recorder.events.index(error))

    # -- fencing by message id -------------------------------------------------------------------------

    async def test_already_sent_is_decided_by_the_prompts_own_id_after_any_burst(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "fence")
        first = new_prompt_id()
        ids = [first] + [new_prompt_id() for _ in range(21)]  # more than a window of the newest 20
        for pid in ids:
            start = len(recorder.events)
            await worker.turn(host, sid, "answer", prompt_id=pid)
            await recorder.wait(_answered(pid), after=start)
            await recorder.wait(lambda e: is_idle(e, sid), after=start)
        await self._status_becomes(host, sid, "idle", recorder)
        receipt = await host.prompt(sid, "a resend after a crash", prompt_id=first)
        assert receipt.prompt_id == first
        users = [m.message_id for m in await host.messages(sid, limit=1000) if m.role == "user"]
        assert users.count(first) == 1 and users[-1] == ids[-1]  # not sent again
        assert await host.session_status(sid) == "idle"  # and nothing started

    # -- switches -------------------------------------------------------------------------------------

    async def test_a_switch_is_validated_and_lands_at_once_or_with_the_next_prompt(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "switch")
        main, other = worker.models
        result = await host.switch_model(sid, other)
        assert result in ("applied", "next-prompt")
        live = await host.session_identity(sid)
        assert live.model == (other if result == "applied" else main)
        with pytest.raises(HostRejectedError):
            await host.switch_model(sid, "nope/never")
        with pytest.raises(HostRejectedError):
            await host.switch_agent(sid, "no-such-agent")
        with pytest.raises(HostRejectedError):
            await host.prompt(sid, "x", model="nope/never", prompt_id=new_prompt_id())
        with pytest.raises(SessionNotFoundError):
            await host.switch_model("ses_doesnotexist", other)
        # the identity rides on the prompt that names it, and the model stays for prompts that name none
        for pid, model, agent in (
            (new_prompt_id(), other, worker.agents[1]),
            (new_prompt_id(), None, worker.agents[1]),
        ):
            start = len(recorder.events)
            await worker.turn(host, sid, "answer", prompt_id=pid, model=model, agent=agent)
            await recorder.wait(lambda e: is_idle(e, sid), after=start)
            live = await host.session_identity(sid)
            assert (live.model, live.agent) == (other, worker.agents[1])

    # -- holds ----------------------------------------------------------------------------------------

    async def test_a_held_prompt_reaches_the_host_only_when_released(
        self, host: EngineHost, worker: ContractWorker, recorder: Recorder
    ) -> None:
        sid = await self._session(host, worker, recorder, "held")
        held = HeldHost(host)
        held.holds.hold("prompt")
        pid, cancelled = new_prompt_id(), new_prompt_id()
        scope = anyio.CancelScope()  # a held call that is cancelled never reaches the host

        async def cancel_me() -> None:
            with scope:
                await held.prompt(sid, "never", prompt_id=cancelled)

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_me)
            with anyio.fail_after(10):
                await held.holds.wait_held("prompt")
            scope.cancel()
            tg.start_soon(lambda: worker.turn(held, sid, "answer", prompt_id=pid))
            with anyio.fail_after(10):
                await held.holds.wait_held("prompt")
            assert await held.session_status(sid) == "idle"  # other calls go through
            assert pid not in [m.message_id for m in await host.messages(sid)]
            start = len(recorder.events)
            held.holds.release("prompt")
        await recorder.wait(_answered(pid), after=start)
        users = [m.message_id for m in await host.messages(sid) if m.role == "user"]
        assert pid in users and cancelled not in users


def _answered(prompt_id: str) -> Callable[[AnyHostEvent], bool]:
    """Matches the completed assistant message answering ``prompt_id``."""

    def match(event: AnyHostEvent) -> bool:
        return (
            isinstance(event, MessageUpdated)
            and event.message.parent_id == prompt_id
            and event.message.completed
        )

    return match
