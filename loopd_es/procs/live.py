"""A running command's record with what only its owner knows yet: the counts that change with every chunk of
output (docs/reference/loopd.md#s2-4: a suspended watch counts every further non-blank line in droppedLines).

The reference persisted these with every output chunk; loopd-es keeps output out of the log (no event per chunk),
so a reader asks the live owner (its ``status`` request) and folds the answer into the record it shows. A command
that is not running, or an owner that does not answer in time, shows what the log holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec

from .owner_link import OwnerAnswer, Status, owner_request

if TYPE_CHECKING:
    from ..domain.command import CommandState
    from .paths import CommandPaths

LIVE_ANSWER_WITHIN_S: Final = 2.0
"""How long a read waits for the owner's live counts before it shows the logged ones."""


async def live_answer(paths: CommandPaths, state: CommandState) -> OwnerAnswer | None:
    """The owner's ``status`` answer for a running command here, or ``None``."""
    if not state.running or not paths.runs_here(state.machine):
        return None
    answer = await owner_request(paths, state.id, Status(), LIVE_ANSWER_WITHIN_S)
    return answer if answer is not None and answer.ok else None


def with_live(state: CommandState, answer: OwnerAnswer | None) -> CommandState:
    """``state`` with the owner's live byte counts and watch drop count (unchanged without an answer)."""
    if answer is None or not state.running:
        return state
    changes: dict[str, int] = {}
    if answer.stream_bytes is not None:
        changes["stream_bytes"] = max(state.stream_bytes, answer.stream_bytes)
    if answer.output_bytes is not None:
        changes["output_bytes"] = answer.output_bytes
    if answer.dropped is not None and state.watch is not None:
        changes["watch_dropped_lines"] = answer.dropped
    return msgspec.structs.replace(state, **changes)
