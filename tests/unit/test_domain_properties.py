"""Hypothesis properties of the goal fold and deciders.

- fold never raises on arbitrary schema-valid event sequences;
- fold(all) == fold(snapshot) + fold(tail), with the snapshot through its msgpack encoding;
- folding in batches (as a replay does) == evolving one event or envelope at a time;
- decide-then-evolve keeps the invariants: never a pending pair beside a pending single switch;
  ``config.model`` changes only with ``identity.switch_applied``; a fallback model is never prepared twice;
  a completed goal never switches.
"""

from __future__ import annotations

import random
import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd_es.domain import goal_commands as c
from loopd_es.domain.evolve import GoalFold, evolve, fold, initial
from loopd_es.domain.state import MAX_ACCOUNTED_IDS, GoalState
from loopd_es.errors import DomainError
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r
from loopd_es.events.base import CATALOGUE, Event
from loopd_es.events.envelope import Envelope

from .._profiles import scaled
from ._domain_harness import OWNER, Goal

_NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
GOAL_TYPES = [cls for t, cls in sorted(CATALOGUE.items()) if t.split(".")[0] in ("goal", "run", "identity")]


def _for_type(tp: Any, name: str) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if name == "goal_id":
        return st.sampled_from(["g1", "g1", "g1", "g2"])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_for_type(a, name) for a in args])
    if origin is tuple:
        return st.lists(_for_type(args[0], name), max_size=3).map(tuple)
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 6)
    if tp is float:
        return st.floats(0, 10, allow_nan=False)
    if tp is str:
        return st.sampled_from(["a", "b", "r1", "p/old", "p/new", "2026-12-02T12:00:00.000Z"])
    if tp is datetime:  # a payload time: UTC, finer than a millisecond, or another offset of the same instant
        return st.sampled_from(
            [_NOON, _NOON.replace(microsecond=123456), _NOON.astimezone(timezone(timedelta(hours=2)))]
        )
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _struct(tp)
    if origin is dict:  # goal.forked_from's state: a source's snapshot, or one that does not read
        return st.sampled_from([{}, {"goal_id": "g0", "exists": True, "tokens_used": 3}, {"goal_id": 1}])
    raise AssertionError(f"no strategy for {tp!r}")


def _struct(cls: type[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _for_type(hints[f.name], f.name) for f in msgspec.structs.fields(cls)}
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


event_st = st.one_of(*[_struct(cls) for cls in GOAL_TYPES])
events_st = st.lists(event_st, max_size=40)
created = g.GoalCreated(goal_id="g1", name="n", objective="o", owner_session_id=OWNER)


@given(events_st)
@settings(max_examples=scaled(300))
def test_fold_never_raises(events: list[Event]) -> None:
    state = fold([created, *events], initial("g1"))
    assert isinstance(state, GoalState)
    assert state.anomaly_count >= len([e for e in events if getattr(e, "goal_id", None) == "g2"])


@given(events_st, st.integers(0, 40))
@settings(max_examples=scaled(200))
def test_snapshot_plus_tail_equals_full_fold(events: list[Event], cut: int) -> None:
    seq = [created, *events]
    cut = min(cut, len(seq))
    snap = msgspec.msgpack.encode(fold(seq[:cut], initial("g1")))
    restored = msgspec.msgpack.decode(snap, type=GoalState)
    assert fold(seq[cut:], restored) == fold(seq, initial("g1"))


def _envelope(version: int, type_: str, data: bytes, schema_version: int = 1) -> Envelope:
    return Envelope(
        position=version + 100,
        stream="goal-g1",
        version=version,
        event_id=f"e{version}",
        type=type_,
        schema_version=schema_version,
        recorded_at="2026-12-02T12:00:00Z",
        causation_id=None,
        correlation_id=None,
        data=msgspec.Raw(data),
    )


def _stored(k: int, e: Event) -> Envelope:
    return _envelope(k, e.event_type, msgspec.json.encode(e), e.schema_version)


@given(events_st, st.lists(st.integers(0, 41), max_size=4), st.integers(0, 3))
@settings(max_examples=scaled(200))
def test_batched_fold_equals_evolving_one_at_a_time(
    events: list[Event], cuts: list[int], stored: int
) -> None:
    seq = [created, *events]
    items: list[Event | Envelope] = [_stored(k + 1, e) if (k + stored) % 3 else e for k, e in enumerate(seq)]
    one_by_one = initial("g1")
    for item in items:
        one_by_one = evolve(one_by_one, item)
    folding = GoalFold(initial("g1"))
    bounds = sorted({0, len(items), *(min(c, len(items)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        folding.apply(items[lo:hi])
        assert folding.result() == fold(items[:hi], initial("g1"))  # a result midway changes nothing
    assert folding.result() == one_by_one == fold(items, initial("g1"))


_ODD_ROWS = st.sampled_from(
    [
        ("goal.progress", 1, b'{"goal_id":"g1","summary":3}'),  # does not decode
        ("goal.progress", 1, b"not json"),
        ("goal.paused", 99, b'{"goal_id":"g1"}'),  # a schema version the catalogue does not know
        ("command.started", 1, b'{"command_id":"c"}'),  # not a goal event
        ("goal.paused", 1, b'{"goal_id":"g2"}'),  # another goal's
    ]
)


@given(
    st.lists(st.one_of(event_st, _ODD_ROWS), max_size=40),
    st.lists(st.integers(0, 41), max_size=4),
    st.integers(0, 5),
    st.booleans(),
)
@settings(max_examples=scaled(200))
def test_folding_rows_equals_folding_envelopes(
    mixed: list[Event | tuple[str, int, bytes]], cuts: list[int], first: int, create: bool
) -> None:
    """A replay of one stream folds (type, schema version, payload) rows a batch at a time
    (``GoalFold.apply_rows``); the state, version, position and anomalies (with their versions) are the ones
    the same events give as envelopes, from any starting version, with or without the goal created."""
    rows = [
        (e.event_type, e.schema_version, msgspec.json.encode(e)) if isinstance(e, Event) else e for e in mixed
    ]
    if create:
        rows.insert(0, (created.event_type, 1, msgspec.json.encode(created)))
    start = fold([_stored(k + 1, created) for k in range(first)], initial("g1")) if first else initial("g1")
    envelopes = [_envelope(start.version + k + 1, t, d, sv) for k, (t, sv, d) in enumerate(rows)]
    expected = fold(envelopes, start)
    folding = GoalFold(start)
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        folding.apply_rows(start.version + lo + 1, rows[lo:hi], envelopes[hi - 1].position)
    assert folding.result() == expected


def test_usage_watermark_keeps_the_last_ids_across_long_folds() -> None:
    rand = random.Random(20261202)
    events: list[Event] = [created]
    accounted: list[str] = []
    tokens = refused = 0
    for _ in range(3 * MAX_ACCOUNTED_IDS):  # ids come back after they leave the watermark, and while in it
        ids = tuple(f"m{rand.randrange(400)}" for _ in range(rand.choice([0, 1, 1, 1, 2, 3])))
        events.append(g.GoalUsageAccounted(goal_id="g1", message_ids=ids, token_delta=1))
        fresh = [m for m in dict.fromkeys(ids) if m not in accounted]
        if fresh and len(fresh) == len(ids):
            accounted = (accounted + fresh)[-MAX_ACCOUNTED_IDS:]
            tokens += 1
        else:
            refused += 1
    state = fold(events, initial("g1"))
    assert state.accounted_message_ids == tuple(accounted)
    assert (state.tokens_used, state.anomaly_count) == (tokens, refused)
    one_by_one = initial("g1")
    for e in events:
        one_by_one = evolve(one_by_one, e)
    assert one_by_one == state
    halves = fold(events[400:], fold(events[:400], initial("g1")))
    assert halves == state


def test_unreadable_envelopes_are_anomalies_at_their_version() -> None:
    envelopes = [
        _stored(1, created),
        _envelope(2, "run.started", b"{not json"),
        _envelope(3, "run.completed", b'{"goal_id": 1, "run_id": "r"}'),
        _envelope(4, "goal.exploded", b"{}"),
        _envelope(5, "goal.paused", b'{"goal_id": "g1"}', schema_version=9),
    ]
    state = fold(envelopes, initial("g1"))
    assert [a.version for a in state.anomalies] == [2, 3, 4, 5]
    assert "invalid payload for run.started" in state.anomalies[0].reason
    assert "`$.goal_id`" in state.anomalies[1].reason
    assert (state.version, state.position, state.status) == (5, 105, "active")
    one_by_one = initial("g1")
    for env in envelopes:
        one_by_one = evolve(one_by_one, env)
    assert one_by_one == state


# -- decide-then-evolve invariants -------------------------------------------------------------------------

MODELS = ["p/old", "p/new", "p/last", "p/four"]
FALLBACKS = ("p/new", "p/last", "p/four")


def _command(draw: Any, goal: Goal) -> Any:
    kind = draw(
        st.sampled_from(
            [
                "turn",
                "idle",
                "switch",
                "outcome",
                "pending",
                "observe",
                "fail",
                "pause",
                "resume",
                "retry",
                "complete",
                "force_complete",
                "block",
            ]
        )
    )
    gid = "g1"
    n = goal.next_id("x")
    if kind == "turn":
        return c.StartRun(goal_id=gid, run_id=n, prompt_message_id=f"msg_{n}")
    if kind == "idle":
        return c.ConfirmIdle(
            goal_id=gid, run_id=goal.state.active_run_id or "none", generation=goal.state.run_generation
        )
    if kind == "switch":
        model = draw(st.sampled_from([None, *MODELS]))
        agent = draw(st.sampled_from([None, "old", "new"]))
        return c.SwitchIdentity(
            goal_id=gid, switch_id=n, caller=OWNER, model=model, agent=agent, resume=draw(st.booleans())
        )
    if kind == "outcome":
        flight = goal.state.switch_in_flight
        results = st.sampled_from(["applied", "next-prompt", "rejected", "unsupported"])
        return c.RecordSwitchOutcome(
            goal_id=gid,
            switch_id=flight.switch_id if flight else n,
            model_result=draw(results),
            agent_result=draw(st.none() | results),
            rolled_back=draw(st.sampled_from([None, True, False])),
        )
    if kind == "pending":
        return c.ApplyPendingSwitch(goal_id=gid, switch_id=n)
    if kind == "observe":
        return c.ObserveProviderError(
            goal_id=gid,
            error={"statusCode": 429},
            error_text=goal.state.last_error or "e",
            source=draw(st.sampled_from(["session-error", "prompt-delivery"])),
            expected_model=draw(st.sampled_from([None, *MODELS])),
        )
    if kind == "fail":
        return c.RecordRunFailure(goal_id=gid, error_text="e")
    if kind == "pause":
        return c.PauseGoal(goal_id=gid)
    if kind == "resume":
        return c.ResumeGoal(goal_id=gid)
    if kind == "retry":
        return c.RetryGoal(goal_id=gid)
    if kind == "complete":
        return c.CompleteGoal(
            goal_id=gid,
            summary="s",
            evidence="e",
            attempt_id=n,
            check_results=(c.CheckResult(command="t", exit_code=draw(st.sampled_from([0, 1]))),),
        )
    if kind == "force_complete":
        return c.ForceComplete(goal_id=gid)
    return c.ForceBlock(goal_id=gid)


@st.composite
def _scenario(draw: Any) -> tuple[Goal, list[tuple[Any, list[Event], GoalState, GoalState]]]:
    goal = Goal()
    usable = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1))
    catalog = c.ModelCatalog(models={m: c.ModelInfo(usable=m in usable) for m in MODELS})
    at_creation = {**catalog.models, "p/old": c.ModelInfo(usable=True)}  # an unusable one is refused (#22.9)
    goal.facts = msgspec.structs.replace(goal.facts, model_catalog=c.ModelCatalog(models=at_creation))
    goal.create(
        model="p/old",
        agent="old",
        workspace_write=False,
        fallback_models=tuple(m for m in FALLBACKS if m in usable),
    )
    goal.facts = msgspec.structs.replace(goal.facts, model_catalog=catalog)
    goal.apply(g.GoalWorkerAssigned(goal_id="g1", worker_session_id="W"))
    steps = []
    for _ in range(draw(st.integers(1, 40))):
        command = _command(draw, goal)
        status = draw(st.sampled_from(["idle", "idle", "busy"]))
        before = goal.state
        try:
            events = goal.do(command, worker_status=status)
        except DomainError:
            events = []
        steps.append((command, events, before, goal.state))
    return goal, steps


@given(_scenario())
@settings(max_examples=scaled(300))
def test_decide_then_evolve_keeps_the_invariants(scenario: Any) -> None:
    goal, steps = scenario
    prepared: list[str] = []
    for command, events, before, after in steps:
        assert not (after.pending_identity is not None and (after.model_pending or after.agent_pending)), (
            command
        )
        if after.config.model != before.config.model:
            assert any(isinstance(e, i.IdentitySwitchApplied) for e in events), command
        for e in events:
            if isinstance(e, i.FallbackPrepared) and not e.reused:
                assert e.model not in prepared, f"fallback {e.model} attempted twice"
                prepared.append(e.model)
        if before.status == "complete":
            assert not any(
                isinstance(e, i.IdentitySwitchApplied | i.IdentitySwitchRequested | i.IdentitySwitchDeferred)
                for e in events
            ), command
        assert after.anomaly_count == 0, (command, after.anomalies)
        assert after.budget_turn_count >= before.budget_turn_count
    assert fold(goal.log, initial("g1")) == goal.state


def test_run_events_of_another_generation_are_anomalies_not_crashes() -> None:
    state = fold(
        [created, r.RunStarted(goal_id="g1", run_id="r1", generation=1, prompt_message_id="m", turn_count=1)],
        initial("g1"),
    )
    state = evolve(state, r.RunCompleted(goal_id="g1", run_id="r0", generation=0))
    assert state.phase == "running" and state.anomalies[-1].reason == "stale run"
