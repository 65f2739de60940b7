"""What the goal tools answer, as Structs with the reference's field names (``goalID``, ``workerSessionID`` ...).

The tool file hands the reply to OpenCode as JSON; empty fields are left out, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ..domain.options import config_options

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from .operations import Result


class GoalReply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An owner or worker goal tool's answer: ``ok``, the reference's ``message``, the goal and its status."""

    ok: bool
    message: str = ""
    goalID: str | None = None
    status: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class CreatedReply(GoalReply, kw_only=True, omit_defaults=True):
    """``loopd_create_goal``'s answer (docs/reference/loopd.md#s3-1): the goal and its resolved
    configuration."""

    name: str = ""
    workerSessionID: str | None = None
    artifactDir: str | None = None
    progressFile: str | None = None
    agent: str | None = None
    model: str | None = None
    fallbackModels: list[str] = msgspec.field(default_factory=list)
    checks: list[str] = msgspec.field(default_factory=list)
    checkCwd: str | None = None
    workspaceWrite: bool | None = None
    interactive: bool | None = None
    costBudget: float | None = None
    tokenBudget: int | None = None
    maxTurns: int | None = None
    maxNoProgress: int | None = None
    maxFailures: int | None = None
    maxEvaluatorRejections: int | None = None
    compactEvery: int | None = None
    timeoutMs: int | None = None
    scheduleEveryMs: int | None = None
    scheduleMaxRuns: int | None = None


class CreateFailedReply(GoalReply, kw_only=True, omit_defaults=True):
    """``loopd_create_goal`` when the goal was recorded but could not start (docs/reference/loopd.md#s3-1)."""

    failedStage: str = ""
    nextAction: str = ""


def create_failed_reply(result: Result) -> CreateFailedReply:
    """The reply to a goal that was stored blocked: what failed, and to resume it rather than start another."""
    return CreateFailedReply(
        ok=False,
        message=result.message,
        goalID=result.goal_id,
        status=result.status,
        failedStage="worker_create",
        nextAction=f'Resume the persisted goal with resume_goal (goal_id "{result.goal_id}") after fixing the '
        "cause — do not create another goal for the same task.",
    )


class GoalRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One goal in ``list_background_goals``."""

    id: str
    name: str
    status: str
    phase: str
    model: str | None = None
    agent: str | None = None
    workerSessionID: str | None = None


class GoalList(msgspec.Struct, kw_only=True):
    """``list_background_goals``'s answer."""

    ok: bool
    goals: list[GoalRow]


def reply_of(result: Result) -> dict[str, Any]:
    """An operation's :class:`~.operations.Result` as the tool's JSON reply."""
    reply = GoalReply(
        ok=result.ok, message=result.message, goalID=result.goal_id, status=result.status, data=result.data
    )
    out: dict[str, Any] = msgspec.to_builtins(reply)
    return out


def created_reply(result: Result, state: GoalState) -> CreatedReply:
    """The reply to a goal that was created: what :meth:`~.operations.Operations.create` said, and its config."""
    return CreatedReply(
        ok=result.ok,
        message=result.message,
        goalID=state.goal_id,
        status=state.status,
        name=state.name,
        workerSessionID=state.worker_session_id,
        **config_options(state.config),
    )


def goal_row(goal: GoalState) -> GoalRow:
    """``goal`` as ``list_background_goals`` lists it."""
    return GoalRow(
        id=goal.goal_id,
        name=goal.name,
        status=goal.status,
        phase=goal.phase,
        model=goal.config.model,
        agent=goal.config.agent,
        workerSessionID=goal.worker_session_id,
    )
