"""Rules shared by the deciders: model references, the single-writer rule, ownership, number formatting.

Every message is the reference system's own text (docs/reference/loopd.md#s3), because users and their scripts
match on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, ClassVar, Final

from ..errors import EXIT_USAGE, DomainError

if TYPE_CHECKING:
    from .goal_commands import Facts
    from .state import GoalState


MAX_FALLBACK_MODELS: Final = 16
DEFAULT_MAX_FAILURES: Final = 5
DEFAULT_MAX_REJECTIONS: Final = 3
DEFAULT_TIMEOUT_MS: Final = 300_000
RETRY_BACKOFF_CAP_MS: Final = 30_000

GOAL_NOT_FOUND: Final = "Goal not found."
NOT_OWNED: Final = "Goal not found or not owned by this session."
NO_MATCHING_ACTIVE: Final = "No matching active goal for this session."


class RuleError(DomainError):
    """Raised when a command breaks a goal rule; ``code`` is the reference's ``errorCode`` when it has one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class BadArgument(RuleError):
    """A command's argument is invalid on its own (a malformed model, a schedule below its minimum): the
    caller's input is wrong, not the goal's state, so the CLI exits 2 (usage), not 3 (conflict)."""

    exit_code: ClassVar[int] = EXIT_USAGE


MAX_SCHEDULE_EVERY_MS: Final = 100 * 365 * 86_400_000
"""A hundred years: past it a next run's time leaves what dates (and the log's integers) can hold."""


def is_model_ref(value: str) -> bool:
    """``providerID/modelID``: split at the first ``/``, both parts non-empty, no whitespace."""
    provider, slash, model = value.partition("/")
    return bool(slash and provider and model) and not any(ch.isspace() for ch in value)


def invalid_model(value: str, *, long: bool = False) -> str:
    examples = '"openai/gpt-5.6-sol", "ollama/qwen3.8:27b"' if long else '"openai/gpt-5.6-sol"'
    text = f'Invalid model "{value}". Use "providerID/modelID" (e.g. {examples}).'
    return text + " Discover with `opencode models`." if long else text


def unusable_model(model: str, what: str = "Model") -> str:
    """The refusal of a model the host's catalog does not positively know usable, naming it."""
    return f'{what} "{model}" is unavailable or not positively known usable. Discover models with loopd_list_models.'


def assert_writer_slot(state: GoalState, facts: Facts, session: str | None) -> None:
    """The single-writer rule: a writer goal may not become active while another writer is active.

    :raises RuleError: with the reference's message naming the other goal (and its owner if not ``session``).
    """
    if not state.config.workspace_write:
        return
    for other in facts.active_writers:
        if other.goal_id == state.goal_id:
            continue
        raise RuleError(writer_conflict(other.name, other.goal_id, other.owner_session_id, session))


def writer_conflict(name: str, goal_id: str, owner: str, session: str | None) -> str:
    foreign = session is not None and owner != session
    text = f'Workspace-writing goal "{name}" ({goal_id}) is already active'
    if foreign:
        text += f" (owned by session {owner}, not this session)"
    text += ". Pause, block, complete, or clear it before activating another workspace-writing goal."
    if foreign:
        text += " Note: list_background_goals shows only this session's goals; clear/pause it from its owning session."
    return text


def require_goal(state: GoalState, caller: str | None, not_owned: str = NO_MATCHING_ACTIVE) -> None:
    """:raises RuleError: ``Goal not found.`` or the owner-tool targeting message."""
    if not state.exists:
        raise RuleError(GOAL_NOT_FOUND, "not_found")
    if caller is not None and caller != state.owner_session_id:
        raise RuleError(not_owned, "not_found")


def js_number(value: float) -> str:
    """A number as JavaScript prints it (``5``, ``0.5``), for messages copied from the reference."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)


def run_in_time(state: GoalState, now: datetime) -> bool:
    """The running turn has not reached its deadline (the reference's ``leaseIsValid``)."""
    return state.run_deadline is not None and now < state.run_deadline


def stale_run(run_id: str | None, generation: int | None, state: GoalState) -> bool:
    """The run named (by id or generation, when known) is not the goal's current one: its error fails nothing."""
    if generation is not None and generation != state.run_generation:
        return True
    return run_id is not None and state.active_run_id is not None and run_id != state.active_run_id


def after_ms(now: datetime, ms: float) -> datetime:
    return now + timedelta(milliseconds=ms)


def backoff_ms(failures: int, base_ms: int = 1000, cap_ms: int = RETRY_BACKOFF_CAP_MS) -> int:
    """``min(cap, base * 2^failures)``: by default 2 s, 4 s, 8 s, 16 s, then 30 s."""
    return int(min(cap_ms, base_ms * 2 ** min(failures, 16)))


def clean_text(text: str | None) -> str | None:
    """A caller's text trimmed, or None when nothing is left (the reference's ``cleanText``)."""
    return (text.strip() or None) if text is not None else None


def clean_list(texts: Sequence[str]) -> tuple[str, ...]:
    """Each text trimmed, the blank ones dropped, order kept (the reference's ``cleanList``)."""
    return tuple(text for text in (t.strip() for t in texts) if text)
