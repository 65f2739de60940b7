"""Which ``state.json`` fields an import keeps, and why it leaves out the others.

Every key of the source file, walked recursively, is either kept (some imported event carries it and
``replay --json`` shows it) or reported in ``import.completed`` as a :class:`DroppedField` with its reason.
A key this table does not know (loopd added it after 1.12.2) is reported as unknown: users see it, and the
import's tests fail on it until it is classified here.

Paths name list items with ``[]``: ``runtimes[].idleCandidateAt``. A rule on a key covers the keys under it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from ..events.imported import DroppedField
from . import whole
from .source import valid_schedule

UNKNOWN: Final = "not a field of opencode-loopd 1.12.2's state (version 9); not imported"
"""The reason given for a key no rule names (tests fail on it: every real field has a reason of its own)."""

_IDLE: Final = (
    "loopd's host's idle detection of its own run in flight (docs/reference/loopd.md#s2-3); loopd-es "
    "detects idle afresh from its host's signals"
)
_LIVENESS: Final = (
    "loopd's host's liveness polling of its worker session; loopd-es's engine polls its own host"
)
_WRITTEN: Final = (
    "when loopd last wrote the record; in the log every event keeps its own time (the last one is the "
    "update time `goals`/`goal show` give)"
)
_SCOPES: Final = (
    "post-1.12.2 file-scope ownership (docs/reference/loopd.md#s9), which loopd-es does not implement"
)


_NO_GOAL: Final = (
    "the runtime of a goal the file does not hold (its goalID names none of goals[]): loopd keeps a runtime only "
    "beside its goal, so no event carries any of its fields"
)


class Source(NamedTuple):
    """What a conditional rule needs besides the record: the file's version, the commands the import ended."""

    version: int
    ended: frozenset[str]


Rule = str | Callable[[dict[str, Any], dict[str, Any], Source], str | None]
"""A reason, or a function of (the record, its goal, the source) giving one (None: kept)."""


def _in_flight(record: dict[str, Any], goal: dict[str, Any], source: Source) -> str | None:
    if record.get("phase") == "running" and goal.get("status") == "active":
        return None
    return (
        f"set on a run no longer in flight (phase {record.get('phase')!r}, goal {goal.get('status')!r}): "
        "loopd leaves it after the run ends; the run's own events keep its id"
    )


def _retry(record: dict[str, Any], goal: dict[str, Any], source: Source) -> str | None:
    if record.get("phase") == "waiting_retry":
        return None
    return (
        f"the backoff deadline of a retry no longer pending (phase {record.get('phase')!r}): loopd leaves it "
        "set; loopd-es keeps one only while the goal waits to retry"
    )


def _output(record: dict[str, Any], goal: dict[str, Any], source: Source) -> str | None:
    if record.get("status") != "running" or record.get("id") in source.ended:
        return None  # an ended command's counts are on its exit
    return (
        "a running command's output counts grow in loopd's commands/<id>.log, which stays with loopd; "
        "its exit (reconcile) records them"
    )


def _deadline(record: dict[str, Any], goal: dict[str, Any], source: Source) -> str | None:
    if record.get("status") != "running" or not record.get("deadlineAt"):
        return None
    return (
        "`running` past its deadline is not kept: once deadlineAt has passed (before loopd's last write, or "
        "by the time the import runs) the command ends `missing` with end reason `timeout`, as loopd's "
        "reconciler ends it"
    )


def _schedule(record: dict[str, Any], goal: dict[str, Any], source: Source) -> str | None:
    config = record.get("config")
    schedule = config.get("schedule") if isinstance(config, dict) else None
    if source.version < 6 and not valid_schedule(schedule):
        return "dropped by loopd's own v6 migration (a schedule needs everyMs >= 1000)"
    return None


_GOAL: Final = (
    "id name objective status ownerSessionID workerSessionID workerTopology nativeParentID tokenBudget "
    "costBudget parentModel parentAgent interactive pendingIdentity pendingIdentity.model "
    "pendingIdentity.agent agentSwitch agentSwitch.pending agentSwitch.pending.agent "
    "agentSwitch.pending.requestedAt agentSwitch.last agentSwitch.last.from agentSwitch.last.to "
    "agentSwitch.last.at agentSwitch.last.outcome agentSwitch.lastFailure agentSwitch.lastFailure.at "
    "agentSwitch.lastFailure.reason modelSwitch modelSwitch.pending modelSwitch.pending.model "
    "modelSwitch.pending.requestedAt modelSwitch.pending.reason modelSwitch.last modelSwitch.last.from "
    "modelSwitch.last.to modelSwitch.last.at modelSwitch.last.outcome modelSwitch.last.reason "
    "modelSwitch.lastFailure modelSwitch.lastFailure.at modelSwitch.lastFailure.reason lastProviderLimit "
    "lastProviderLimit.kind lastProviderLimit.source lastProviderLimit.observedAt lastProviderLimit.model "
    "lastProviderLimit.statusCode lastProviderLimit.retryAt modelFallback modelFallback.attempted "
    "modelFallback.status tokensUsed costUsed timeUsedSeconds config config.promptFile config.progressFile "
    "config.includeFiles config.checks config.checkCwd config.workspaceWrite config.maxTurns "
    "config.maxNoProgress config.maxFailures config.compactEvery config.timeoutMs "
    "config.maxEvaluatorRejections config.artifactDir config.agent config.model config.fallbackModels "
    "config.schedule.everyMs config.schedule.maxRuns lastProgress lastProgress.summary lastProgress.next "
    "lastProgress.at completionEvidence completionEvidence.summary completionEvidence.evidence "
    "completionEvidence.at blocker blocker.kind blocker.reason blocker.needed blocker.at createdAt"
)
_ATTEMPT: Final = (
    "id sequence runGeneration claimedSummary claimedEvidence startedAt completedAt status cwd checks "
    "checks[].command checks[].exitCode checks[].stderr checks[].stdout"
)
_RUNTIME: Final = (
    "goalID phase turnStartedAt consecutiveFailures lastError runCount budgetTurnCount noProgressCount "
    "progressDuringTurn lastWorkerStatus turnTokensUsed accountedMessageIDs forceFinishRequested "
    "evaluatorRejectionCount lastRejectionDetails freeRetryPending runGeneration stuckNotifiedRunID "
    "workerAbortedAt activeToolCallIDs lastParentNotifiedAt lastParentNotifiedFor scheduleRunCount "
    "nextRunAt lastScheduleAt lastRunAt lastCompactAt lastVerificationAttempt recentVerificationAttempts "
    + " ".join(f"lastVerificationAttempt.{k} recentVerificationAttempts[].{k}" for k in _ATTEMPT.split())
)
_COMMAND: Final = (
    "id title command args shell endReason timeoutSeconds deadlineAt envKeys watchFilter watchUntil "
    "watchIgnoreCase watchUntilAction watchState watchState.state watchState.matches watchState.pushes "
    "watchState.droppedLines cwd ownerSessionID goalID notifyOnExit ownerNotifiedAt status exitCode signal "
    "cols rows createdAt endedAt lastError"
)
KEPT: Final = frozenset(
    [
        "version",
        "revision",
        "goals",
        "runtimes",
        "commands",
        "commandAwaits",
        "commandLedger",
        *(f"goals[].{k}" for k in _GOAL.split()),
        *(f"runtimes[].{k}" for k in _RUNTIME.split()),
        *(f"commands[].{k}" for k in _COMMAND.split()),
        *(
            f"commandAwaits[].{k}"
            for k in "goalID commandID ownerSessionID createdAt until ignoreCase".split()
        ),
        *(f"commandLedger[].{k}" for k in "requestID command goalID acceptedAt completedAt".split()),
    ]
)
"""Every key an import carries into an event that ``replay --json`` shows (checked by the import tests)."""

RULES: Final[dict[str, Rule]] = {
    "goals[].updatedAt": _WRITTEN,
    "goals[].config.schedule": _schedule,
    "goals[].scopeClosing": _SCOPES,
    "goals[].scopeClearPending": _SCOPES,
    "goals[].config.write_scope": _SCOPES,
    "runtimes[].activeRunID": _in_flight,
    "runtimes[].leaseExpiresAt": _in_flight,
    "runtimes[].activePromptMessageID": _in_flight,
    "runtimes[].retryAfter": _retry,
    "runtimes[].turnCount": "renamed by loopd's own v3 migration to budgetTurnCount and runCount (both kept)",
    "runtimes[].unknownStatusCount": _LIVENESS,
    "runtimes[].lastUnknownStatusAt": _LIVENESS,
    "runtimes[].workerUnreachableNotifiedAt": _LIVENESS,
    "runtimes[].activePromptObservedAt": _IDLE,
    "runtimes[].activeAssistantMessageID": _IDLE,
    "runtimes[].activeAssistantCompletedAt": _IDLE,
    "runtimes[].lastActivityAt": _IDLE,
    "runtimes[].idleCandidateAt": _IDLE,
    "runtimes[].idleCandidateGeneration": _IDLE,
    "runtimes[].idleConfirmFailedAt": _IDLE,
    "runtimes[].idleConfirmFailedGeneration": _IDLE,
    "runtimes[].idleStuckNotifiedGeneration": _IDLE,
    "runtimes[].lastProgressAt": "the time of the last progress report, kept as goals[].lastProgress.at",
    "runtimes[].createdAt": "the runtime record is created with its goal: goals[].createdAt (kept) is its time",
    "runtimes[].updatedAt": _WRITTEN,
    "commands[].pid": (
        "the process id on loopd's host: loopd-es never signals a process it did not start, so it keeps "
        "no pid it cannot own"
    ),
    "commands[].notifySuccessfulExit": (
        "set on every command by loopd 1.12.2's start (docs/reference/loopd.md#s1-7), so it says nothing "
        "about this one"
    ),
    "commands[].status": _deadline,
    "commands[].outputBytes": _output,
    "commands[].streamBytes": _output,
    "commands[].truncated": _output,
    "commands[].updatedAt": _WRITTEN,
    "workspaceCalls": _SCOPES,
    "workspaceOperation": _SCOPES,
    "retiredWorkerSessions": _SCOPES,
    "orphanedCommandProcesses": _SCOPES,
    **whole.rules(),
}


def dropped_fields(document: dict[str, Any], ended: frozenset[str] = frozenset()) -> tuple[DroppedField, ...]:
    """The keys of ``document`` (``state.json`` as read) no import event keeps, with reason and count.

    ``ended``: the running commands the import ended (past their deadline). A reported key's children are
    not listed again (the key's reason covers them).
    """
    raw = document.get("version")
    source = Source(raw if isinstance(raw, int) else 9, ended)
    goals = {g.get("id"): g for g in document.get("goals", []) if isinstance(g, dict)}
    found: dict[tuple[str, str], int] = {}

    def visit(obj: dict[str, Any], path: str, record: dict[str, Any], goal: dict[str, Any]) -> None:
        for key, value in obj.items():
            sub = f"{path}.{key}" if path else str(key)
            rule = RULES.get(sub)
            reason = rule(record, goal, source) if callable(rule) else rule
            if reason is None and rule is None and sub not in KEPT:
                reason = UNKNOWN
            if reason is not None:
                found[sub, reason] = found.get((sub, reason), 0) + 1
                continue
            if isinstance(value, dict):
                visit(value, sub, record, goal)
            elif isinstance(value, list):
                for item in value:
                    if not isinstance(item, dict):
                        continue
                    if path:
                        visit(item, f"{sub}[]", record, goal)
                    elif (
                        key == "runtimes" and item.get("goalID") not in goals
                    ):  # a runtime of no goal: none of it
                        found[f"{sub}[]", _NO_GOAL] = found.get((f"{sub}[]", _NO_GOAL), 0) + 1
                    else:  # a top-level list: each item is a record of its own
                        owner = goals.get(item.get("goalID") if key != "goals" else item.get("id"), {})
                        visit(item, f"{sub}[]", item, owner if key in ("goals", "runtimes") else {})

    visit(document, "", {}, {})
    return tuple(
        DroppedField(path=path, reason=reason, count=count) for (path, reason), count in sorted(found.items())
    )
