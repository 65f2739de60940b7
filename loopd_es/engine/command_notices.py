"""The session that started a command hears of it: its exit, its watch pushes (docs/reference/loopd.md#s3-17).

The facts are recorded by the command's owner process, which sees the output: ``command.watch-matched`` and
``command.watch-suspended`` carry the push or notice text. The exit notice's output tail is read from the
command's output log when the notice is recorded (output never enters a command's stream unasked: a process
may print its secrets). The engine derives a notice from each fact as it catches up with the log, as it does
for goals (:mod:`.notices`): keyed by the causing event, so it is recorded once (a restart replays the reaction
and appends nothing) and delivered through the outbox, exactly once. Commands started from the CLI have no
owner session: nobody is told.

A command notice names no goal (a command's goal link is for display only, and a finished goal has no holder):
in a shared group the live member preferred for the command id delivers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from ..app.service import Ctx
from ..domain.command_notice import owner_exit_notice
from ..events import command as cmd
from ..events.catalogue import decode_payload
from ..procs.outlog import tail_text
from ..procs.service import load_state
from .outbox import CommandOwner

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from ..procs.paths import CommandPaths
    from .ports import Notifier

COMMAND_NOTICE_TYPES: Final = ("command.exited", "command.watch-matched", "command.watch-suspended")
COMMAND_TYPES: Final = ("command.started", *COMMAND_NOTICE_TYPES)
"""What the engine reads for command notices: who owns each command, and what happened to it."""


class CommandNotices:
    """Owner sessions of commands (from ``command.started``) and the notices their events call for."""

    def __init__(self, store: LogStore, notifier: Notifier, paths: CommandPaths | None) -> None:
        self.store = store
        """Read only: a command's state when its exit notice is recorded."""
        self.notifier = notifier
        self.paths = paths
        """Where the output logs are (``None``: unknown, the exit notice then has no tail)."""
        self.owners: dict[str, str] = {}
        """command id -> the OpenCode session that started it (commands with an owner only)."""

    def observe(self, env: Envelope) -> bool:
        """Track owners; ``True`` when ``env`` may call for a notice (the engine then reacts to it)."""
        if env.type == "command.started":
            owner = env.data_dict().get("owner_session_id")
            if isinstance(owner, str) and owner:
                self.owners[env.data_dict()["command_id"]] = owner
            return False
        if env.type not in COMMAND_NOTICE_TYPES or (env.correlation_id or "").startswith("import-"):
            return False  # history brought from opencode-loopd was told there
        return env.data_dict().get("command_id") in self.owners

    async def react(self, env: Envelope) -> None:
        """Record (once) and deliver the notice ``env`` calls for, if any."""
        e = decode_payload(env)
        if not isinstance(e, cmd.CommandExited | cmd.WatchMatched | cmd.WatchSuspended):
            return
        owner = self.owners.get(e.command_id)
        kind: Literal["command", "watch"] = "command" if isinstance(e, cmd.CommandExited) else "watch"
        outbox = self.notifier
        if owner is None or outbox.known(f"{env.event_id}:{kind}"):
            return
        if isinstance(e, cmd.CommandExited):
            state = await load_state(self.store, e.command_id)
            text = (
                None if state is None or state.running else owner_exit_notice(state, self._tail(e.command_id))
            )
        else:
            text = e.text or None  # a cleared watch tells nothing
        if text is None:
            return
        ctx = Ctx(env.correlation_id or env.event_id, env.event_id)
        await outbox.request(CommandOwner(e.command_id, owner), kind, text, env.event_id, ctx)

    def _tail(self, command_id: str) -> str:
        return "" if self.paths is None else tail_text(self.paths.log(command_id))
