"""The folded state of one goal: the reference's Goal and GoalRuntimeState in one frozen Struct.

Only :mod:`loopd_es.domain.evolve` builds new states; everything here is data. Lists are tuples so a state
can be shared between folds and snapshots without copying. The fields are declared once, on a mutable base:
:class:`GoalState` is its frozen form, the one callers see; :class:`GoalDraft` is the mutable twin a fold
works on, so that an event costs a few attribute stores instead of a copy of some sixty fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

import msgspec

from ..events.base import Caller
from ..events.goal import GoalConfig, GoalStatus, WorkerTopology
from ..events.identity import ProviderLimitFacts
from ..events.imported import VerificationAttempt

REDUCER_VERSION: Final = 7
"""Bump when :func:`evolve` folds any event differently: snapshots of another version are discarded."""

MAX_ANOMALIES: Final = 50
MAX_ACCOUNTED_IDS: Final = 200
"""The usage watermark: the last 200 counted message ids (docs/reference/loopd.md#s3-12)."""

Phase = Literal["idle", "queued", "running", "compacting", "waiting_retry", "stopping"]
FallbackStatus = Literal["prepared", "exhausted", "unsupported", "unavailable", "disabled"]


class _S(msgspec.Struct, frozen=True, kw_only=True):
    pass


class Blocker(_S, frozen=True):
    """Why a blocked goal needs its owner; ``kind`` is only set by a provider-limit observation."""

    reason: str
    needed: str
    kind: Literal["provider-limit"] | None = None
    at: datetime | None = None


class Progress(_S, frozen=True):
    summary: str
    next: str | None = None
    at: datetime | None = None


class Evidence(_S, frozen=True):
    summary: str
    evidence: str
    at: datetime | None = None


class PendingModel(_S, frozen=True):
    """A deferred model switch; ``after_switch`` names the switch that was in flight when it was deferred."""

    model: str
    requested_at: datetime | None
    reason: Literal["owner", "quota"] = "owner"
    after_switch: str | None = None
    limit: Literal["quota", "rate-limit"] | None = None
    """For a fallback (reason ``quota``): the provider limit as observed."""


class PendingAgent(_S, frozen=True):
    agent: str
    requested_at: datetime | None
    after_switch: str | None = None


class PendingIdentity(_S, frozen=True):
    """A deferred model *and* agent switch, applied as one transaction."""

    model: str
    agent: str
    after_switch: str | None = None


class SwitchRecord(_S, frozen=True):
    to: str
    at: datetime | None
    outcome: Literal["applied", "next-prompt"]
    from_: str | None = msgspec.field(default=None, name="from")
    reason: Literal["owner", "quota"] | None = None


class SwitchFailure(_S, frozen=True):
    at: datetime | None
    reason: Literal["host-rejected", "catalog-unavailable", "interrupted"]


class SwitchInFlight(_S, frozen=True):
    """A switch the host is being asked to apply (between ``switch_requested`` and its outcome)."""

    switch_id: str
    model: str | None
    agent: str | None
    resume: bool
    reason: Literal["owner", "quota"]
    pending: bool


class TurnRequest(_S, frozen=True):
    """An owner's turn asked for during a switch (``goal.turn_requested``), waiting for the switch to end."""

    kind: Literal["steer", "bare"]
    force: bool
    switch_id: str | None
    at: datetime | None


class ProviderLimit(_S, ProviderLimitFacts, frozen=True):
    """The goal's last provider-limit observation: the fields of ``identity.provider_limit_observed``, the
    reference's ``lastProviderLimit``."""

    @classmethod
    def of(cls, facts: ProviderLimitFacts) -> ProviderLimit:
        """The observation fields of ``facts`` (an observed event, say) as state."""
        return cls(**{name: getattr(facts, name) for name in ProviderLimitFacts.__struct_fields__})


class ModelFallback(_S, frozen=True):
    attempted: tuple[str, ...] = ()
    status: FallbackStatus = "disabled"


class InboxItem(_S, frozen=True):
    input_id: str
    text: str
    sender: Literal["user", "worker"] = "user"
    at: datetime | None = None


class Anomaly(_S, frozen=True):
    """An event that could not apply (unknown goal, cleared goal, stale run...): kept, never raised."""

    type: str
    reason: str
    version: int = 0


class _GoalFields(msgspec.Struct):
    """The fields of a goal's state, in encoding order (snapshots and ``replay --json`` show them).

    Not keyword-only, so a fold converts between the two forms positionally (``astuple``): about ten times
    cheaper than through keywords for sixty fields.
    """

    goal_id: str
    exists: bool = False
    cleared: bool = False
    version: int = 0
    position: int = 0
    name: str = ""
    objective: str = ""
    owner_session_id: str = ""
    status: GoalStatus = "active"
    config: GoalConfig = GoalConfig()
    worker_session_id: str | None = None
    topology: WorkerTopology | None = None
    native_parent_id: str | None = None
    parent_model: str | None = None
    parent_agent: str | None = None
    interactive: bool = False
    blocker: Blocker | None = None
    last_progress: Progress | None = None
    completion_evidence: Evidence | None = None
    tokens_used: int = 0
    cost_used: float = 0.0
    time_used_seconds: float = 0.0
    created_at: datetime | None = None
    # identity
    pending_identity: PendingIdentity | None = None
    model_pending: PendingModel | None = None
    agent_pending: PendingAgent | None = None
    model_last: SwitchRecord | None = None
    agent_last: SwitchRecord | None = None
    model_last_failure: SwitchFailure | None = None
    agent_last_failure: SwitchFailure | None = None
    switch_in_flight: SwitchInFlight | None = None
    turn_requested: TurnRequest | None = None
    last_provider_limit: ProviderLimit | None = None
    model_fallback: ModelFallback | None = None
    inbox: tuple[InboxItem, ...] = ()
    # runtime
    phase: Phase = "queued"
    active_run_id: str | None = None
    active_prompt_message_id: str | None = None
    run_generation: int = 0
    run_deadline: datetime | None = None
    """When the running turn times out (the reference's ``leaseExpiresAt``)."""
    run_count: int = 0
    budget_turn_count: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    retry_after: datetime | None = None
    no_progress_count: int = 0
    progress_during_turn: bool = False
    turn_tokens_used: int = 0
    accounted_message_ids: tuple[str, ...] = ()
    force_finish_requested: bool | None = None
    evaluator_rejection_count: int = 0
    last_rejection_details: str | None = None
    free_retry_pending: bool = False
    idle_candidate_generation: int | None = None
    confirm_failed_generation: int | None = None
    stuck_notified_run_id: str | None = None
    worker_aborted_at: datetime | None = None
    schedule_run_count: int = 0
    next_run_at: datetime | None = None
    # bookkeeping loopd kept and an import carries over (goal.runtime_imported), for the post-mortem
    turn_started_at: datetime | None = None
    last_run_at: datetime | None = None
    last_worker_status: str | None = None
    active_tool_call_ids: tuple[str, ...] = ()
    last_compact_at: datetime | None = None
    last_schedule_at: datetime | None = None
    last_parent_notified_at: datetime | None = None
    last_parent_notified_for: str | None = None
    verification_attempts: tuple[VerificationAttempt, ...] = ()
    anomaly_count: int = 0
    anomalies: tuple[Anomaly, ...] = ()
    # who acted through an OpenCode tool (the events' ``called_by``; None: the CLI, the engine, a log before 0.5)
    created_by: Caller | None = None
    ended_by: Caller | None = None
    """The tool call that completed or blocked the goal (``complete_goal``, ``block_goal``, a force)."""
    controlled_by: Caller | None = None
    """The last tool call that changed the goal otherwise (pause, resume, nudge, input, a switch, progress)."""


# msgspec allows a frozen Struct over a mutable base; mypy's dataclass rule does not know that (it still
# treats every field of GoalState as read-only, which is what matters).
class GoalState(_GoalFields, frozen=True):  # type: ignore[misc]
    """Everything the deciders and the CLI need to know about one goal, folded from its stream."""

    @property
    def is_writer(self) -> bool:
        return self.config.workspace_write

    def summary(self) -> str:
        """One line for ``loopd-es replay``: status, phase, turns, usage and anomalies."""
        if not self.exists:
            state = "cleared" if self.cleared else "missing"
            return f"goal {self.goal_id}: {state} (v{self.version}, {self.anomaly_count} anomalies)"
        return (
            f"goal {self.goal_id} {self.name!r}: {self.status}/{self.phase}, turns {self.budget_turn_count}"
            f"/{self.config.max_turns or '-'}, tokens {self.tokens_used}, cost ${self.cost_used:.4f}, "
            f"model {self.config.model or '-'}, v{self.version}"
            + (f", {self.anomaly_count} anomalies" if self.anomaly_count else "")
        )


class GoalDraft(_GoalFields):
    """The mutable twin of :class:`GoalState`, private to a fold in progress (never shared or returned)."""
