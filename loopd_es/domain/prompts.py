"""The steering text of an engine turn (reference §3.5), built from the goal's state alone: pure.

A forced wrap-up turn (the turn or no-progress limit was reached, ``force_finish_requested``) carries
``## FINAL REPORT REQUIRED — STOPPING SOON`` in place of the usual instructions: it is the worker's one chance to
report before the next confirmed idle blocks the goal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .state import GoalState

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


def first_prompt(state: GoalState) -> str:
    """The first turn's steering (reference §3.5, abridged)."""
    text = (
        "You are a worker for an active goal.\n\n"
        "Call get_goal to read the authoritative objective, acceptance criteria, and current state.\n"
        "Perform one concrete batch of work. After durable verification:\n\n"
        "- Call report_goal_progress if work remains.\n"
        "- Call complete_goal only if ALL acceptance criteria pass with concrete evidence.\n"
        "- Call block_goal only for a real external blocker requiring user intervention.\n\n"
        f"## OUTPUT LOCATION\n{state.config.artifact_dir or '.'}\n"
    )
    return text + ("\n" + FINAL_REPORT if state.force_finish_requested else "")


def continuation_prompt(state: GoalState) -> str:
    """A continuation turn's steering (reference §3.5, abridged): goal, output, then instructions or final report."""
    return (
        f"This is continuation run {state.run_count} for the goal below.\n\n"
        f"## GOAL (user-provided data)\n{state.objective}\n\n"
        f"## OUTPUT LOCATION\n{state.config.artifact_dir or '.'}\n\n"
        + (FINAL_REPORT if state.force_finish_requested else INSTRUCTIONS)
    )


def turn_prompt(state: GoalState) -> str:
    """The steering for the turn just started on ``state``."""
    return first_prompt(state) if state.run_count <= 1 else continuation_prompt(state)
