"""What the engine's parts need from each other, as narrow protocols: no part holds the whole engine.

The engine (:class:`~loopd_es.engine.core.Engine`) wires its parts together and hands each the few
collaborators it uses: the goal service as :class:`GoalLog`, the engine's own turn flow as :class:`TurnDriver`,
the outbox as :class:`Notifier`, the idle gate as :class:`IdleSignal`, the switch recovery of the goal use
cases as :class:`Switches`, and to the balance pass the engine as one member's :class:`Holder`. A part keeps
its own state and changes another's only through these methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..app.service import Ctx
    from ..app.turns import Kind, Transcript, TurnReport
    from ..domain import goal_commands as c
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..events.notification import NotificationKind
    from ..host.events import TranscriptMessage
    from ..sagas.identity_switch import SwitchReport
    from .outbox import CommandOwner


class GoalLog(Protocol):
    """Goals as the parts read and change them: folded state, and goal commands decided and appended."""

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream (``exists=False`` when there is none)."""
        ...

    async def execute(
        self, command: c.GoalCommand, ctx: Ctx, *, event_id: str | None = None
    ) -> list[Envelope]:
        """Decide ``command`` on the goal's current version and append the result (``[]``: nothing happened)."""
        ...


class TurnDriver(Protocol):
    """How a part moves a goal on: the next turn, what follows a confirmed run, usage of a transcript."""

    async def continue_goal(
        self,
        goal_id: str,
        ctx: Ctx,
        *,
        explicit: bool = False,
        force: bool = False,
        kind: Kind = "steer",
        transcript: Transcript | None = None,
    ) -> TurnReport | None:
        """The next turn if the goal may have one (``None``: a refused pending switch blocked the goal)."""
        ...

    async def after_confirm(
        self, goal_id: str, recorded: list[Envelope], ctx: Ctx, transcript: Transcript | None = None
    ) -> None:
        """After ``run.completed``: the force-finish turn, compaction, or the next turn."""
        ...

    async def confirm_turn(
        self, goal_id: str, confirm: Sequence[c.GoalCommand], ctx: Ctx, transcript: Transcript | None
    ) -> None:
        """Record a confirmed run (its usage and confirmation), and the next run's start in the same commit when
        a plain turn follows; else what :meth:`after_confirm` does."""
        ...

    async def account(self, goal_id: str, messages: list[TranscriptMessage], ctx: Ctx) -> None:
        """Usage of the completed assistant messages not yet counted."""
        ...


class IdleSignal(Protocol):
    """The two-stage idle (:class:`~loopd_es.engine.idle.IdleGate`)."""

    async def on_idle(self, goal_id: str) -> bool:
        """An idle signal for the goal's worker; ``False`` when it concerns no running turn."""
        ...


class Switches(Protocol):
    """Identity switches a stopped process left open, and the turns owners asked for meanwhile."""

    async def recover(self, ctx: Ctx | None = None, *, only: str | None = None) -> list[SwitchReport]:
        """Settle open switches (of goal ``only``) from the host's truth."""
        ...

    async def run_requested(self, goal_id: str, ctx: Ctx) -> TurnReport | None:
        """The turn an owner asked for during a switch, once no switch is in flight."""
        ...


class Notifier(Protocol):
    """Owner notices, recorded once and delivered exactly once (:class:`~loopd_es.engine.outbox.Outbox`)."""

    def known(self, notification_id: str) -> bool:
        """Whether the notice was recorded already."""
        ...

    async def request(
        self, to: GoalState | CommandOwner, kind: NotificationKind, text: str, cause_event_id: str, ctx: Ctx
    ) -> str:
        """Record the notice (once) and deliver it; returns its id."""
        ...

    async def deliver(self) -> int:
        """Deliver every pending notice this process may deliver; returns how many were shown."""
        ...

    def pending_for(self, goal_id: str) -> bool:
        """Whether a notice of the goal waits for delivery."""
        ...


class Holder(Protocol):
    """One member of a shared group as its balance pass sees it: the goals it knows, and taking one over."""

    def goal_ids(self) -> list[str]:
        """Every goal the member has seen in the log."""
        ...

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream."""
        ...

    def pending(self, goal_id: str) -> bool:
        """Whether notices or awaits of the goal still wait to be handled (its holder keeps it until then)."""
        ...

    async def adopt(self, goal_id: str, *, resend: bool) -> None:
        """Finish what the goal's previous holder may have left half done, as a restart would."""
        ...
