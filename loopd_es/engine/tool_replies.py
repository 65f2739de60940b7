"""What the goal tools answer, as Structs with the reference's field names (``goalID``, ``workerSessionID`` ...).

The tool file hands the reply to OpenCode as JSON; empty fields are left out, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from ..domain.options import config_options
from ..domain.rules import clean_list, clean_text

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from .operations import Result
    from .tool_args import CreateGoalArgs


class GoalReply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An owner or worker goal tool's answer: ``ok``, the reference's ``message``, the goal and its status."""

    ok: bool
    message: str = ""
    goalID: str | None = None
    status: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class DefaultsApplied(msgspec.Struct, kw_only=True):
    """Which of agent, model and checks a created goal took from a default rather than from the call."""

    agent: bool
    model: bool
    checks: bool


class CreatedReply(GoalReply, kw_only=True, omit_defaults=True):
    """``loopd_create_goal``'s answer (docs/reference/loopd.md#s3-1): the goal and its resolved
    configuration."""

    name: str = ""
    workerSessionID: str | None = None
    workerTopology: str | None = None
    nativeParentID: str | None = None
    defaultsApplied: DefaultsApplied | None = None
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


def reply_of(result: Result) -> dict[str, Any]:
    """An operation's :class:`~.operations.Result` as the tool's JSON reply."""
    reply = GoalReply(
        ok=result.ok, message=result.message, goalID=result.goal_id, status=result.status, data=result.data
    )
    out: dict[str, Any] = msgspec.to_builtins(reply)
    return out


def created_reply(result: Result, state: GoalState, args: CreateGoalArgs) -> CreatedReply:
    """The reply to a goal that was created: what :meth:`~.operations.Operations.create` said, its config, and
    which of agent, model and checks came from a default (a parent's identity, a default, ``bun test``)."""
    cfg = state.config
    given = {  # what the caller gave that is left once trimmed (a blank one is absent: the default applies)
        "agent": args.agent is not UNSET and clean_text(args.agent) is not None,
        "model": args.model is not UNSET and clean_text(args.model) is not None,
        "checks": args.checks is not UNSET and bool(clean_list(args.checks or ())),
    }
    return CreatedReply(
        ok=result.ok,
        message=result.message,
        goalID=state.goal_id,
        status=state.status,
        name=state.name,
        workerSessionID=state.worker_session_id,
        workerTopology=state.topology,
        nativeParentID=state.native_parent_id,
        defaultsApplied=DefaultsApplied(
            agent=not given["agent"] and cfg.agent is not None,
            model=not given["model"] and cfg.model is not None,
            checks=not given["checks"] and bool(cfg.checks),
        ),
        **config_options(cfg),
    )


def completion_reply(result: Result) -> dict[str, Any]:
    """``complete_goal``'s answer (docs/reference/loopd.md#s3-16): accepted ``{goalID, goalName, status, summary,
    evidence}``; rejected ``{goalID, goalName, passed, failedChecks[{command, exitCode, stderr, stdout}],
    message, rejectionCount, status}``; a refusal as any tool's. ``ok`` is loopd-es's, beside them."""
    data = result.data
    if result.goal_id is None or "goal_name" not in data:
        return reply_of(result)
    head = {"ok": result.ok, "goalID": result.goal_id, "goalName": data["goal_name"]}
    if data.get("passed") is False:
        names = {"command": "command", "exit_code": "exitCode", "stderr": "stderr", "stdout": "stdout"}
        checks = [
            {names[k]: v for k, v in check.items() if k in names and v is not None}
            for check in data["failed_checks"]
        ]
        return head | {
            "passed": False,
            "failedChecks": checks,
            "message": result.message,
            "rejectionCount": data["rejection_count"],
            "status": result.status,
        }
    return head | {
        "status": result.status,
        "summary": data["summary"],
        "evidence": data["evidence"],
        "message": result.message,
    }
