"""Comparing a re-made decision with the recorded one, and saying both in words.

A decision is the events one decider appended together (:class:`Step`: the head event and its tail). The
first field that differs is named; a difference is classed by what it does to the goal (it stops earlier,
runs longer than the log can tell, or otherwise differs).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, ClassVar, Final, Literal

import msgspec

from ..clock import stamp, stamped_builtins
from ..events import goal as g
from ..events import identity as i
from ..events import run as r
from ..events.base import Event
from ..events.envelope import Envelope

Outcome = Literal["stops_earlier", "runs_longer", "differs"]

_REDACTED_TEXT: Final = re.compile(r"\[text: (\d+) chars, sha256 ([0-9a-f]{8,64})\]")
"""How a bundle redacts a text (:mod:`loopd_es.postmortem.redact`): its length and a hash prefix."""

_STOPS: Final = (g.GoalBlocked, g.GoalBudgetExhausted, g.GoalForceFinishRequested)


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """The first recorded decision the deciders would make differently."""

    position: int
    version: int
    event_type: str
    field: str
    recorded: Any
    replayed: Any
    outcome: Outcome
    instead: str
    """``would ... where the log recorded ...``: both decisions in words."""
    grace_turns: int = 0
    """Turns that would still run before the stop: 1 for a force-finish (its wrap-up turn)."""


class Refused(Event, frozen=True):
    """Stands for a decision the deciders refuse (a rule error): compared like an event, never recorded."""

    event_type: ClassVar[str] = "refused"
    reason: str


class Step(msgspec.Struct, frozen=True, kw_only=True):
    env: Envelope
    event: Event
    tail: tuple[tuple[Envelope, Event], ...]
    occurred_at: str | None = None
    """Set on an event ``import-loopd`` transcribed: when opencode-loopd recorded it (the decision was its own)."""
    correction: bool = False
    """An event the import synthesised from loopd's ``state.json`` (no ledger line): a state, not a decision."""


_DECISION_FIELDS: Final[dict[type[Event], tuple[str, ...]]] = {
    r.RunStarted: ("turn_count", "charged", "kind"),
    r.RunFailed: ("consecutive_failures", "retry_after"),
    g.GoalCompletionRejected: ("rejection_count", "free_retry"),
    g.GoalForceFinishRequested: ("reason",),
    i.FallbackPrepared: ("model", "attempted"),
    i.FallbackExhausted: ("attempted",),
    r.RunFellBack: ("to_model",),
    g.GoalCompleted: ("forced",),
}
"""For a decision opencode-loopd made (an imported event), the fields that say what was decided; the rest are
its own bookkeeping (run generations, leases from its clock, its wording of a block reason)."""


_WHO_ASKED: Final = frozenset({"called_by"})
"""Fields that record who made the request (a tool call's session, message and call ids): the deciders never
produce them, so a replay does not compare them."""

# -- comparing ---------------------------------------------------------------------------------------------


def compare(step: Step, decided: list[Event]) -> Divergence | None:
    recorded = [step.event, *(t for _, t in step.tail)]
    for mine, theirs in zip(decided, recorded, strict=False):
        if type(mine) is not type(theirs):
            return _differ(step, "type", theirs.event_type, mine.event_type, decided, recorded)
        a, b = msgspec.structs.asdict(theirs), msgspec.structs.asdict(mine)
        if step.occurred_at is not None:
            a = {k: v for k, v in a.items() if k in _DECISION_FIELDS.get(type(theirs), ())}
        for name, value in a.items():
            if name in _WHO_ASKED:
                continue  # who asked is a fact of the request, not of the decision
            if b.get(name) != value and not _same_text(value, b.get(name)):
                return _differ(step, f"{theirs.event_type}.{name}", value, b.get(name), decided, recorded)
    if len(decided) != len(recorded):
        return _differ(
            step,
            "events",
            [e.event_type for e in recorded],
            [e.event_type for e in decided],
            decided,
            recorded,
        )
    return None


def _same_text(recorded: Any, replayed: Any) -> bool:
    """A bundle's redacted text (``[text: N chars, sha256 H]``) stands for the text of that length and hash:
    ``replay --check`` and ``whatif`` on a bundle compare a re-made text with it, not with its placeholder."""
    if not isinstance(recorded, str) or not isinstance(replayed, str):
        return False
    m = _REDACTED_TEXT.fullmatch(recorded)
    return (
        m is not None
        and int(m[1]) == len(replayed)
        and hashlib.sha256(replayed.encode()).hexdigest()[: len(m[2])] == m[2]
    )


def _differ(
    step: Step, field: str, was: Any, now: Any, decided: list[Event], recorded: list[Event]
) -> Divergence:
    stop_now = any(isinstance(e, _STOPS) for e in decided) or _final_failure(decided)
    stop_then = any(isinstance(e, _STOPS) for e in recorded) or _final_failure(recorded)
    outcome: Outcome = (
        "stops_earlier"
        if stop_now and not stop_then
        else "runs_longer"
        if stop_then and not stop_now
        else "differs"
    )
    tail = "; the log has no observations past here" if outcome == "runs_longer" else ""
    wrapup = any(isinstance(e, g.GoalForceFinishRequested) for e in decided)
    return msgspec.structs.replace(
        divergence(
            step,
            field,
            was,
            now,
            outcome,
            f"would {describe(decided)} where the log recorded: {describe(recorded)}{tail}",
        ),
        grace_turns=int(wrapup and outcome == "stops_earlier"),
    )


def _final_failure(events: list[Event]) -> bool:
    return any(isinstance(e, r.RunFailed) and e.retry_after is None for e in events)


def divergence(step: Step, field: str, was: Any, now: Any, outcome: Outcome, instead: str) -> Divergence:
    return Divergence(
        position=step.env.position,
        version=step.env.version,
        event_type=step.env.type,
        field=field,
        recorded=stamped_builtins(was),
        replayed=stamped_builtins(now),
        outcome=outcome,
        instead=instead,
    )


def describe(events: list[Event]) -> str:
    """The decision in words: its last meaningful event first (a stop says more than the run's end)."""
    if not events:
        return "do nothing here"
    words = [_word(e) for e in events]
    return "; ".join(w for w in words if w) or "continue"


def _word(e: Event) -> str:
    match e:
        case g.GoalForceFinishRequested():
            return f"ask for one wrap-up turn ({e.reason}), then stop"
        case g.GoalBlocked():
            return f"block the goal ({e.reason.splitlines()[0]})"
        case g.GoalBudgetExhausted():
            return f"stop the goal ({e.reason})"
        case r.RunFailed():
            wait = f", retry at {stamp(e.retry_after)}" if e.retry_after else ""
            return f"count failure {e.consecutive_failures}{wait}"
        case r.RunStarted():
            return f"start turn {e.turn_count} ({e.kind}{'' if e.charged else ', free'})"
        case r.RunCompleted():
            return "end the turn"
        case g.GoalCompletionRejected():
            free = "a free retry" if e.free_retry else "no free retry"
            return f"reject completion #{e.rejection_count} ({free})"
        case i.ProviderLimitObserved():
            return ""
        case Refused():
            return f"refuse it ({e.reason})"
        case i.FallbackPrepared():
            return f"fall back to {e.model}"
        case i.FallbackExhausted():
            return "find no fallback model left"
        case r.RunFellBack():
            return f"end the turn to continue on {e.to_model}"
        case _:
            return e.event_type
