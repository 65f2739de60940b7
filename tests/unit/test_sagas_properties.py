"""Random interleavings of switches, busy/idle flips, host failures, provider errors and crashes.

Invariants after every step, for every goal:

- worker idle and no saga open -> the recorded identity is the host's live identity (unless the log says a
  rollback failed, which is exactly the case it must report);
- no fallback model is prepared or applied twice;
- an interactive goal never receives a prompt the engine started on its own;
- the state the live run cached equals the state folded from the log from scratch.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loopd_es.app.crashpoints import Crash, arm
from loopd_es.app.goals import Goals, SwitchFailedError
from loopd_es.app.service import Ctx, GoalService
from loopd_es.clock import FakeClock
from loopd_es.domain.rules import RuleError
from loopd_es.domain.streams import goal_stream
from loopd_es.host.errors import ProviderErrorInfo
from loopd_es.host.sim_script import FailureRule
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import LogStore, open_store

from .._profiles import profile_name, scaled
from ._saga_harness import SCRIPT, T0

MODELS = ("p/old", "p/new", "p/last")
AGENTS = ("old", "new", "last")
ERRORS: tuple[Any, ...] = (
    {"statusCode": 429},
    {"code": "insufficient_quota"},
    {"statusCode": 429, "message": "Rate limit exceeded", "responseHeaders": {"retry-after": "5"}},
    "maximum context length exceeded",
)


class SwitchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._cm = start_blocking_portal()
        self.portal: BlockingPortal = self._cm.__enter__()
        self.dir = tempfile.TemporaryDirectory()
        self.clock = FakeClock(T0)
        self.store: LogStore = self.portal.call(open_store, f"sqlite:{Path(self.dir.name) / 'e.db'}")
        self.host = SimulatedHost(SCRIPT, clock=self.clock)
        self.goals = Goals(GoalService(self.store, self.host, clock=self.clock))
        self.ids: dict[str, str] = {}
        self.sessions: dict[str, str] = {}
        for name, interactive in (("auto", False), ("manual", True)):
            state = self.call(
                self.goals.create,
                name,
                "o",
                Ctx.new(),
                model="p/old",
                agent="old",
                workspace_write=False,
                fallback_models=("p/new", "p/last"),
                interactive=interactive,
            )
            self.ids[name], self.sessions[name] = state.goal_id, state.worker_session_id or ""
        self.manual_prompts = self.prompt_count("manual")

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            try:
                return await fn(*args, **kwargs)
            except Crash as crash:  # a BaseException would tear the portal down: carry it out as a value
                return crash

        result = self.portal.call(run)
        if isinstance(result, Crash):
            raise result
        return result

    def prompt_count(self, name: str) -> int:
        state = self.call(self.host.snapshot)
        return sum(1 for p in state.prompts if p.session_id == self.sessions[name])

    def teardown(self) -> None:
        self.portal.call(self.store.aclose)
        self._cm.__exit__(None, None, None)
        self.dir.cleanup()

    # -- rules ------------------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(["auto", "manual"]),
        model=st.sampled_from((None, *MODELS)),
        agent=st.sampled_from((None, *AGENTS)),
        crash=st.sampled_from((None, None, 1, 3, 5, 8, 12)),
    )
    def switch(self, name: str, model: str | None, agent: str | None, crash: int | None) -> None:
        if model is None and agent is None:
            return
        arm(crash)
        try:
            self.call(self.goals.switch_identity, self.ids[name], Ctx.new(), model=model, agent=agent)
        except Crash:
            self.restart()
        except (RuleError, SwitchFailedError):
            pass
        finally:
            arm(None)

    def restart(self) -> None:
        """The process died: a new one recovers from the log and the host alone."""
        self.goals = Goals(GoalService(self.store, self.host, clock=self.clock))
        self.call(self.goals.recover)

    @rule(name=st.sampled_from(["auto", "manual"]), status=st.sampled_from(("busy", "idle")))
    def flip(self, name: str, status: Any) -> None:
        self.call(self.host.set_status, self.sessions[name], status)

    @rule(name=st.sampled_from(["auto", "manual"]))
    def idle(self, name: str) -> None:
        before = self.prompt_count("manual")
        try:
            self.call(self.goals.idle, self.ids[name], Ctx.new())
        except SwitchFailedError:
            pass
        assert self.prompt_count("manual") == before, "the engine prompted an interactive goal"

    @rule(name=st.sampled_from(["auto", "manual"]), error=st.sampled_from(ERRORS))
    def provider_error(self, name: str, error: Any) -> None:
        before = self.prompt_count("manual")
        self.call(self.goals.observe_error, self.ids[name], error, Ctx.new())
        assert self.prompt_count("manual") == before

    @rule(
        op=st.sampled_from(("switch_model", "switch_agent", "prompt")),
        kind=st.sampled_from(("rejected", "busy", "unavailable")),
    )
    def inject(self, op: str, kind: Any) -> None:
        counters = self.call(self.host.snapshot).counters
        if op == "prompt":
            rule_ = FailureRule(
                op="prompt",
                error="provider",
                on_call=counters.get(op, 0) + 1,
                provider=ProviderErrorInfo(status_code=429),
            )
        else:
            rule_ = FailureRule(op=op, error=kind, on_call=counters.get(op, 0) + 1)  # type: ignore[arg-type]
        self.call(self.host.inject, rule_)

    @rule(name=st.sampled_from(["auto", "manual"]))
    def retry(self, name: str) -> None:
        recorded, turn = self.call(self.goals.retry, self.ids[name], Ctx.new())
        if turn is not None and turn.result == "switch-failed":
            state = self.call(self.goals.service.load, self.ids[name])
            assert state.status == "blocked" and turn.switches and not turn.switches[-1].ok

    @rule(seconds=st.sampled_from((1, 30, 600)))
    def tick(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- invariants -------------------------------------------------------------------------------------

    def _events(self, name: str) -> list[Any]:
        async def read() -> list[Any]:
            return [e async for e in self.store.read_stream(goal_stream(self.ids[name]))]

        return self.portal.call(read)

    @invariant()
    def recorded_identity_is_live_identity(self) -> None:
        for name, gid in self.ids.items():
            state = self.call(self.goals.service.load, gid)
            session = self.sessions[name]
            snap = self.call(self.host.snapshot)
            live = snap.sessions[session]
            if state.switch_in_flight is not None or live.status != "idle":
                continue
            if any(e.type == "identity.rollback_failed" for e in self._events(name)):
                continue
            assert (state.config.model, state.config.agent) == (live.model, live.agent)

    @invariant()
    def no_fallback_twice(self) -> None:
        for name in self.ids:
            prepared: Counter[str] = Counter()
            applied: Counter[str] = Counter()
            for e in self._events(name):
                data = e.data_dict()
                if e.type == "identity.fallback_prepared" and not data.get("reused"):
                    prepared[data["model"]] += 1
                if e.type == "identity.switch_applied" and data.get("reason") == "quota":
                    applied[data["to_model"]] += 1
            assert all(n == 1 for n in prepared.values()) and all(n == 1 for n in applied.values())

    @invariant()
    def interactive_goal_is_never_engine_prompted(self) -> None:
        assert self.prompt_count("manual") == self.manual_prompts + self._explicit_manual_turns()

    def _explicit_manual_turns(self) -> int:
        """Turns of the manual goal after its first whose prompt the host took (all explicit: retry, resume).

        A turn whose prompt the host refused is recorded (``run.started``, then ``run.failed`` with source
        ``prompt-delivery`` naming that run) but never reached the worker, so it is not a prompt received.
        """
        started: list[str] = []
        undelivered: set[str] = set()
        for e in self._events("manual"):
            data = e.data_dict()
            if e.type == "run.started":
                started.append(data["run_id"])
            elif e.type == "run.failed" and data.get("source") == "prompt-delivery":
                undelivered.add(data["run_id"])
        return sum(1 for run_id in started[1:] if run_id not in undelivered)

    @invariant()
    def replay_equals_live(self) -> None:
        from loopd_es.domain.evolve import fold, initial

        for gid in self.ids.values():
            live = self.call(self.goals.service.load, gid)
            events = [e for name in self.ids for e in self._events(name) if e.stream == goal_stream(gid)]
            assert live == fold(events, initial(gid))


SwitchMachine.TestCase.settings = settings(
    max_examples=scaled(50),
    stateful_step_count=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_switch_machine = pytest.mark.timeout(None if profile_name() == "thorough" else 60)(
    SwitchMachine.TestCase
)


# -- sequences hypothesis found, replayed step by step (a state machine takes no ``@example``) ----------------


def _replay(steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run ``steps`` (rule name, arguments) on a fresh machine, checking every invariant after each step."""
    machine = SwitchMachine()
    checks = [
        machine.recorded_identity_is_live_identity,
        machine.no_fallback_twice,
        machine.interactive_goal_is_never_engine_prompted,
        machine.replay_equals_live,
    ]
    try:
        for check in checks:
            check()
        for name, kwargs in steps:
            getattr(machine, name)(**kwargs)
            for check in checks:
                check()
    finally:
        machine.teardown()


_FIVE_429S: list[tuple[str, dict[str, Any]]] = [
    ("provider_error", {"name": "manual", "error": ERRORS[0]})
] * 5


def test_found_a_refused_prompt_is_not_a_prompt_received() -> None:
    """Issue #10.1, first sequence: the model counted a turn whose prompt the host refused (model fixed)."""
    _replay(
        [
            ("idle", {"name": "auto"}),
            ("inject", {"op": "prompt", "kind": "rejected"}),
            *_FIVE_429S,
            ("switch", {"name": "auto", "model": None, "agent": None, "crash": None}),
            ("retry", {"name": "manual"}),
        ]
    )


def test_found_retry_reports_a_refused_pending_switch() -> None:
    """Issue #10.1, second sequence: ``Goals.retry`` raised ``SwitchFailedError`` after recording (code fixed)."""
    _replay(
        [
            ("idle", {"name": "auto"}),
            ("inject", {"op": "switch_model", "kind": "rejected"}),
            *_FIVE_429S,
            ("switch", {"name": "auto", "model": "p/new", "agent": None, "crash": None}),
            ("retry", {"name": "manual"}),
        ]
    )
