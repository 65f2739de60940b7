"""The two-stage idle's rules that need no engine: what a transcript says about a turn's end, and the precision
an idle candidate's time is compared at (docs/reference/loopd.md#s2-3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..host.events import TranscriptMessage


def confirm_failure(
    transcript: list[TranscriptMessage], prompt: str, *, anchored: bool
) -> Literal["prompt-outside-window", "assistant-incomplete"] | None:
    """Why the transcript cannot confirm the turn's end (docs/reference/loopd.md#s2-3 step 7), or ``None``
    when it can."""
    users = [m for m in transcript if m.role == "user"]
    latest_is_prompt = bool(users) and users[-1].message_id == prompt
    if not latest_is_prompt and not anchored:
        return "prompt-outside-window"
    completed = any(m.role == "assistant" and m.parent_id == prompt and m.completed for m in transcript)
    if not anchored and not completed:
        return "assistant-incomplete"
    return None


def may_end_turn(message: TranscriptMessage) -> bool:
    """Whether a completed answer can be the last of its turn: it stopped for a reason other than a tool call
    and without an error (a tool step's answer is followed by the answer to the tool's result)."""
    return (
        message.role == "assistant"
        and message.completed
        and message.finish not in (None, "", "tool-calls", "unknown")
        and message.error is None
    )


def turn_proven(transcript: list[TranscriptMessage], prompt: str) -> bool:
    """Whether the transcript alone proves that the turn answering ``prompt`` is over, so no quiet period is
    needed: its last message is an assistant answering ``prompt`` that is completed, stopped for a reason other
    than a tool call, ended without an error and has no tool still running, and no user message came after
    ``prompt``.

    Anything else (no answer yet, a tool turn's first message, an error that may still be reported, a queued
    prompt, a trailing tool part) is left to the two-stage idle's quiet period.
    """
    if not transcript:
        return False
    last = transcript[-1]
    if not may_end_turn(last) or last.parent_id != prompt or last.tools_running:
        return False
    if any(m.tools_running for m in transcript if m.role == "assistant" and m.parent_id == prompt):
        return False
    users = [m for m in transcript if m.role == "user"]
    return bool(users) and users[-1].message_id == prompt
