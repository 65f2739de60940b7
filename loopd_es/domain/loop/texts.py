"""User- and model-visible strings of opencode-plugin-loop 0.8.1, verbatim
(docs/reference/loop-plugin.md#s2-7, #s2-8, #s3-3, #s3-6, #s3-14)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ...clock import iso, to_ms
from .jitter import js_round
from .jsclass import js_text, trim_start, utf16_head, utf16_len

if TYPE_CHECKING:
    from datetime import datetime

NO_SESSION: Final = "❌ /loop requires an active session context"
EMPTY: Final = "❌ Empty loop command — see `/loop help`."
ONCE_FIXED_ONLY: Final = (
    "❌ --once is only supported for fixed-interval tasks, e.g. `/loop 30s --once <prompt>`."
)
NO_LIST: Final = "📭 No loop tasks. Use `/loop <prompt>` or `/loop 5m <prompt>` to create one."
LIST_FOOTER: Final = "Manage: `/loop cancel|pause|resume <id>` or `/loop stop-all`"
DEFAULT_MAINTENANCE: Final = (
    "Continue any unfinished work in this session. Check for pending tasks, follow-ups, failing checks or open "
    "review comments, and handle what is actionable now. If there is nothing pending, reply with one line saying "
    'so. When the maintenance loop is no longer useful, call loop_schedule(action="cancel", taskId="<your id>").'
)
HELP: Final = """/loop — run prompts on a schedule

Usage:
  /loop <prompt>                    Adaptive: runs now, the model picks the next check (fallback 1m–1h)
  /loop <interval> <prompt>         Fixed interval: 30s, 5m, 2h, 1d (min 1s); runs immediately, then repeats
  /loop <prompt> every <interval>   Same as above (e.g. "check the deploy every 20m", "every 5 minutes")
  /loop                             Maintenance mode (loop.md is re-read on every run — edits apply next fire)
  /loop help                        Show this help
  /proactive ...                    Full alias of /loop

Subcommands (tasks are bound to the session that created them):
  list | status                     Show this session's loop tasks
  cancel <id>                       Cancel one task
  stop [<id>]                       Cancel one task, or every task in this session when no id is given
  pause <id>                        Pause one task
  resume <id>                       Resume one task
  stop-all                          Cancel all tasks in this session

Flags (recognized only before the prompt begins; use -- to force the rest
to be treated as prompt text verbatim):
  --jitter=true|false               Force Jitter on/off for a fixed task
  --once                            Fire once, then auto-cancel (fixed tasks only)

Claude Code-style flags are accepted too: --cancel, --list, --status,
--pause, --resume, --stop, --stop-all map to the matching subcommand.

Examples:
  /loop 5m check the deploy status
  /loop 30s --once remind me to stretch
  /loop every two minutes check CI
  /loop cancel a1b2c3d4"""
"""The reference's ``/loop help``, word for word (its last example, ``every two minutes``, is adaptive there too)."""


def display_interval(ms: float) -> str:
    """Messages' interval display: ``90s`` -> ``2m``, ``1.5h`` -> ``2h``, ``36h`` -> ``2d`` (half up)."""
    if ms < 60_000:
        return f"{js_text(js_round(ms / 1000))}s"
    if ms < 3_600_000:
        return f"{js_text(js_round(ms / 60_000))}m"
    if ms < 86_400_000:
        return f"{js_text(js_round(ms / 3_600_000))}h"
    return f"{js_text(js_round(ms / 86_400_000))}d"  # 1e+25d for a huge one, as JavaScript writes it


def cut(text: str, n: int) -> str:
    """The first ``n`` UTF-16 units of ``text`` plus ``...`` when it is longer (JavaScript's ``slice``)."""
    return text if utf16_len(text) <= n else utf16_head(text, n) + "..."


def _secs(ms: float) -> str:
    return js_text(ms / 1000)


def unknown_flag(token: str) -> str:
    return f'❌ Unknown flag "{token}". Run `/loop help` to see usage.'


def missing_prompt(token: str) -> str:
    return f'❌ Missing prompt after interval "{token}". Usage: /loop <interval> <prompt> — see `/loop help`.'


def cron(example: str) -> str:
    return (
        "❌ Cron expressions are not supported. Use an interval like `5m` instead, "
        f"e.g. `/loop 5m {example}`."
    )


def invalid_interval(token: str) -> str:
    return f'❌ Invalid interval "{token}". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.'


def max_tasks(n: int) -> str:
    return f"Max tasks ({n}) reached. Cancel some before adding more."


def usage(action: str) -> str:
    return f"❌ Usage: /loop {action} <taskId>"


def no_task(task_id: str) -> str:
    return f"❌ No task {task_id} in this session"


def failed(error: str) -> str:
    return f"❌ /loop failed: {error}"


_ENDED: Final = {
    "user": "been cancelled",
    "once-complete": "run its one time",
    "session-deleted": "ended with its session",
    "expired": "expired",
    "owner-dead": "ended with the process that owned it",
}


def origin_ended(task_id: str, reason: str) -> str:
    """loopd-es's own: a ``/loop`` message handled again after the task it created has ended."""
    return f"🔁 This message already started loop {task_id}, which has since {_ENDED.get(reason, 'ended')}; nothing new was started."


def origin_reused(origin_id: str, task_id: str) -> str:
    """loopd-es's own: a message id that created a task, sent again with other arguments."""
    return (
        f"message {origin_id} already created loop {task_id} from other arguments; "
        "give each /loop command its own message id"
    )


def cancelled(task_id: str) -> str:
    return f"🛑 Cancelled {task_id}"


def paused(task_id: str) -> str:
    return f"⏸ Paused {task_id}"


def resumed(task_id: str) -> str:
    return f"▶ Resumed {task_id}"


def cancelled_n(n: int) -> str:
    return f"🛑 Cancelled {n} task(s) in current session"


def started_fixed(interval_ms: int, prompt: str, task_id: str, session_id: str, once: bool) -> str:
    disp, p50, sid8 = display_interval(interval_ms), cut(prompt, 50), utf16_head(session_id, 8)
    if once:
        return (
            f'🔁 Loop started: every {disp}, prompt "{p50}" [id={task_id}] [s={sid8}] (runs once). '
            f"Cancel: `/loop cancel {task_id}`"
        )
    return (
        f'🔁 Loop started: every {disp} (running now), prompt "{p50}" [id={task_id}] [s={sid8}]. '
        f"Cancel: `/loop cancel {task_id}`"
    )


def started_adaptive(min_ms: int, max_ms: int, prompt: str, task_id: str, session_id: str) -> str:
    return (
        f'🔁 Loop started (adaptive {_secs(min_ms)}s–{_secs(max_ms)}s): "{cut(prompt, 50)}" '
        f"[id={task_id}] [s={utf16_head(session_id, 8)}]. Cancel: `/loop cancel {task_id}`"
    )


def started_maintenance(max_ms: int, task_id: str, session_id: str) -> str:
    return (
        f"🔁 Loop started (maintenance mode): task {task_id} (session {utf16_head(session_id, 8)}). Running now; then "
        f"re-arms every {_secs(max_ms)}s. Use `/loop cancel {task_id}` to stop."
    )


def list_row(
    task_id: str, paused: bool, mode: str, interval_ms: int | None, once: bool,
    min_ms: int | None, max_ms: int | None, prompt: str,
) -> str:  # fmt: skip
    state = "⏸ paused" if paused else "▶ active"
    if mode == "fixed":
        sched = f"every {_secs(interval_ms or 0)}s" + (" • once" if once else "")
    elif mode == "adaptive":
        sched = f"adaptive {_secs(min_ms or 0)}s–{_secs(max_ms or 0)}s"
    else:
        sched = f"maintenance {_secs(max_ms or 0)}s"
    return f"  [{task_id}] {state} • {sched} • {cut(prompt, 60)}"


def first_run_prompt(task_id: str, interval_ms: int, prompt: str) -> str:
    return "\n".join(
        [
            f"The /loop task {task_id} has just been scheduled to run every {display_interval(interval_ms)}. This is "
            "its first execution — it runs now, then repeats on schedule (cancel anytime with: "
            f"/loop cancel {task_id}).",
            "Briefly confirm the schedule in the user's language, then perform the task described below now and "
            "report the result concisely.",
            "",
            prompt,
        ]
    )


_PRESENT: Final = (
    "Present this result to the user, written in the same language the user used in their request:",
    "- If it is a task list, render it as a markdown table with columns: Job ID, frequency, content, and type "
    "(every task is a session-scoped loop that auto-expires after 7 days idle). Keep the management commands "
    "(`/loop cancel|pause|resume <id>`, `/loop stop-all`) mentioned below the table.",
    "- If it confirms an action (cancel, pause, resume, stop-all), confirm concisely which task was affected and "
    "whether it will trigger again.",
    "- If it is help text or an empty state, present it naturally.",
    "Do not call tools in this reply, and do not execute any task prompt in this reply — scheduled tasks run "
    "automatically when they are due.",
)
"""The reference's presentation instructions for a command's result."""


def creation_confirmation(task_id: str, interval_ms: int, prompt: str, once: bool) -> str:
    suffix = " (runs once)" if once else ""
    return "\n".join(
        [
            "The opencode-plugin-loop plugin has successfully created a scheduled loop task from the user's /loop "
            "command:",
            f'- Task: "{prompt}"',
            f"- Schedule: every {display_interval(interval_ms)}{suffix}",
            f"- Job ID: {task_id}",
            f"- Cancel anytime with: /loop cancel {task_id}",
            "Reply to the user with a short confirmation that the scheduled loop task was created, written in the same "
            "language the user used in their request. Include the task, schedule, and job ID from above. This reply "
            "is only the creation confirmation — the plugin executes the task automatically at each scheduled time, "
            "so do not execute the task and do not call tools in this reply.",
        ]
    )


def adaptive_prompt(task_id: str, prompt: str, next_due_at: datetime, min_ms: int, max_ms: int) -> str:
    return (
        f"{prompt}\n\n<adaptive_loop_schedule>\n"
        f"This is Adaptive loop task {task_id}. Complete the user request above first. After observing the current "
        "session state and this execution's result, decide whether the next run needs a different time.\n\n"
        f"A fallback run is already scheduled at {to_ms(next_due_at)} ({iso(next_due_at)}), using the allowed delay range "
        f"{min_ms}ms to {max_ms}ms. Keep that fallback by making no scheduling tool call when it is appropriate.\n\n"
        'If the user\'s request contains a clear, stable recurring cadence (for example, "every two minutes"), '
        "convert this Adaptive task to a permanent Fixed task after completing the request. Call loop_schedule "
        f'exactly once with action="set_fixed", taskId="{task_id}", and intervalMs set to that relative period in '
        "milliseconds. Fixed conversion defaults to jitter disabled, so repeated runs use the exact requested "
        "interval.\n\n"
        "If the next time should instead depend on this execution's result, call loop_schedule exactly once with "
        f'action="reschedule", taskId="{task_id}", and delayMs set to a relative delay from now within {min_ms}ms '
        f"to {max_ms}ms. An accepted in-range delay is stored without jitter; only an out-of-range delay is clamped "
        "to the nearest bound. Prefer a shorter delay for pending, rapidly changing, or retryable conditions and a "
        "longer delay for stable or slow-moving conditions. Do not calculate an epoch timestamp when delayMs can "
        "express the decision.\n\n"
        "If the task is fully complete and no future check is useful, call loop_schedule with "
        f'action="cancel" and taskId="{task_id}". Do not claim that the schedule changed unless the tool call '
        "succeeds.\n</adaptive_loop_schedule>"
    )


def fire_text(task_id: str, prompt: str) -> str:
    return (
        f"This is the scheduled execution of /loop task {task_id}. Perform the task described below now, then "
        f"report the result concisely.\n\n{prompt}"
    )


def maintenance_unchanged(task_id: str) -> str:
    return (
        f"This is the scheduled execution of /loop maintenance task {task_id}. The maintenance instructions from "
        "loop.md are unchanged since the previous run earlier in this conversation — refer to them above.\n"
        "If there is pending maintenance work, perform it now and report concisely. If nothing is pending, reply "
        f'with one line saying so and call loop_schedule(action="cancel", taskId="{task_id}") to end the loop.'
    )


def maintenance_changed(task_id: str, content: str) -> str:
    return (
        f"This is the scheduled execution of /loop maintenance task {task_id}. The maintenance instructions from "
        "loop.md (re-read at fire time; they may have been edited since the last run) follow below — perform "
        "them now, then report concisely.\n"
        "When the work is complete and no further checks are needed, call "
        f'loop_schedule(action="cancel", taskId="{task_id}") to end the loop.\n\n{content}'
    )


def goal_tick(count: int, max_runs: int | None) -> str:
    """The inbox message of a goal-schedule tick (docs/reference/loopd.md#s3-15); ``count`` = completed runs
    before it."""
    shown = f"{count + 1}/{max_runs}" if max_runs is not None else f"{count + 1}"
    return (
        f"Scheduled tick {shown} — re-execute the objective now. Previous completion: {count} runs. Ensure "
        "artifact checks pass for this tick (e.g., append timestamp to tick.txt)."
    )


def failure_prompt(message: str) -> str:
    """What the model gets instead of a failed ``/loop`` command (docs/reference/loop-plugin.md#s2-8)."""
    reason = trim_start(message.removeprefix("❌")) if message.startswith("❌") else message
    return (
        f"The user's /loop command failed: {reason}\n"
        "Briefly inform the user that the /loop command failed and why, written in the same language the user used "
        "in their request. Do not call tools in this reply and do not attempt to perform the command arguments as "
        "a separate task."
    )


def presentation_prompt(result: str) -> str:
    """What the model gets instead of a list/cancel/pause/resume/stop/help command
    (docs/reference/loop-plugin.md#s2-8)."""
    for mark in ("📋", "📭"):
        if result.startswith(mark):
            result = trim_start(result.removeprefix(mark))
    return "\n".join(
        [
            "The opencode-plugin-loop plugin has fully handled the user's /loop command. The command result is:",
            "",
            result,
            "",
            *_PRESENT,
        ]
    )
