"""The goal tools' arguments (worker and owner, docs/reference/loopd.md#s3, #s3-16), one strict Struct per
tool.

``loopd_create_goal`` carries every option the reference's goal configuration has
(docs/reference/loopd.md#s1-2, #s3-1), each with its
CLI flag (:data:`CREATE_OPTIONS`), so ``goal create``, the tool and the README table are one list. Bounds the
reference states with its own message (``scheduleEveryMs``, ``scheduleMaxRuns``, ``costBudget``) are left to the
decider, which answers in the reference's words; every other bound is the Struct's.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, NamedTuple

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .tool_spec import ToolArgs

Text = Annotated[str, Meta(max_length=100_000)]
Models = Annotated[tuple[Annotated[str, Meta(max_length=400)], ...], Meta(max_length=64)]
_GOAL_ID_DOC: Final = "the goal's id (default: your first goal that is not complete)"


def _doc(text: str) -> Meta:
    return Meta(description=text)


class GoalTarget(ToolArgs, frozen=True, kw_only=True):
    """An owner tool acting on one of the caller's goals."""

    goal_id: Annotated[str, _doc(_GOAL_ID_DOC)] | UnsetType = UNSET


class ReportProgressArgs(ToolArgs, frozen=True, kw_only=True):
    """docs/reference/loopd.md#s3-16: ``{summary, next, evidence?}`` (the evidence is recorded on the
    ``goal.progress`` event)."""

    summary: Annotated[Text, _doc("what was done")]
    next: Annotated[Text, _doc("the next concrete step")]
    evidence: Annotated[Text, _doc("optional concrete evidence")] | UnsetType = UNSET


class CompleteArgs(ToolArgs, frozen=True, kw_only=True):
    summary: Annotated[Text, _doc("what was achieved")]
    evidence: Annotated[Text, _doc("how it was verified")]


class BlockArgs(ToolArgs, frozen=True, kw_only=True):
    reason: Annotated[Text, _doc("why it is blocked")]
    needed: Annotated[Text, _doc("what is needed to go on")]


class SendInputArgs(GoalTarget, frozen=True, kw_only=True):
    text: Annotated[Text, _doc("what to tell the worker")]


class SwitchIdentityArgs(ToolArgs, frozen=True, kw_only=True):
    """docs/reference/loopd.md#s3-10: only an absent field is absent; ``""`` reaches the rules and is refused."""

    goal_id: Annotated[str, _doc("the goal's id")]
    model: Annotated[str, _doc("providerID/modelID")] | UnsetType = UNSET
    agent: Annotated[str, _doc("agent name")] | UnsetType = UNSET
    resume: (
        Annotated[bool, _doc("resume the blocked goal after a safe switch (default false)")] | UnsetType
    ) = UNSET


class InspectArgs(ToolArgs, frozen=True, kw_only=True):
    """``inspect_background_goal`` (docs/reference/loopd.md#s3-22): a goal, and how much of its transcript."""

    goal_id: (
        Annotated[str, _doc("the goal's id (default: your first goal that is not complete)")] | UnsetType
    ) = UNSET
    includeTranscript: (
        Annotated[bool, _doc("include the worker's last messages (default true; false: metadata only)")]
        | UnsetType
    ) = UNSET
    transcriptLimit: Annotated[float, _doc("how many transcript messages (1-10, default 3)")] | UnsetType = (
        UNSET
    )


class ForceCompleteArgs(GoalTarget, frozen=True, kw_only=True):
    summary: Text | UnsetType = UNSET
    evidence: Text | UnsetType = UNSET


class ForceBlockArgs(GoalTarget, frozen=True, kw_only=True):
    reason: Text | UnsetType = UNSET
    needed: Text | UnsetType = UNSET


Count = Annotated[int, Meta(ge=0, le=1_000_000)]
Positive = Annotated[int, Meta(ge=1, le=1_000_000)]


class CreateGoalArgs(ToolArgs, frozen=True, kw_only=True):
    """``loopd_create_goal``: the reference's arguments (docs/reference/loopd.md#s3-1), and ``tokenBudget`` /
    ``maxEvaluatorRejections``,
    which the reference's configuration has but no tool of it sets."""

    name: Annotated[str, Meta(max_length=400, description="a short name")]
    objective: Annotated[Text, _doc("what the worker must achieve")]
    model: Annotated[str, _doc("providerID/modelID")] | UnsetType = UNSET
    agent: Annotated[str, _doc("the worker's agent")] | UnsetType = UNSET
    fallbackModels: (
        Annotated[Models, _doc("ordered providerID/modelID fallbacks for rate limits and quota (at most 16)")]
        | UnsetType
    ) = UNSET
    checks: (
        Annotated[
            tuple[Text, ...],
            _doc("shell commands that must pass before the goal completes (default: bun test)"),
        ]
        | UnsetType
    ) = UNSET
    checkCwd: Annotated[str, _doc("where the checks run (default: the project)")] | UnsetType = UNSET
    workspaceWrite: (
        Annotated[bool, _doc("whether the goal writes the workspace (default true; one writer at a time)")]
        | UnsetType
    ) = UNSET
    progressFile: (
        Annotated[str, _doc("the progress file (default <artifactDir>/progress.md)")] | UnsetType
    ) = UNSET
    costBudget: Annotated[float, _doc("dollars (> 0)")] | UnsetType = UNSET
    tokenBudget: (
        Annotated[int, Meta(ge=1, le=10**15, description="tokens; the goal stops (budget_limited) past it")]
        | UnsetType
    ) = UNSET
    maxTurns: Annotated[Count, _doc("turn limit (default 50, 0 = unlimited)")] | UnsetType = UNSET
    maxNoProgress: (
        Annotated[Count, _doc("finish after this many turns in a row without reported progress (0 = off)")]
        | UnsetType
    ) = UNSET
    maxFailures: (
        Annotated[Positive, _doc("consecutive failures before the goal blocks (default 5)")] | UnsetType
    ) = UNSET
    maxEvaluatorRejections: (
        Annotated[Positive, _doc("rejected completions before the goal blocks (default 3)")] | UnsetType
    ) = UNSET
    compactEvery: (
        Annotated[Count, _doc("compact the worker session every N turns (0 = never)")] | UnsetType
    ) = UNSET
    timeoutMs: (
        Annotated[int, Meta(ge=1000, le=86_400_000, description="per-turn timeout in ms (default 300000)")]
        | UnsetType
    ) = UNSET
    scheduleEveryMs: Annotated[float, _doc("re-run the completed goal every N ms (>= 1000)")] | UnsetType = (
        UNSET
    )
    scheduleMaxRuns: (
        Annotated[
            float,
            _doc("stop re-running after N runs, the first included (integer >= 1; needs scheduleEveryMs)"),
        ]
        | UnsetType
    ) = UNSET
    interactive: Annotated[bool, _doc("manual mode: the engine starts no turns itself")] | UnsetType = UNSET

    def options(self) -> dict[str, Any]:
        """The given options as :class:`~loopd_es.domain.goal_commands.CreateGoal` keywords."""
        out: dict[str, Any] = {}
        for tool_field, option in CREATE_OPTIONS.items():
            value = getattr(self, tool_field)
            if value is not UNSET:
                out[option.field] = value
        return out


class Option(NamedTuple):
    """One ``loopd_create_goal`` option: its CreateGoal field, its ``goal create`` flag, the reference's default."""

    field: str
    flag: str
    metavar: str | None
    default: str


CREATE_OPTIONS: Final[dict[str, Option]] = {
    "model": Option("model", "--model", "P/M", "the owner's model, else the host's"),
    "agent": Option("agent", "--agent", "A", "the owner's agent, else the host's"),
    "fallbackModels": Option("fallback_models", "--fallback-model", "P/M", "none"),
    "checks": Option("checks", "--check", "CMD", "`bun test` for a writer, none read-only"),
    "checkCwd": Option("check_cwd", "--check-cwd", "DIR", "the project for a writer"),
    "workspaceWrite": Option("workspace_write", "--read-only", None, "true (`--read-only` makes it false)"),
    "progressFile": Option("progress_file", "--progress-file", "PATH", "<artifactDir>/progress.md"),
    "costBudget": Option("cost_budget", "--cost-budget", "USD", "unlimited"),
    "tokenBudget": Option("token_budget", "--token-budget", "N", "unlimited"),
    "maxTurns": Option("max_turns", "--max-turns", "N", "50"),
    "maxNoProgress": Option("max_no_progress", "--max-no-progress", "N", "off"),
    "maxFailures": Option("max_failures", "--max-failures", "N", "5"),
    "maxEvaluatorRejections": Option("max_evaluator_rejections", "--max-evaluator-rejections", "N", "3"),
    "compactEvery": Option("compact_every", "--compact-every", "N", "never"),
    "timeoutMs": Option("timeout_ms", "--timeout-ms", "MS", "300000"),
    "scheduleEveryMs": Option("schedule_every_ms", "--schedule-every-ms", "MS", "not scheduled"),
    "scheduleMaxRuns": Option("schedule_max_runs", "--schedule-max-runs", "N", "unlimited"),
    "interactive": Option("interactive", "--interactive", None, "false"),
}
"""Every ``loopd_create_goal`` option beyond ``name``/``objective``; a test checks it covers the Struct."""


def options_table() -> str:
    """The README's table of goal options: tool field, CLI flag, default, and what it does."""
    props = msgspec.json.schema(CreateGoalArgs)["$defs"]["CreateGoalArgs"]["properties"]
    rows = ["| tool field | `goal create` flag | default | meaning |", "|---|---|---|---|"]
    for name, option in CREATE_OPTIONS.items():
        flag = option.flag + (f" {option.metavar}" if option.metavar else "")
        if props[name].get("type") == "array":
            flag += "` (repeat)"
        else:
            flag += "`"
        rows.append(f"| `{name}` | `{flag} | {option.default} | {props[name].get('description', '')} |")
    return "\n".join(rows) + "\n"
