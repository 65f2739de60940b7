"""Read an ``opencode-loopd`` project's ``state.json`` (versions 1-9, upgraded in memory); its ledger is :mod:`.ledger`.

The reference (docs/reference/loopd.md#s1, #s4-1) is loosely typed JSON written by TypeScript; here every
field the import uses is a typed Struct, so a wrong shape is refused with msgspec's path (``at `$.goals[0].name```)
instead of surfacing later as a half-built event. Keys keep the reference's spelling (``goalID``). Fields the
import does not use are ignored, never rejected: loopd adds fields without bumping the version.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Final, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import msgspec

from ..clock import utc_text
from ..errors import UsageError
from ..events.command import EndReason, Status, UntilAction
from ..events.goal import GoalStatus, WorkerTopology
from .whole import whole_numbers

STATE_VERSION: Final = 9
LOOPD_DIR: Final = Path(".opencode") / "loopd"


class ImportSourceError(UsageError):
    """Raised when a loopd project's ``state.json`` or ``events.ndjson`` is missing, unreadable or malformed."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        super().__init__(f"cannot import {path}: {problem}; nothing was imported")


Stamp = Annotated[str, msgspec.Meta(extra={"time": True})]
"""A time as loopd wrote it, normalized to UTC on the way in (:func:`loopd_es.clock.utc_text`) by :func:`utc_times`.

loopd writes ``...Z``, kept byte for byte; a hand-edited ``+02:00`` would otherwise reach the log as is, and
a deadline already past would read as not due. Normalizing here, at the edge, keeps every later reader's text
in one shape."""


def _is_time(tp: Any) -> bool:
    if get_origin(tp) is Annotated:
        return any(isinstance(m, msgspec.Meta) and (m.extra or {}).get("time") for m in tp.__metadata__)
    return any(_is_time(arg) for arg in get_args(tp)) if get_origin(tp) in (Union, UnionType) else False


_V = TypeVar("_V")


@cache
def _time_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    hints = get_type_hints(cls, include_extras=True)
    return tuple(name for name in cls.__struct_fields__ if _is_time(hints[name]))


def utc_times(value: _V) -> _V:
    """``value`` with every :data:`Stamp` field, at any depth, normalized to UTC."""
    if isinstance(value, list):
        return cast("_V", [utc_times(v) for v in value])
    if not isinstance(value, msgspec.Struct):
        return value
    changes: dict[str, Any] = {}
    for name in value.__struct_fields__:
        field = getattr(value, name)
        if name in _time_fields(type(value)):
            if isinstance(field, str) and (text := utc_text(field)) != field:
                changes[name] = text
        elif isinstance(field, msgspec.Struct | list) and (inner := utc_times(field)) is not field:
            changes[name] = inner
    return msgspec.structs.replace(value, **changes) if changes else value


def ref_field(name: str, default: Any = msgspec.NODEFAULT) -> Any:
    """A field spelled ``name`` in the reference (``goalID``, ``from``), optional when ``default`` is given."""
    if isinstance(default, list):
        return msgspec.field(name=name, default_factory=list)
    return msgspec.field(name=name, default=default)


class _R(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


# -- state.json -----------------------------------------------------------------------------------


class RefSchedule(_R, frozen=True):
    every_ms: int
    max_runs: int | None = None


class RefConfig(_R, frozen=True):
    prompt_file: str | None = None
    include_files: list[str] | None = None
    progress_file: str | None = None
    checks: list[str] | None = None
    check_cwd: str | None = None
    workspace_write: bool | None = None
    max_turns: int | None = None
    max_no_progress: int | None = None
    max_failures: int | None = None
    compact_every: int | None = None
    timeout_ms: int | None = None
    max_evaluator_rejections: int | None = None
    artifact_dir: str | None = None
    agent: str | None = None
    model: str | None = None
    fallback_models: list[str] | None = None
    schedule: RefSchedule | None = None


class RefBlocker(_R, frozen=True):
    reason: str = ""
    needed: str = ""
    kind: Literal["provider-limit"] | None = None
    at: Stamp = ""


class RefProgress(_R, frozen=True):
    summary: str
    next: str | None = None
    at: Stamp = ""


class RefEvidence(_R, frozen=True):
    summary: str
    evidence: str
    at: Stamp = ""


class RefPending(_R, frozen=True):
    requested_at: Stamp = ""
    model: str | None = None
    agent: str | None = None
    reason: Literal["owner", "quota"] = "owner"


class RefLastSwitch(_R, frozen=True):
    to: str
    at: Stamp = ""
    outcome: Literal["applied", "next-prompt"] = "applied"
    from_: str | None = ref_field("from", None)
    reason: Literal["owner", "quota"] = "owner"


class RefSwitchFailure(_R, frozen=True):
    at: Stamp = ""
    reason: Literal["host-rejected", "catalog-unavailable"] = "host-rejected"


class RefSwitch(_R, frozen=True):
    pending: RefPending | None = None
    last: RefLastSwitch | None = None
    last_failure: RefSwitchFailure | None = None


class RefIdentity(_R, frozen=True):
    model: str
    agent: str


class RefProviderLimit(_R, frozen=True):
    kind: Literal["quota", "rate-limit"]
    source: Literal["prompt-delivery", "session-error"]
    observed_at: Stamp
    model: str | None = None
    status_code: int | None = None
    retry_at: Stamp | None = None


class RefFallback(_R, frozen=True):
    attempted: list[str] = []
    status: Literal["prepared", "exhausted", "unsupported", "unavailable", "disabled"] = "disabled"


class RefGoal(_R, frozen=True):
    id: str
    name: str
    objective: str
    status: GoalStatus
    owner_session_id: str = ref_field("ownerSessionID", "")
    worker_session_id: str | None = ref_field("workerSessionID", None)
    worker_topology: WorkerTopology | None = None
    native_parent_id: str | None = ref_field("nativeParentID", None)
    token_budget: int | None = None
    cost_budget: float | None = None
    parent_model: str | None = None
    parent_agent: str | None = None
    interactive: bool | None = None
    pending_identity: RefIdentity | None = None
    agent_switch: RefSwitch | None = None
    model_switch: RefSwitch | None = None
    last_provider_limit: RefProviderLimit | None = None
    model_fallback: RefFallback | None = None
    tokens_used: int = 0
    cost_used: float | None = None
    time_used_seconds: float = 0.0
    config: RefConfig = RefConfig()
    last_progress: RefProgress | None = None
    completion_evidence: RefEvidence | None = None
    blocker: RefBlocker | None = None
    created_at: Stamp = ""
    updated_at: Stamp = ""


class RefCheck(_R, frozen=True):
    command: str = ""
    exit_code: int | None = None
    stderr: str | None = None
    stdout: str | None = None


class RefAttempt(_R, frozen=True):
    id: str
    status: Literal["running", "passed", "failed"]
    checks: list[RefCheck] = []
    sequence: int = 0
    run_generation: int = 0
    started_at: Stamp = ""
    completed_at: Stamp | None = None
    claimed_summary: str = ""
    claimed_evidence: str = ""
    cwd: str | None = None


class RefRuntime(_R, frozen=True):
    goal_id: str = ref_field("goalID")
    phase: Literal["idle", "queued", "running", "compacting", "waiting_retry", "stopping"] = "idle"
    active_run_id: str | None = ref_field("activeRunID", None)
    lease_expires_at: Stamp | None = None
    consecutive_failures: int = 0
    last_error: str | None = None
    retry_after: Stamp | None = None
    run_count: int = 0
    budget_turn_count: int = 0
    evaluator_rejection_count: int | None = None
    last_rejection_details: str | None = None
    last_verification_attempt: RefAttempt | None = None
    free_retry_pending: bool | None = None
    run_generation: int = 0
    active_prompt_message_id: str | None = ref_field("activePromptMessageID", None)
    accounted_message_ids: list[str] = ref_field("accountedMessageIDs", [])
    schedule_run_count: int | None = None
    next_run_at: Stamp | None = None
    no_progress_count: int = 0
    recent_verification_attempts: list[RefAttempt] = []
    turn_started_at: Stamp | None = None
    last_run_at: Stamp | None = None
    last_schedule_at: Stamp | None = None
    last_compact_at: Stamp | None = None
    active_tool_call_ids: list[str] = ref_field("activeToolCallIDs", [])
    last_parent_notified_at: Stamp | None = None
    last_parent_notified_for: str | None = None
    last_worker_status: str | None = None
    progress_during_turn: bool | None = None
    turn_tokens_used: int | None = None
    force_finish_requested: bool | None = None
    stuck_notified_run_id: str | None = ref_field("stuckNotifiedRunID", None)
    worker_aborted_at: Stamp | None = None
    updated_at: Stamp = ""


class RefWatchState(_R, frozen=True):
    state: Literal["active", "until-matched", "flood-suspended", "budget-exhausted"] = "active"
    matches: int = 0
    pushes: int = 0
    dropped_lines: int = 0


class RefCommand(_R, frozen=True):
    id: str
    title: str
    command: str
    args: list[str] = []
    shell: bool | None = None
    end_reason: EndReason | None = None
    timeout_seconds: int | None = None
    deadline_at: Stamp | None = None
    env_keys: list[str] = []
    watch_filter: str | None = None
    watch_until: str | None = None
    watch_ignore_case: bool | None = None
    watch_until_action: UntilAction | None = None
    watch_state: RefWatchState | None = None
    cwd: str = ""
    owner_session_id: str = ref_field("ownerSessionID", "")
    goal_id: str | None = ref_field("goalID", None)
    notify_on_exit: bool | None = None
    notify_successful_exit: bool | None = None
    pid: int | None = None
    status: Status = "running"
    exit_code: int | None = None
    signal: str | None = None
    cols: int | None = None
    rows: int | None = None
    output_bytes: int = 0
    stream_bytes: int = 0
    truncated: bool = False
    created_at: Stamp = ""
    ended_at: Stamp | None = None
    last_error: str | None = None
    owner_notified_at: Stamp | None = None
    updated_at: Stamp = ""


class RefAwait(_R, frozen=True):
    goal_id: str = ref_field("goalID")
    command_id: str = ref_field("commandID")
    created_at: Stamp = ""
    until: str | None = None
    ignore_case: bool | None = None
    owner_session_id: str | None = ref_field("ownerSessionID", None)


class RefControl(_R, frozen=True):
    """One handled control request of ``state.commandLedger`` (docs/reference/loopd.md#s1-9)."""

    command: str
    request_id: str = ref_field("requestID")
    goal_id: str | None = ref_field("goalID", None)
    accepted_at: Stamp = ""
    completed_at: Stamp = ""


class RefState(_R, frozen=True):
    version: int
    revision: int = 0
    goals: list[RefGoal] = []
    runtimes: list[RefRuntime] = []
    commands: list[RefCommand] = []
    command_awaits: list[RefAwait] = []
    command_ledger: list[RefControl] = []


class LoadedState(msgspec.Struct, frozen=True, kw_only=True):
    """The typed, upgraded snapshot and where it came from (``source_version`` before the upgrade)."""

    path: Path
    state: RefState
    source_version: int
    sha256: str
    document: dict[str, Any] = {}
    """The file as read, before the upgrade: what the import report accounts for, key by key."""


def load_state(path: Path) -> LoadedState:
    """Read, upgrade (in memory) and type-check ``state.json``.

    :raises ImportSourceError: when the file is missing, not JSON, not a loopd state of a known version, or
        a field has the wrong type (the message has the JSON path).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ImportSourceError(
            path, "the file does not exist (is this an opencode-loopd project?)"
        ) from None
    except OSError as e:
        raise ImportSourceError(path, f"cannot read it ({e.strerror or e})") from None
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise ImportSourceError(path, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ImportSourceError(path, f"expected a JSON object, got {type(doc).__name__}")
    version = doc.get("version")
    if type(version) is not int or not 1 <= version <= STATE_VERSION:
        raise ImportSourceError(
            path,
            f"unknown state version {version!r}: this import reads opencode-loopd state versions 1 to "
            f"{STATE_VERSION}",
        )
    for key in ("goals", "runtimes"):
        if not isinstance(doc.get(key, []), list):
            raise ImportSourceError(path, f"expected `{key}` to be an array, got {type(doc[key]).__name__}")
    if "goals" not in doc:
        raise ImportSourceError(path, "no `goals` array: this is not an opencode-loopd state file")
    upgraded = upgrade(doc)
    whole_numbers(upgraded)
    try:
        state = utc_times(msgspec.convert(upgraded, RefState))
    except msgspec.ValidationError as e:
        raise ImportSourceError(path, f"wrong shape: {e}") from None
    return LoadedState(
        path=path,
        state=state,
        source_version=version,
        sha256=hashlib.sha256(raw).hexdigest(),
        document=doc,
    )


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """Bring a state document of version 1-8 to version 9 the way loopd's reader does
    (docs/reference/loopd.md#s1-11).

    Works on a copy; malformed nested entries are left for the typed conversion to report.
    """
    doc = msgspec.json.decode(msgspec.json.encode(doc))  # a deep copy of plain JSON
    version: int = doc["version"]
    runtimes = [rt for rt in doc.get("runtimes", []) if isinstance(rt, dict)]
    goals = [g for g in doc.get("goals", []) if isinstance(g, dict)]
    if version < 2:
        doc.setdefault("commandLedger", [])
        for rt in runtimes:
            rt.setdefault("progressDuringTurn", False)
    if version < 3:
        for rt in runtimes:
            if "turnCount" in rt:
                turns = rt.pop("turnCount")
                rt["budgetTurnCount"] = turns
                rt["runCount"] = turns
            rt.setdefault("runGeneration", 0)
            rt.setdefault("freeRetryPending", False)
            rt.setdefault("activeToolCallIDs", [])
    if version < 4:
        for rt in runtimes:
            rt.setdefault("recentVerificationAttempts", [])
    if version < 5:
        for goal in goals:
            config = goal.get("config")
            if isinstance(config, dict):
                config.setdefault("workspaceWrite", True)
        for rt in runtimes:
            rt.setdefault("unknownStatusCount", 0)
    if version < 6:
        for goal in goals:
            config = goal.get("config")
            if isinstance(config, dict) and "schedule" in config and not valid_schedule(config["schedule"]):
                del config["schedule"]
        for rt in runtimes:
            if not isinstance(rt.get("scheduleRunCount"), int | float) or isinstance(
                rt.get("scheduleRunCount"), bool
            ):
                rt["scheduleRunCount"] = 0
    if version < 7:
        doc.setdefault("commands", [])
    if version < 8:
        doc.setdefault("commandAwaits", [])
    doc["version"] = STATE_VERSION
    return doc


def valid_schedule(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    every = value.get("everyMs")
    return isinstance(every, int | float) and not isinstance(every, bool) and every >= 1000
