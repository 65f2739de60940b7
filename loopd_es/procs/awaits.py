"""Awaits on command sessions: a goal waits for a command's exit (or a line matching ``until``), and awaits are
cancelled with the goal (docs/reference/loopd.md#s3-18).

An await is registered on the command's stream; when its condition already holds it fires at once, and the
command's owner is told to look again so a live await fires the moment the condition does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..domain.command import (
    CommandNotFoundError,
    CommandState,
    compile_watch_regex,
    decide_await,
    decide_cancel_goal_awaits,
)
from ..ids import check_id
from .outlog import stored_facts, until_matches
from .owner_link import Refresh, owner_request
from .service import append_decided, list_states, load_state, reconcile

if TYPE_CHECKING:
    from ..events.base import Caller, Event
    from ..log.base import LogStore
    from .paths import CommandPaths


async def request_await(
    store: LogStore,
    paths: CommandPaths,
    command_id: str,
    *,
    goal_id: str,
    until: str | None,
    ignore_case: bool,
    owner_session_id: str | None = None,
    goal_name: str | None = None,
    called_by: Caller | None = None,
) -> tuple[list[Event], str]:
    """Register an await (or fire it at once when its condition already holds); tells the owner to look.

    ``owner_session_id`` is recorded as the session that asked; ``goal_name`` names the goal in the message.
    """
    check_id("goal", goal_id)
    await reconcile(store, paths, only=command_id)
    pattern = compile_watch_regex("until", until, ignore_case) if until else None
    message = ""
    raced = False
    state = await load_state(store, command_id)

    def decide(s: CommandState) -> list[Event]:
        nonlocal message
        facts = stored_facts(paths.log(command_id), s.stream_bytes)
        matched = until_matches(paths.log(command_id), pattern) if pattern is not None and s.running else None
        events, message = decide_await(
            s,
            goal_id=goal_id,
            until=until,
            ignore_case=ignore_case,
            output=facts,
            matched=matched,
            raced=raced and not s.running,
            owner_session_id=owner_session_id,
            goal_name=goal_name,
        )
        return events

    if state is None or state.removed:
        raise CommandNotFoundError()
    raced = state.running
    events, state = await append_decided(store, command_id, decide, state, called_by=called_by)
    if state.running and state.await_for(goal_id) is not None:
        await owner_request(paths, command_id, Refresh())
    return events, message


async def cancel_goal_awaits(
    store: LogStore,
    goal_id: str,
    reason: str,
    *,
    causation_id: str | None = None,
    correlation_id: str | None = None,
) -> int:
    """Cancel every await of a goal (``goal paused`` / ``goal cleared``); returns how many were cancelled.

    The causal ids link each cancellation to the pause or clear that caused it, for ``explain``.
    """
    count = 0
    for s in await list_states(store):
        if s.await_for(goal_id) is not None:
            events, _ = await append_decided(
                store,
                s.id,
                lambda st: decide_cancel_goal_awaits(st, goal_id, reason),
                s,
                causation_id=causation_id,
                correlation_id=correlation_id,
            )
            count += len(events)
    return count
