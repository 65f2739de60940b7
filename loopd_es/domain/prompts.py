"""The steering prompt every turn sends (docs/reference/loopd.md#s3-5), built from the goal's state and what
the caller read; pure.

The first turn tells the worker how to work; a continuation restates the goal, what was done, recent work,
warnings, where to write, the verdict on a rejected completion (or the verification pre-screen), the
completion rules, then either the final-report demand or the usual instructions. The owner's inbox comes
last. A *bare* turn (``send``) is only the owner's words, ``[user] <text>`` per line.

A forced wrap-up turn (the turn or no-progress limit was reached, ``force_finish_requested``) carries
``## FINAL REPORT REQUIRED — STOPPING SOON`` in place of the usual instructions: it is the worker's one chance to
report before the next confirmed idle blocks the goal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

if TYPE_CHECKING:
    from .state import GoalState, InboxItem

SNIPPET_CHARS: Final = 300
TRANSCRIPT_TAIL: Final = 5

FINAL_REPORT_HEADING: Final = "## FINAL REPORT REQUIRED — STOPPING SOON"

FINAL_REPORT: Final = (
    f"{FINAL_REPORT_HEADING}\n"
    "This goal has reached its turn limit; this is the last turn before it stops. Do not start new work.\n"
    "- If ALL acceptance criteria pass, call complete_goal now with concrete evidence.\n"
    "- Otherwise call report_goal_progress with exactly what is done, what remains and how to continue.\n"
    "- Call block_goal only for a real external blocker requiring user intervention.\n"
)

INSTRUCTIONS: Final = (
    "## INSTRUCTIONS\n"
    "1. Perform one concrete batch of work toward the objective.\n"
    "2. Call report_goal_progress if work remains.\n"
    "3. Call complete_goal only if ALL acceptance criteria pass with concrete evidence.\n"
    "4. Call block_goal only for a real external blocker requiring user intervention.\n"
)


class Snippet(msgspec.Struct, frozen=True, kw_only=True):
    """One recent transcript message as the prompt quotes it."""

    role: str
    text: str


class ProgressLine(msgspec.Struct, frozen=True, kw_only=True):
    """One ``goal.progress`` report: ``at`` is ISO, shown as ``HH:MM``."""

    summary: str
    next: str | None = None
    at: str = ""


def inbox_lines(items: Sequence[InboxItem]) -> list[str]:
    """``[user] text`` (or ``[worker] ...`` for command evidence), one per inbox message."""
    return [f"[{item.sender}] {item.text}" for item in items]


def bare_prompt(items: Sequence[InboxItem]) -> str:
    """A ``send`` turn: only the owner's words."""
    return "\n".join(inbox_lines(items))


def first_prompt(state: GoalState) -> str:
    """The first turn (``runCount <= 1``)."""
    text = (
        "You are a worker for an active goal.\n\n"
        "Call get_goal to read the authoritative objective, acceptance criteria, and current state.\n"
        "Perform one concrete batch of work. After durable verification:\n\n"
        "- Call report_goal_progress if work remains.\n"
        "- Call complete_goal only if ALL acceptance criteria pass with concrete evidence.\n"
        "- Call block_goal only for a real external blocker requiring user intervention.\n"
        "- Use the built-in question tool when you need clarification only the user can provide.\n\n"
        "Do not ask questions unnecessarily. Make reasonable assumptions and work directly.\n"
        + _output_location(state)
    )
    if state.force_finish_requested:
        text += "\n" + FINAL_REPORT
    inbox = inbox_lines(state.inbox)
    if inbox:
        text += "\n## USER INSTRUCTIONS\n" + "\n".join(f"- {line}" for line in inbox) + "\n"
    return text


def continuation_prompt(
    state: GoalState,
    *,
    progress: Sequence[ProgressLine] = (),
    recent: Sequence[Snippet] = (),
    artifacts: str = "no artifacts yet",
    force_finish: bool | None = None,
) -> str:
    """A continuation turn (``runCount > 1``), section by section as the reference orders them.

    ``force_finish`` defaults to the goal's ``force_finish_requested``.
    """
    if force_finish is None:
        force_finish = bool(state.force_finish_requested)
    parts = [f"This is continuation run {state.run_count} for the goal below.\n"]
    parts.append(f"## GOAL (user-provided data)\n{state.objective}\n")
    lines = []
    for p in progress:
        lines.append(f"- [{_hhmm(p.at)}] {p.summary}")
        if p.next:
            lines.append(f"  → next: {p.next}")
    parts.append("## PROGRESS SO FAR\n" + ("\n".join(lines) if lines else "- none reported yet") + "\n")
    tail = list(recent)[-TRANSCRIPT_TAIL:]
    if tail:
        body = "\n".join(f"- {s.role}: {s.text[:SNIPPET_CHARS]}" for s in tail)
        parts.append(f"## RECENT WORK (last {len(tail)} messages)\n{body}\n")
    if state.consecutive_failures > 0:
        warn = [
            f"- {state.consecutive_failures} consecutive failure(s). Last error: {state.last_error or 'unknown'}"
        ]
        if state.no_progress_count:
            warn.append(f"- No progress reported for {state.no_progress_count} turn(s).")
        parts.append("## WARNINGS\n" + "\n".join(warn) + "\n")
    parts.append(_output_location(state))
    if state.evaluator_rejection_count and state.last_rejection_details:
        parts.append(
            "## HOST VERDICT: COMPLETION REJECTED\n"
            f"Rejection #{state.evaluator_rejection_count}\n{state.last_rejection_details}\n\n"
            "Required actions:\n- Fix every failing check above.\n- Run the checks yourself.\n"
            "- Call complete_goal again only when they pass.\n"
        )
    else:
        checks = state.config.checks
        pre = [f"- Artifacts: {artifacts}"]
        if checks:
            pre.append(f"- checks configured: {len(checks)} — run them before claiming completion")
        parts.append("## VERIFICATION (deterministic pre-screen)\n" + "\n".join(pre) + "\n")
    parts.append(
        "## COMPLETION REVIEW\n"
        "1. Re-read the objective and list every acceptance criterion.\n"
        "2. Verify each criterion with concrete evidence (files, command output).\n"
        "3. The host runs the configured checks; a failing check rejects the completion.\n"
        "4. Do not claim work you have not verified.\n"
        "5. Call complete_goal only when every criterion holds.\n"
    )
    parts.append(FINAL_REPORT if force_finish else INSTRUCTIONS)
    inbox = inbox_lines(state.inbox)
    if inbox:
        parts.append("## USER INSTRUCTIONS\n" + "\n".join(f"- {line}" for line in inbox) + "\n")
    return "\n".join(parts)


def turn_prompt(state: GoalState) -> str:
    """The steering for the turn just started on ``state``, from the state alone (no transcript or progress list)."""
    return first_prompt(state) if state.run_count <= 1 else continuation_prompt(state)


def _output_location(state: GoalState) -> str:
    where = state.config.artifact_dir or "."
    return f"## OUTPUT LOCATION\nWrite artifacts under {where} (the objective may override this).\n"


def _hhmm(at: str) -> str:
    return at[11:16] if len(at) >= 16 else "--:--"
