"""What the session that started a command is told, and when (docs/reference/loopd.md#s3-17 "Owner exit
notification").

Pure: the engine passes the command folded from its stream (and the output tail its exit recorded) and gets
the text of the owner's exit notice, or ``None``. Exactly once is the outbox's business (a notice is keyed
by the event that caused it); this module only decides *whether* and *what*.

Watch pushes need no decision here: the owner process records each push and each flood or budget notice
with its final text (``command.watch-matched`` / ``command.watch-suspended``), and every one of them goes to
the owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..clock import ms_between
from .command import exit_evidence

if TYPE_CHECKING:
    from .command_state import CommandState

NOTIFY_LONG_RUNNING_MS: Final = 120_000
"""A successful run at least this long is told even where successful exits are not."""

NOTIFY_SUCCESSFUL_EXIT: Final = True
"""The reference's ``start`` sets ``notifySuccessfulExit`` on every command, so a quick exit 0 is told too."""


def until_stop_told(s: CommandState) -> bool:
    """The until line matched with action ``stop``: that push was the owner's one message (no exit ping)."""
    return s.watch_state == "until-matched" and s.watch is not None and s.watch.until_action == "stop"


def should_notify_owner_on_exit(
    s: CommandState, *, notify_successful_exit: bool = NOTIFY_SUCCESSFUL_EXIT
) -> bool:
    """The reference's ``shouldNotifyOwnerOnExit``, in its order; ``False`` while the command runs."""
    if s.running or s.end_reason == "until":
        return False
    if s.notify_on_exit is not None:
        return s.notify_on_exit
    if s.end_reason == "timeout" or s.status == "missing":
        return True
    if s.status != "exited":
        return False  # terminated by the owner: it knows
    if s.exit_code is not None and s.exit_code != 0:
        return True
    if notify_successful_exit:
        return True
    return _ran_ms(s) >= NOTIFY_LONG_RUNNING_MS


def exit_notice_text(s: CommandState, tail: str) -> str:
    """``[command "<title>" (<argv>) <status> <id8>... exitCode=<code|unknown> signal=<sig|none>]\\n<tail>``."""
    return exit_evidence(s, s.status, s.exit_code, s.signal, tail)


def owner_exit_notice(s: CommandState, tail: str) -> str | None:
    """The exit notice the command's owner session gets, or ``None``: no owner (started from the CLI), told
    already (``owner_notified_at``, or the until-stop push), or the policy says no."""
    if not s.owner_session_id or s.owner_notified_at or until_stop_told(s):
        return None
    if not should_notify_owner_on_exit(s):
        return None
    return exit_notice_text(s, tail)


def _ran_ms(s: CommandState) -> float:
    if s.ended_at is None or s.created_at is None:
        return 0.0
    return ms_between(s.ended_at, s.created_at)
