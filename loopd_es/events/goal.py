"""Goal events: the lifecycle of one goal, recorded on its stream ``goal-<goal_id>``.

Type strings follow the reference ledger (``events.ndjson``) where it has one (``goal.created``,
``goal.status_changed``, ``goal.progress``, ``goal.completed``, ``goal.blocked``, ``goal.cleared``,
``goal.completion_rejected``, ``goal.interactive_changed``); the rest name facts the reference kept only
in ``state.json``. Payload keys are snake_case (``goal_id`` for the reference's ``goalID``): the JSON key is
the Python attribute name, except ``from``/``to`` (Python keywords, attributes ``from_status``/``to_status``).

Each decision is one fact: ``goal.paused`` *is* the status change to ``paused`` (with its lease release),
so it is not followed by a ``goal.status_changed``. ``goal.status_changed`` records the transitions that
have no fact of their own (the budget stop) and is what a reference ledger line folds into.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .base import Caller, Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc

GoalStatus = Literal["active", "paused", "blocked", "budget_limited", "usage_limited", "complete"]
"""The reference's six statuses; ``usage_limited`` is declared but never produced.

docs/reference/loopd.md#s2-1 says when each is entered and left.
"""

WorkerTopology = Literal["v1-child", "v2-native-child", "v2-root-fallback"]


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """Re-run a completed goal every ``every_ms`` (>= 1000); ``max_runs`` counts the initial run."""

    every_ms: int
    max_runs: int | None = None


class GoalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The whole goal configuration as resolved at creation (docs/reference/loopd.md#s1-2)."""

    model: str | None = None
    agent: str | None = None
    fallback_models: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    check_cwd: str | None = None
    workspace_write: bool = True
    schedule: Schedule | None = None
    interactive: bool = False
    max_turns: int | None = 50
    max_failures: int | None = None
    max_evaluator_rejections: int | None = None
    max_no_progress: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None
    compact_every: int | None = None
    timeout_ms: int | None = None
    progress_file: str | None = None
    artifact_dir: str | None = None
    prompt_file: str | None = None
    include_files: tuple[str, ...] = ()
    """``promptFile``/``includeFiles``: declared by loopd, read by nothing there
    (docs/reference/loopd.md#s1-2); kept as given."""


@event("goal.created", version=3)
class GoalCreated(Event, frozen=True):
    """A goal was accepted: name, objective, owner and its whole resolved configuration.

    Version 2 nests the configuration in ``config``; version 1 (``name, objective, owner_session_id`` and
    flat ``model``/``agent``/``checks``/``max_turns``) is upcast on read.
    """

    goal_id: str
    name: str
    objective: str
    owner_session_id: str
    config: GoalConfig = GoalConfig()
    parent_model: str | None = None
    parent_agent: str | None = None
    at: UtcTime | None = None
    called_by: Caller | None = None


@event("goal.worker_assigned")
class GoalWorkerAssigned(Event, frozen=True):
    """The worker session that does the goal's work was created (or reattached)."""

    goal_id: str
    worker_session_id: str
    topology: WorkerTopology | None = None
    native_parent_id: str | None = None
    forked_from_session_id: str | None = None
    """For a forked goal: the worker session it was copied from (``None`` for a new worker)."""
    fork_method: Literal["fork", "primed", "new"] | None = None
    """How a forked goal's worker was made: the host forked the session at the matching message, a new
    session was primed with the transcript up to it, or a new session was started (no message yet)."""
    kept_messages: int | None = None
    """How many of the source session's messages the forked worker starts with."""


@event("goal.status_changed")
class GoalStatusChanged(Event, frozen=True):
    """A status transition with no fact of its own (budget stop, or a reference ledger line)."""

    goal_id: str
    from_status: GoalStatus = msgspec.field(name="from")
    to_status: GoalStatus = msgspec.field(name="to")
    reason: str | None = None


@event("goal.paused")
class GoalPaused(Event, frozen=True):
    """The owner paused an active goal: lease released, run cleared, worker session kept."""

    goal_id: str
    cancelled_awaits: int = 0
    called_by: Caller | None = None


@event("goal.resumed")
class GoalResumed(Event, frozen=True):
    """The owner resumed a parked goal (or a switch with ``resume`` did); counters are not reset."""

    goal_id: str
    from_status: GoalStatus = "paused"
    by: Literal["owner", "switch", "schedule"] = "owner"
    called_by: Caller | None = None


@event("goal.retried")
class GoalRetried(Event, frozen=True):
    """The owner retried a blocked goal: failure, rejection and force-finish counters reset."""

    goal_id: str
    called_by: Caller | None = None


@event("goal.cleared")
class GoalCleared(Event, frozen=True):
    """The goal was removed; nothing may apply to it afterwards."""

    goal_id: str
    called_by: Caller | None = None


@event("goal.progress", version=2)
class GoalProgressReported(Event, frozen=True):
    """The worker reported progress: failure and no-progress counters reset."""

    goal_id: str
    summary: str
    next: str | None = None
    evidence: str | None = None
    at: UtcTime | None = None
    called_by: Caller | None = None


class CheckFailure(msgspec.Struct, frozen=True, kw_only=True):
    """One failing completion check (stdout/stderr already cut to 1000 characters)."""

    command: str
    exit_code: int
    stderr: str | None = None
    stdout: str | None = None


@event("goal.completion_rejected")
class GoalCompletionRejected(Event, frozen=True):
    """``complete_goal`` ran the checks and at least one failed; below the limit the next turn is free."""

    goal_id: str
    attempt_id: str
    rejection_count: int
    failed_check_count: int
    failure_summary: str
    details: str = ""
    failures: tuple[CheckFailure, ...] = ()
    cwd: str | None = None
    free_retry: bool = True
    called_by: Caller | None = None


@event("goal.completed", version=2)
class GoalCompleted(Event, frozen=True):
    """The goal is complete: verified by its checks, or forced by the owner (``forced``)."""

    goal_id: str
    summary: str
    evidence: str
    forced: bool = False
    next_run_at: UtcTime | None = None
    at: UtcTime | None = None
    called_by: Caller | None = None


BlockerKind = Literal["provider-limit"]


@event("goal.blocked", version=2)
class GoalBlocked(Event, frozen=True):
    """The goal needs its owner: ``reason`` says why, ``needed`` what to do."""

    goal_id: str
    reason: str
    needed: str
    kind: BlockerKind | None = None
    source: str | None = None
    last_error: str | None = None
    at: UtcTime | None = None
    failures: int | None = None
    """The consecutive failures that blocked it (session errors), as the owner is told them."""
    called_by: Caller | None = None


@event("goal.interactive_changed")
class GoalInteractiveChanged(Event, frozen=True):
    """Manual mode turned on (the engine starts no turns of its own) or off."""

    goal_id: str
    interactive: bool
    called_by: Caller | None = None


@event("goal.usage_accounted")
class GoalUsageAccounted(Event, frozen=True):
    """Completed assistant messages were counted; ``message_ids`` makes accounting idempotent."""

    goal_id: str
    message_ids: tuple[str, ...]
    token_delta: int = 0
    cost_delta: float = 0.0
    time_delta_seconds: float = 0.0


@event("goal.input_queued", version=2)
class GoalInputQueued(Event, frozen=True):
    """A message was put in the goal's inbox; it stays there until a ``goal.input_delivered`` names it."""

    goal_id: str
    input_id: str
    text: str
    sender: Literal["user", "worker"] = "user"
    at: UtcTime | None = None
    called_by: Caller | None = None


@event("goal.input_delivered")
class GoalInputDelivered(Event, frozen=True):
    """Inbox messages rode on a prompt that the host accepted; only now do they leave the inbox."""

    goal_id: str
    input_ids: tuple[str, ...]
    run_id: str | None = None


@event("goal.worker_aborted", version=2)
class GoalWorkerAborted(Event, frozen=True):
    """The owner aborted the worker's run: lease released, status and worker session unchanged."""

    goal_id: str
    at: UtcTime | None = None
    called_by: Caller | None = None


@event("goal.nudged")
class GoalNudged(Event, frozen=True):
    """The owner re-prompted the worker (or sent input as a bare turn): run markers cleared."""

    goal_id: str
    bare: bool = False
    called_by: Caller | None = None


@event("goal.turn_requested", version=2)
class GoalTurnRequested(Event, frozen=True):
    """The owner asked for a turn while an identity switch was in flight: it runs once the switch has ended.

    A turn never prompts with the identity being replaced, and an owner's explicit turn (a nudge, a send, a
    resume of an interactive goal) must not be lost either; the next ``run.started`` consumes the request.
    """

    goal_id: str
    kind: Literal["steer", "bare"] = "steer"
    force: bool = False
    switch_id: str | None = None
    """The switch it waits for."""
    at: UtcTime | None = None
    called_by: Caller | None = None


@event("goal.force_finish_requested")
class GoalForceFinishRequested(Event, frozen=True):
    """A turn limit was first reached: the next turn asks for a final report."""

    goal_id: str
    reason: str


@event("goal.budget_exhausted")
class GoalBudgetExhausted(Event, frozen=True):
    """A token or cost budget is spent: the goal becomes ``budget_limited`` and its lease is released."""

    goal_id: str
    reason: str
    tokens_used: int = 0
    cost_used: float = 0.0
    worker_aborted: bool = False
    budget: Literal["tokens", "cost"] | None = None
    """Which budget was spent (``None`` in events written before it was recorded)."""
    limit: float | None = None
    """That budget's limit, so the reason reads ``cost $2.0731 >= $2.0000`` without the configuration."""


@event("goal.compaction_started", version=2)
class GoalCompactionStarted(Event, frozen=True):
    """The worker session's context was sent for compaction (the reference's ``compaction.started``).

    The reference's compaction: docs/reference/loopd.md#s3-14.
    """

    goal_id: str
    at: UtcTime | None = None


@event("goal.compaction_completed", version=2)
class GoalCompactionCompleted(Event, frozen=True):
    """The host reported the session compacted (``compaction.completed``); the time is ``lastCompactAt``."""

    goal_id: str
    at: UtcTime | None = None


@event("goal.forked_from", version=2)
class GoalForkedFrom(Event, frozen=True):
    """This goal began as a copy of ``source_goal_id``'s state at one of its events (``loopd-es fork``).

    ``state`` is the source's folded goal state after the event at ``at_position`` (its ``replay --json``
    form), so the fork starts with the source's counters, usage, progress and pending identity; its run,
    lease and worker are not carried over. ``name``, ``objective`` and ``config`` are the fork's own (the
    source's, with what the fork changed). The first event of the fork's stream.
    """

    goal_id: str
    source_goal_id: str
    at_position: int
    at_version: int
    at_event_id: str
    name: str
    objective: str
    config: GoalConfig = GoalConfig()
    state: dict[str, Any] = {}
    changed: tuple[str, ...] = ()
    """What the fork changed against the source, e.g. ``("model", "max_turns")``."""
    at: UtcTime | None = None


@event("goal.forked")
class GoalForked(Event, frozen=True):
    """A fork of this goal was made at one of its events; the fork's stream starts with ``goal.forked_from``."""

    goal_id: str
    fork_goal_id: str
    at_position: int
    at_version: int
    changed: tuple[str, ...] = ()


_V1_CONFIG_KEYS = frozenset(GoalConfig.__struct_fields__)


def _goal_created_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 kept the configuration flat beside ``name``; v2 nests it under ``config``."""
    config = {key: data.pop(key) for key in list(data) if key in _V1_CONFIG_KEYS}
    data["config"] = config
    return data


register_upcaster("goal.created", 1, _goal_created_v1_to_v2)

register_upcaster("goal.created", 2, times_to_utc("at"))
register_upcaster("goal.progress", 1, times_to_utc("at"))
register_upcaster("goal.completed", 1, times_to_utc("next_run_at", "at"))
register_upcaster("goal.blocked", 1, times_to_utc("at"))
register_upcaster("goal.input_queued", 1, times_to_utc("at"))
register_upcaster("goal.worker_aborted", 1, times_to_utc("at"))
register_upcaster("goal.turn_requested", 1, times_to_utc("at"))
register_upcaster("goal.compaction_started", 1, times_to_utc("at"))
register_upcaster("goal.compaction_completed", 1, times_to_utc("at"))
register_upcaster("goal.forked_from", 1, times_to_utc("at"))
