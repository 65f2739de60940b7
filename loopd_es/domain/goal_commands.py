"""Commands (intents) and facts (what the caller read from the outside world) for the goal deciders.

Ids (goal, run, switch, input) and the current time are chosen by the caller and passed in, so a decider
is a pure function: the same command, state and facts always give the same events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import msgspec


class _C(msgspec.Struct, frozen=True, kw_only=True):
    pass


# -- facts ---------------------------------------------------------------------------------------------


class WriterGoal(_C, frozen=True, kw_only=True):
    """Another goal that is active and writes the workspace (for the single-writer rule)."""

    goal_id: str
    name: str
    owner_session_id: str


class ModelInfo(_C, frozen=True, kw_only=True):
    usable: bool | Literal["unknown"] = "unknown"


class ModelCatalog(_C, frozen=True, kw_only=True):
    """The host's model catalog (docs/reference/loopd.md#s1-6); ``models`` maps ``provider/model`` to its
    record."""

    capability: Literal["supported", "unsupported", "unavailable"] = "supported"
    switching: Literal["session", "next-prompt", "unsupported"] = "session"
    models: dict[str, ModelInfo] = msgspec.field(default_factory=dict)

    def usable(self, model: str) -> bool:
        info = self.models.get(model)
        return info is not None and info.usable is True


class AgentCatalog(_C, frozen=True, kw_only=True):
    capability: Literal["supported", "unsupported", "unavailable"] = "supported"
    switching: Literal["session", "next-prompt", "unsupported"] = "session"
    agents: tuple[str, ...] = ()


class CreationDefaults(_C, frozen=True, kw_only=True):
    """Plugin options and the owner session's live identity, used when a creation leaves them out."""

    directory: str = "."
    agent: str | None = None
    model: str | None = None
    checks: tuple[str, ...] | None = None


class RetryBackoff(_C, frozen=True, kw_only=True):
    """The engine's retry backoff after a failed turn: ``min(cap_ms, base_ms * 2^failures)``."""

    base_ms: int = 1000
    cap_ms: int = 30_000


def _epoch() -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC)


class Facts(_C, frozen=True, kw_only=True):
    """Everything a decision needs from outside the stream, read by the caller first."""

    now: datetime = msgspec.field(default_factory=_epoch)
    active_writers: tuple[WriterGoal, ...] = ()
    worker_status: Literal["idle", "busy", "retry", "unknown"] = "idle"
    model_catalog: ModelCatalog | None = None
    agent_catalog: AgentCatalog | None = None
    can_switch_model: bool = True
    can_switch_agent: bool = True
    defaults: CreationDefaults = CreationDefaults()
    backoff: RetryBackoff = RetryBackoff()


# -- commands ------------------------------------------------------------------------------------------


class CreateGoal(_C, frozen=True, kw_only=True):
    """``loopd_create_goal``: the arguments as given (``None`` means absent)."""

    goal_id: str
    name: str
    objective: str
    owner_session_id: str | None
    agent: str | None = None
    model: str | None = None
    fallback_models: tuple[str, ...] | None = None
    cost_budget: float | None = None
    token_budget: int | None = None
    checks: tuple[str, ...] | None = None
    check_cwd: str | None = None
    workspace_write: bool | None = None
    progress_file: str | None = None
    max_turns: int | None = None
    max_no_progress: int | None = None
    max_failures: int | None = None
    max_evaluator_rejections: int | None = None
    compact_every: int | None = None
    timeout_ms: int | None = None
    schedule_every_ms: float | None = None
    schedule_max_runs: float | None = None
    interactive: bool = False


class _GoalCommand(_C, frozen=True, kw_only=True):
    goal_id: str
    caller: str | None = None
    """The owner session acting, or ``None`` for the dashboard (no ownership check)."""


class PauseGoal(_GoalCommand, frozen=True, kw_only=True):
    pass


class ResumeGoal(_GoalCommand, frozen=True, kw_only=True):
    pass


class RetryGoal(_GoalCommand, frozen=True, kw_only=True):
    pass


class ClearGoal(_GoalCommand, frozen=True, kw_only=True):
    pass


class NudgeGoal(_GoalCommand, frozen=True, kw_only=True):
    pass


class SendInput(_GoalCommand, frozen=True, kw_only=True):
    input_id: str
    text: str


class SetInteractive(_GoalCommand, frozen=True, kw_only=True):
    interactive: bool


class ReportProgress(_GoalCommand, frozen=True, kw_only=True):
    summary: str
    next: str | None = None
    evidence: str | None = None


class CheckResult(_C, frozen=True, kw_only=True):
    """One completion check as the caller ran it (output already cut to 1000 characters)."""

    command: str
    exit_code: int
    stdout: str | None = None
    stderr: str | None = None


class CompleteGoal(_GoalCommand, frozen=True, kw_only=True):
    """``complete_goal``: the check results are facts the caller obtained by running ``config.checks``."""

    summary: str
    evidence: str
    attempt_id: str
    check_results: tuple[CheckResult, ...] = ()
    cwd: str | None = None


class BlockGoal(_GoalCommand, frozen=True, kw_only=True):
    reason: str
    needed: str


class AbortWorker(_GoalCommand, frozen=True, kw_only=True):
    pass


class RecordWorkerFailure(_GoalCommand, frozen=True, kw_only=True):
    """Creating the worker session failed at start (G2): ``detail`` is the host's description."""

    detail: str


class ForceComplete(_GoalCommand, frozen=True, kw_only=True):
    summary: str = "Force-completed from dashboard."
    evidence: str = "Manual override — no verification checks run."


class ForceBlock(_GoalCommand, frozen=True, kw_only=True):
    reason: str = "Blocked from dashboard."
    needed: str = "User intervention required."


class AssistantMessage(_C, frozen=True, kw_only=True):
    message_id: str
    role: Literal["assistant", "user"] = "assistant"
    completed: bool = True
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    duration_ms: float = 0.0


class AccountUsage(_GoalCommand, frozen=True, kw_only=True):
    messages: tuple[AssistantMessage, ...]


class StartRun(_GoalCommand, frozen=True, kw_only=True):
    """Acquire a turn (``turn.acquire``): the caller has checked the worker and applied pending switches."""

    run_id: str
    prompt_message_id: str
    kind: Literal["steer", "bare", "force_finish"] = "steer"


class ConfirmIdle(_GoalCommand, frozen=True, kw_only=True):
    """The run's idle was confirmed: complete it and enforce limits and budgets
    (docs/reference/loopd.md#s3-13)."""

    run_id: str
    generation: int


class EnforceBudget(_GoalCommand, frozen=True, kw_only=True):
    """Maintenance's mid-turn budget check (G17); the caller aborts the worker when a stop is decided."""


class RecordRunFailure(_GoalCommand, frozen=True, kw_only=True):
    """A ``session.error`` or a failed prompt delivery; ``error_text`` is ``describeError(error)``.

    ``run_id``/``generation`` name the run the error was observed on (``None``: whatever run is current); a
    failure of another run decides nothing, so a late error of an earlier run never fails the current turn.
    """

    error_text: str
    source: Literal["session-error", "prompt-delivery"] = "session-error"
    block_immediately: bool = False
    run_id: str | None = None
    generation: int | None = None


class SwitchIdentity(_GoalCommand, frozen=True, kw_only=True):
    switch_id: str
    model: str | None = None
    agent: str | None = None
    resume: bool = False


class ApplyPendingSwitch(_GoalCommand, frozen=True, kw_only=True):
    """``continueTurn`` step 5: turn the next pending switch into a request (or a failure)."""

    switch_id: str


HostResult = Literal["applied", "next-prompt", "rejected", "unsupported", "busy"]


class RecordSwitchOutcome(_GoalCommand, frozen=True, kw_only=True):
    """What the host did with the in-flight switch; ``rolled_back`` is ``None`` when nothing was undone."""

    switch_id: str
    model_result: HostResult | None = None
    agent_result: HostResult | None = None
    rolled_back: bool | None = None
    persist_failed: bool = False
    interrupted: bool = False
    """The process running the switch died before the host answered (recovery settled it): no host refused it."""


class ObserveProviderError(_GoalCommand, frozen=True, kw_only=True):
    """A provider error after a session error or a failed prompt delivery (docs/reference/loopd.md#s3-11).

    ``fallback_turn``: decide only whether the running turn (``run_id``/``generation`` when known) ends as a
    fallback turn, a limit with a fallback ready, which is not a failure; nothing is recorded otherwise, and
    the caller records the failure and observes again. ``via="retry-status"``: the error is the host's retry
    status, a limit whatever its words.
    """

    error: Any
    error_text: str
    source: Literal["prompt-delivery", "session-error"]
    expected_model: str | None = None
    via: str | None = None
    fallback_turn: bool = False
    run_id: str | None = None
    generation: int | None = None


# -- the engine's own records (decided in :mod:`loopd_es.domain.engine_rules`) ---------------------------------


class AssignWorker(_GoalCommand, frozen=True, kw_only=True):
    """The worker session was created (or forked) for the goal; nothing when the goal went away meanwhile."""

    worker_session_id: str
    forked_from_session_id: str | None = None
    fork_method: Literal["fork", "primed", "new"] | None = None
    kept_messages: int | None = None


class RequestTurn(_GoalCommand, frozen=True, kw_only=True):
    """An owner's turn asked for while switch ``switch_id`` is in flight; it runs once the switch ended."""

    switch_id: str
    kind: Literal["steer", "bare"] = "steer"
    force: bool = False


class RecordInputDelivered(_GoalCommand, frozen=True, kw_only=True):
    """The host accepted the prompt that carried these inbox items (those still in the inbox leave it)."""

    input_ids: tuple[str, ...]
    run_id: str | None = None


class QueueEvidence(_GoalCommand, frozen=True, kw_only=True):
    """A fired (or discarded) command await's evidence for the goal's inbox, at the time it fired."""

    input_id: str
    text: str
    at: datetime


class WakeForEvidence(_GoalCommand, frozen=True, kw_only=True):
    """The forced turn an await owes its active goal while its evidence ``input_id`` waits in the inbox."""

    input_id: str


class StageIdleCandidate(_GoalCommand, frozen=True, kw_only=True):
    """The first idle signal of run ``run_id`` (generation ``generation``) that the transcript did not prove."""

    run_id: str
    generation: int


class RecordConfirmFailure(_GoalCommand, frozen=True, kw_only=True):
    """The transcript refused the run's idle confirmation (recorded once per generation)."""

    run_id: str
    generation: int
    reason: Literal["prompt-outside-window", "assistant-incomplete", "worker-active"]


class RecoverRun(_GoalCommand, frozen=True, kw_only=True):
    """Maintenance found the running phase's worker idle and quiet past the recovery period."""

    run_id: str
    generation: int
    quiet_seconds: float
    cleared_tool_calls: int = 0


class RecordStuck(_GoalCommand, frozen=True, kw_only=True):
    """A watchdog found run ``run_id`` stuck; recorded once per run."""

    run_id: str
    generation: int
    stuck_seconds: float
    watchdog: Literal["idle-unconfirmed", "busy"]
    worker_status: str | None = None


class StartCompaction(_GoalCommand, frozen=True, kw_only=True):
    """The engine compacts the worker's session after a run (docs/reference/loopd.md#s3-14)."""


class CompleteCompaction(_GoalCommand, frozen=True, kw_only=True):
    """Compaction ended (``error``: why the host failed it, or why it was cut)."""

    error: str | None = None


class RunOnSchedule(_GoalCommand, frozen=True, kw_only=True):
    """A scheduled goal's tick ``slot`` is due (docs/reference/loopd.md#s3-15): its slot is already claimed.

    ``attempt`` counts the ticks of the same run: a tick whose runner was lost, or a run force-completed after
    its tick (a forced completion counts no run), is ticked again.
    """

    slot: int
    at: datetime
    attempt: int = 1


GoalCommand = (
    CreateGoal
    | PauseGoal
    | ResumeGoal
    | RetryGoal
    | ClearGoal
    | NudgeGoal
    | SendInput
    | SetInteractive
    | AbortWorker
    | RecordWorkerFailure
    | ReportProgress
    | CompleteGoal
    | BlockGoal
    | ForceComplete
    | ForceBlock
    | AccountUsage
    | StartRun
    | ConfirmIdle
    | EnforceBudget
    | RecordRunFailure
    | SwitchIdentity
    | ApplyPendingSwitch
    | RecordSwitchOutcome
    | ObserveProviderError
    | AssignWorker
    | RequestTurn
    | RecordInputDelivered
    | QueueEvidence
    | WakeForEvidence
    | StageIdleCandidate
    | RecordConfirmFailure
    | RecoverRun
    | RecordStuck
    | StartCompaction
    | CompleteCompaction
    | RunOnSchedule
)
