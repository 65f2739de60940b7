"""Which recorded events the owner must hear about, and the reference's words for each
(docs/reference/loopd.md#s3-13, #s3-16, #s3-22).

The engine derives every notice from the log as it catches up, keyed by the event that caused it, so a notice
is recorded (once) even when the process that wrote its cause crashed before asking for it, or when no engine
ran at the time: the owner hears about it when an engine next runs. Operations that know a notice is due also
ask for it at once; both give the same notification id, so it is recorded and shown once.

Told: a verified completion; a block by the worker, by the rejection limit, by repeated session errors, or by an
ignored force-finish; a budget stop that aborted the worker; a stuck run. Not told: the owner's own force
complete or force block, and blocks at start or by a refused switch (the reference is silent there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..events import goal as g
from ..events import run as r
from ..events.catalogue import decode_payload

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..events.notification import NotificationKind

NOTICE_TYPES: Final = frozenset({"goal.completed", "goal.blocked", "goal.budget_exhausted", "run.stuck"})
FORCE_FINISH_SUFFIX: Final = " (force-finish ignored)"


def notice_for(env: Envelope, state: GoalState) -> tuple[NotificationKind, str] | None:
    """The kind and text of the notice ``env`` calls for, or ``None``; ``state`` is the goal now."""
    if (env.correlation_id or "").startswith("import-"):
        return None  # history brought from opencode-loopd was told there
    e = decode_payload(env)
    name = state.name
    if isinstance(e, g.GoalCompleted):
        if e.forced:
            return None
        artifacts = state.config.artifact_dir or "n/a"
        return (
            "complete",
            f'Loop goal "{name}" completed: {e.summary}. Evidence: {e.evidence}. Artifacts: {artifacts}.',
        )
    if isinstance(e, g.GoalBlocked):
        if e.source == "session-error":  # in the reference's words (its loop engine), the error's own message
            failures = e.failures if e.failures is not None else state.consecutive_failures
            return (
                "failed",
                f'Loop goal "{name}" blocked after {failures} failures. Last error: {e.last_error}.',
            )
        if e.reason.endswith(FORCE_FINISH_SUFFIX):
            progress = state.last_progress.summary if state.last_progress is not None else "none"
            return "stopped", (
                f'Loop goal "{name}" stopped: {e.reason.removesuffix(FORCE_FINISH_SUFFIX)} (child did not wrap up). '
                f"Status: blocked. Last progress: {progress}."
            )
        if e.source in ("worker", "evaluator"):
            return "blocked", f'Loop goal "{name}" blocked: {e.reason}. Needed: {e.needed}.'
        return None
    if isinstance(e, g.GoalBudgetExhausted):
        if not e.worker_aborted:
            return None  # a stop at idle confirmation is not told (G16)
        return "stopped", (
            f'Loop goal "{name}" stopped: {e.reason}. Worker aborted, status: budget_limited. '
            "Resume with resume_goal to continue spending."
        )
    if isinstance(e, r.RunStuck):
        minutes = max(1, int(e.stuck_seconds // 60))
        if e.watchdog == "idle-unconfirmed":
            return "stuck", (
                f'Loop goal "{name}" worker is idle but its turn will not confirm (unconfirmed for {minutes}m, no '
                "activity). The goal remains active; use inspect_background_goal to look, nudge_goal to re-prompt, "
                "or pause_goal to stop it."
            )
        return "stuck", (
            f'Loop goal "{name}" worker may be stuck: no activity for {minutes}m while reporting '
            f"{e.worker_status or 'busy'}, lease expired."
            " The goal remains active; use inspect_background_goal to look, nudge_goal to re-prompt, or "
            "pause_goal to stop it."
        )
    return None
