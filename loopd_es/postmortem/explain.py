"""Why a goal is in its current status: the causal chain from the event that set the status back to its first cause.

The chain is a walk over ids, never a guess. It starts at the event whose fold last changed ``status`` and steps:

* along ``causation_id`` to the event that caused the current one (looked up in the goal's streams, then, if
  need be, in the whole log);
* for a switch request that applied a *pending* switch, to the event that set that pending switch in the
  folded state (the reducer's own record, :attr:`~loopd_es.postmortem.history.Entry.set_by`): the request's
  causation is only the idle turn that applied it, the pending switch is why there was something to apply.

It ends at a *request* (a causation id equal to its correlation id that names no event: the user or engine
request that started the flow), at an *import* (an event copied from an opencode-loopd project is caused by
what the source shows caused it - a run's start, an owner's control request - and otherwise by
``import.started``, where the source's record of causes ends), or says plainly where a link is missing or
points outside the log. Times are effective times: an imported event's source time. Events that
share the step's causation and correlation ids were written by the same reaction; the telling ones among them
(host refusals, provider limits, rollbacks) are shown beside the step. ``correlation_id`` groups the chain into
flows: every event of a flow is listed, so the user sees what else that request did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import stamp_text
from ..domain.streams import short_id
from ..events.imported import STREAM_PREFIX
from .history import Entry, History, called_by, short_stream, show, summarize
from .who import who_lines

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore

MAX_STEPS: Final = 64
_TELLING: Final = frozenset(
    {
        "saga.host_call_failed",
        "saga.host_call_resolved",
        "identity.provider_limit_observed",
        "identity.switch_rolled_back",
        "identity.rollback_failed",
        "identity.fallback_exhausted",
        "identity.fallback_unsupported",
        "identity.fallback_unavailable",
        "command.exited",
        "command.await-fired",
        "run.failed",
        "goal.budget_exhausted",
    }
)
"""Sibling events worth naming beside a step: what went wrong, or what was observed, in the same reaction."""
_LIMIT_WORDS: Final = {"rate-limit": "rate limit", "quota": "quota"}
_PENDING_FIELD: Final = {
    (True, True): "pending_identity",
    (True, False): "model_pending",
    (False, True): "agent_pending",
}


class Fact(msgspec.Struct, frozen=True):
    """One event as the explanation shows it."""

    position: int
    stream: str
    type: str
    event_id: str
    recorded_at: str
    correlation_id: str | None
    text: str
    at: str = ""
    """When it happened (an imported event's source time), else when it was recorded."""
    origin: str | None = None
    """Where an imported event came from (``ledger line 12``, ``synthesised from state.json (...)``)."""


class Step(msgspec.Struct, frozen=True):
    """One link of the chain: the event, how it was reached (``status``, ``causation`` or ``pending``), and the
    telling events of the same reaction."""

    link: str
    fact: Fact
    with_: tuple[Fact, ...] = msgspec.field(default=(), name="with")
    trigger: str | None = None


class Explanation(msgspec.Struct, frozen=True):
    """The whole answer: status, chain (newest first), how it ends, the flows, and one sentence."""

    goal_id: str
    status: str
    steps: tuple[Step, ...]
    end: str
    end_kind: str  # request | import | missing | outside | cycle | too-long | none
    flows: dict[str, list[int]]
    sentence: str
    who: tuple[str, ...] = ()
    """The tool calls that created, ended and last changed the goal, in words (none from the CLI)."""


async def explain(store: LogStore, history: History) -> Explanation:
    """Walk the chain for the goal of ``history`` (built with ``provenance=True``)."""
    by_id = history.by_id()
    goal = history.goal_id
    status = (
        history.state.status if history.state.exists else ("cleared" if history.state.cleared else "missing")
    )
    start = _status_entry(history)
    if start is None:
        return Explanation(
            goal, status, (), "the goal's stream has no events before the cut", "none", {}, status
        )
    steps: list[Step] = []
    seen: set[str] = set()
    node: Entry | None = start
    link = "status"
    end, end_kind = "", "none"
    while node is not None:
        env = node.envelope
        if env.event_id in seen:
            end, end_kind = f"#{env.position} was reached twice: the causation ids form a cycle", "cycle"
            break
        if len(steps) >= MAX_STEPS:
            end, end_kind = (
                f"the chain is longer than {MAX_STEPS} steps; stopped at #{env.position}",
                "too-long",
            )
            break
        seen.add(env.event_id)
        data = node.data()
        nxt, next_link, trigger = None, "causation", None
        if env.type == "identity.switch_requested" and data.get("pending"):
            field = _PENDING_FIELD.get((data.get("model") is not None, data.get("agent") is not None))
            setter = node.set_by.get(field) if field else None
            if setter is not None:
                nxt, next_link = by_id.get(setter.event_id), "pending"
                trigger = _cause_text(env, by_id)
        if nxt is None:
            nxt, end, end_kind = await _cause(store, env, by_id, goal)
        said_at_end = nxt is None and end_kind == "request" and data.get("called_by")  # not said twice
        steps.append(
            Step(
                link,
                _fact(node, data, by_id, goal, caller=not said_at_end),
                _siblings(node, history, by_id, goal),
                trigger,
            )
        )
        node, link = nxt, next_link
    flows: dict[str, list[int]] = {}
    for step in steps:
        flow = step.fact.correlation_id
        # an import is not a flow of the goal's work: listing it would list every imported event
        if flow is not None and flow not in flows and not flow.startswith(STREAM_PREFIX):
            flows[flow] = [e.position for e in history.entries if e.envelope.correlation_id == flow]
    state = history.state
    acted = {"status": state.status} | {
        key: msgspec.to_builtins(getattr(state, key)) for key in ("created_by", "ended_by", "controlled_by")
    }
    who = tuple(who_lines(acted))
    return Explanation(goal, status, tuple(steps), end, end_kind, flows, _sentence(status, steps, end), who)


def _status_entry(history: History) -> Entry | None:
    """The goal event whose fold last changed ``status`` (or created the goal, when it never changed)."""
    fallback = None
    for entry in reversed(history.entries):
        if not entry.own:
            continue
        fields = {c.field for c in entry.changes}
        if "status" in fields:
            return entry
        if fallback is None and ("exists" in fields or "cleared" in fields):
            fallback = entry
    return fallback


async def _cause(
    store: LogStore, env: Envelope, by_id: dict[str, Entry], goal: str
) -> tuple[Entry | None, str, str]:
    """The entry ``env`` names as its cause, or why the walk ends here."""
    cid = env.causation_id
    if cid is None:
        return (
            None,
            (
                f"#{env.position} {env.type} carries no causation id: the chain cannot be followed further "
                "(written before causation was recorded, imported, or by a writer that does not set it)"
            ),
            "missing",
        )
    if cid in by_id:
        return by_id[cid], "", "none"
    if cid == env.correlation_id:
        who = called_by(env.type, env.data_dict())
        if who is not None:
            return None, f"request {cid}: {who}", "request"
        return (
            None,
            f"request {cid} started this flow (the first cause; a request is not an event in the log)",
            "request",
        )
    found = await _lookup(store, cid)
    if found is not None and found.type == "import.started":
        data = found.data_dict()
        return (
            None,
            f"imported from {data.get('directory')} (state.json revision {data.get('state_revision')}, stream "
            f"{found.stream}); the source records no earlier cause",
            "import",
        )
    if found is not None:
        return Entry(found, own=False), "", "none"
    return None, f"#{env.position} names {cid} as its cause, but no event in the log has that id", "outside"


def _cause_text(env: Envelope, by_id: dict[str, Entry]) -> str | None:
    cid = env.causation_id
    if cid is None:
        return None
    if cid in by_id:
        return f"#{by_id[cid].position} {by_id[cid].envelope.type}"
    return f"request {cid}" if cid == env.correlation_id else cid


async def _lookup(store: LogStore, event_id: str) -> Envelope | None:
    """An event outside the goal's streams, by id: one scan of the log (rare: links normally stay in them)."""
    async for batch in store.read_batches():
        for env in batch:
            if env.event_id == event_id:
                return env
    return None


def _siblings(node: Entry, history: History, by_id: dict[str, Entry], goal: str) -> tuple[Fact, ...]:
    env = node.envelope
    if env.causation_id is None or env.correlation_id is None or env.correlation_id.startswith(STREAM_PREFIX):
        return ()  # imported events share the import as a cause; that does not make them one reaction
    return tuple(
        _fact(e, e.data(), by_id, goal)
        for e in history.entries
        if e.position < env.position
        and e.envelope.type in _TELLING
        and e.envelope.causation_id == env.causation_id
        and e.envelope.correlation_id == env.correlation_id
    )


def _fact(
    entry: Entry, data: dict[str, Any], by_id: dict[str, Entry], goal: str, *, caller: bool = True
) -> Fact:
    env = entry.envelope
    text = phrase(env.type, data, by_id)
    return Fact(
        env.position,
        short_stream(env.stream, goal),
        env.type,
        env.event_id,
        env.recorded_at,
        env.correlation_id,
        _with_caller(text, env.type, data) if caller else text,
        entry.at,
        entry.origin(),
    )


def _with_caller(text: str, type_: str, data: dict[str, Any]) -> str:
    who = called_by(type_, data)
    return f"{text} ({who})" if who else text


def phrase(type_: str, d: dict[str, Any], by_id: dict[str, Entry] | None = None) -> str:
    """What one event means, as a clause of the explanation."""
    get = d.get
    if type_ == "goal.blocked":
        return f"the goal was blocked ({show(get('reason'), 120)})"
    if type_ == "goal.budget_exhausted":
        budget, limit = get("budget"), get("limit")
        if budget == "cost" and limit is not None:
            return f"cost ${get('cost_used', 0.0):.4f} ≥ ${limit:.4f} (the cost budget was spent)"
        if budget == "tokens" and limit is not None:
            return f"tokens {get('tokens_used', 0)} ≥ {int(limit)} (the token budget was spent)"
        return f"a budget was spent: {show(get('reason'), 120)}"
    if type_ == "control.requested":
        return f"the owner asked to {get('command')} (control request {get('request_id')} at {get('at')})"
    if type_ == "goal.paused":
        return "the goal was paused"
    if type_ == "goal.resumed":
        return f"the goal was resumed from {get('from_status')} (by {get('by')})"
    if type_ == "goal.completed":
        return f"the goal was completed{' (forced)' if get('forced') else ''}: {show(get('summary'), 100)}"
    if type_ == "goal.status_changed":
        return f"the status changed from {get('from')} to {get('to')} ({show(get('reason'))})"
    if type_ == "saga.host_call_failed":
        op = str(get("key", "")).rsplit("/", 1)[-1]
        arg = _intended_arg(by_id, get("key")) if by_id else None
        return f"the host refused {op}{f' {arg}' if arg else ''} ({get('reason')})"
    if type_ == "identity.switch_failed":
        pending = "pending " if get("pending") else ""
        return f"the {pending}{get('target')} switch failed at stage {get('stage')} ({get('reason')})"
    if type_ == "identity.switch_requested":
        to = " and ".join(f"{k} {get(k)}" for k in ("model", "agent") if get(k))
        if get("pending"):
            return f"the pending switch to {to} was applied at an idle turn"
        return f"a switch to {to} was requested ({get('reason')})"
    if type_ == "identity.fallback_prepared":
        after = f" after a {_LIMIT_WORDS.get(str(get('limit')), get('limit'))}" if get("limit") else ""
        return f"the fallback to {get('model')} was prepared{after} (models tried: {show(get('attempted'))})"
    if type_ == "run.fell_back":
        limit = _LIMIT_WORDS.get(str(get("kind")), get("kind"))
        return f"the turn ended on a {limit} and the next goes to {get('to_model')} at once (not a failure)"
    if type_ == "identity.provider_limit_observed":
        code = f" (HTTP {get('status_code')})" if get("status_code") else ""
        return f"a {get('kind')}{code} was observed on model {get('model') or '-'} at {stamp_text(str(get('observed_at')))}"
    if type_ == "identity.switch_deferred":
        to = " and ".join(f"{k} {get(k)}" for k in ("model", "agent") if get(k))
        return f"a switch to {to} was deferred until the worker is idle ({get('reason')})"
    if type_ == "run.failed":
        count = get("consecutive_failures")
        return f"a run failed: {show(get('error'), 100)}" + (f" ({count} in a row)" if count else "")
    if type_ == "run.started":
        return f"turn {get('turn_count')} started"
    if type_ == "goal.created":
        return f"the goal {show(get('name'))} was created"
    if type_ == "command.exited":
        return f"the command ended ({get('status')}, {get('end_reason')}, exit code {show(get('exit_code'))})"
    summary = summarize(type_, d)
    return f"{type_}" + (f" ({summary})" if summary else "")


def _intended_arg(by_id: dict[str, Entry], key: Any) -> str | None:
    for entry in by_id.values():
        if entry.envelope.type == "saga.host_call_intended":
            data = entry.data()
            if data.get("key") == key:
                return str(data.get("arg"))
    return None


_CONNECT: Final = {"causation": "← ", "pending": "← (the pending switch was set when) "}


def _sentence(status: str, steps: list[Step], end: str) -> str:
    """``blocked, because A when B ← C ← (the pending switch was set when) D ← ... ← request R``."""
    parts = []
    for k, step in enumerate(steps):
        clause = step.fact.text
        if step.with_:
            clause += " when " + " and ".join(f.text for f in step.with_)
        parts.append(clause if k == 0 else f"{_CONNECT.get(step.link, '← ')}{clause}")
    text = f"{status}, because " + " ".join(parts) if parts else status
    return text + (f" ← end of the chain: {end}." if end else ".")


# -- output -------------------------------------------------------------------------------------------


def render_text(x: Explanation) -> list[str]:
    """The explanation for a terminal: the sentence, then the chain step by step, then the flows."""
    lines = [f"goal {x.goal_id} is {x.status}", "", x.sentence, ""]
    if x.who:
        lines += [*x.who, ""]
    label = {"status": "status set by", "causation": "caused by", "pending": "pending switch set by"}
    for step in x.steps:
        f = step.fact
        flow = f"  [flow {short_id(f.correlation_id)}]" if f.correlation_id else ""
        lines.append(
            f"{label.get(step.link, step.link):>22}  #{f.position} {f.type} ({f.stream}, {f.at or f.recorded_at})"
            f"{flow}"
        )
        lines.append(f"{'':24}{f.text}")
        if f.origin:
            lines.append(f"{'':24}[{f.origin}]")
        lines += [f"{'':24}when #{s.position} {s.type}: {s.text}" for s in step.with_]
        if step.trigger:
            lines.append(f"{'':24}(applied by the turn started from {step.trigger})")
    if x.end:
        lines.append(f"{'end of chain':>22}  {x.end}")
    if x.flows:
        lines.append("")
        for flow, positions in x.flows.items():
            shown = ", ".join(f"#{p}" for p in positions[:12]) + (", ..." if len(positions) > 12 else "")
            lines.append(f"flow {short_id(flow)}: {len(positions)} events ({shown})")
    return lines


def to_json(x: Explanation) -> dict[str, Any]:
    """The explanation as one JSON document."""
    result: dict[str, Any] = msgspec.to_builtins(x)
    return result
