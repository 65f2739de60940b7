"""Restart a command: stop it if it runs, then start it again as a **new** command (docs/reference/loopd.md#s3-17).

The old record is kept (its output and end reason stay readable); the new one gets the old one's title, program,
arguments, directory, shell flag, timeout, watch, terminal size, exit-notice choice, goal link and owner session.
Environment *values* were never recorded, so they cannot come back: the answer names the keys that are lost, in
the reference's words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..domain.command import CommandNotFoundError, CommandStateError
from ..errors import LoopdError
from .owner_link import Terminate
from .paths import CommandPaths
from .service import StartSpec, command_request, load_state, start_command

if TYPE_CHECKING:
    from ..events.base import Caller
    from ..log.base import LogStore


async def restart_command(
    store: LogStore, store_url: str, command_id: str, *, called_by: Caller | None = None
) -> tuple[str, str]:
    """Stop ``command_id`` if it runs and start its spec again; returns ``(new_id, message)``.

    :raises CommandNotFoundError: when there is no such command.
    :raises CommandStateError: ``Restart aborted: could not stop "<title>": <why>`` when it cannot be stopped
        (nothing new is started then).
    :raises UsageError: when the spec can no longer start (its directory or program is gone).
    """
    state = await load_state(store, command_id)
    if state is None or state.removed:
        raise CommandNotFoundError()
    if state.running:
        try:
            await command_request(store, CommandPaths(store_url), command_id, Terminate(called_by=called_by))
        except LoopdError as e:
            fresh = await load_state(store, command_id)
            if fresh is None or fresh.running:  # it ended on its own meanwhile: go on
                raise CommandStateError(f'Restart aborted: could not stop "{state.title}": {e}') from None
    spec = StartSpec(
        title=state.title,
        command=state.command,
        args=state.args,
        cwd=state.cwd,
        timeout_seconds=state.timeout_seconds,
        shell=state.shell,
        watch=state.watch,
        goal_id=state.goal_id,
        cols=state.cols,
        rows=state.rows,
        notify_on_exit=state.notify_on_exit,
        owner_session_id=state.owner_session_id,
        called_by=called_by,
    )
    new_id, _ = await start_command(store, store_url, spec)
    message = f'Command "{state.title}" restarted as {new_id[:8]}...'
    if state.env_keys:
        message += f" (env {', '.join(state.env_keys)} NOT restored — values are never persisted)"
    return new_id, message
