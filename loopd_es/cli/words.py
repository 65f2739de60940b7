"""The CLI's words for what the shared rules say in the reference's (OpenCode tool) words.

The deciders and operations answer owners and workers in OpenCode, so their messages name tools ("Use
resume_goal or retry_goal."). A person at a shell has commands instead: :func:`cli_words` rewrites those names
in a message the CLI prints, so each interface names its own way forward.
"""

from __future__ import annotations

import re
from typing import Final

TOOL_COMMANDS: Final = {
    "resume_goal": "`loopd-es goal resume`",
    "retry_goal": "`loopd-es goal retry`",
    "pause_goal": "`loopd-es goal pause`",
    "clear_goal": "`loopd-es goal clear`",
    "nudge_goal": "`loopd-es owner nudge`",
    "send_goal_input": "`loopd-es owner send`",
    "abort_goal_worker": "`loopd-es owner abort`",
    "inspect_background_goal": "`loopd-es goal show`",
    "list_background_goals": "`loopd-es goals`",
    "switch_goal_identity": "`loopd-es goal switch-identity`",
    "loopd_list_models": "`loopd-es models --usable`",
    ":send/nudge": "`loopd-es owner send|nudge`",
}
_TOOL: Final = re.compile(
    "|".join(
        rf"(?<![\w`]){re.escape(name)}(?![\w`])" for name in sorted(TOOL_COMMANDS, key=len, reverse=True)
    )
)


def cli_words(message: str) -> str:
    """``message`` with every OpenCode tool it names replaced by the ``loopd-es`` command that does the same."""
    return _TOOL.sub(lambda m: TOOL_COMMANDS[m.group(0)], message)
