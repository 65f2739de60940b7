"""Forking a goal at one of its events, and comparing two goals (a fork and its source) side by side.

A fork is a new goal whose state is the source's folded state after the chosen event (``goal.forked_from``
on the new stream, ``goal.forked`` on the source's, in one atomic append), optionally with another model,
agent, objective or budget. Its worker starts from the source worker's transcript up to the matching
message: the last message the source's log knows of at that point (its last prompt or counted reply).
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import parse_cut, parse_rfc3339, stamped_builtins
from ..domain import goal_commands as c
from ..domain.evolve import fold, initial
from ..domain.rules import RuleError, writer_conflict
from ..domain.streams import goal_stream
from ..errors import UsageError
from ..events import goal as g
from ..events.catalogue import new_event
from ..events.envelope import ANY, NO_STREAM
from ..events.imported import happened_at
from ..host.base import ForkedWorker
from ..host.errors import HostError
from .goals import make_artifact_dir
from .writer_slot import writer_slot

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from .service import Ctx, GoalService

_OVERRIDABLE: Final = ("model", "agent", "max_turns", "token_budget", "cost_budget", "max_failures")
"""The configuration a fork may change (besides its name and objective)."""


class ForkPoint(msgspec.Struct, frozen=True, kw_only=True):
    """The source event a fork starts after, and the source's state then."""

    goal_id: str
    position: int
    version: int
    event_id: str
    type: str
    at: str
    worker_session_id: str | None
    message_id: str | None
    """The last worker message the log knew of at that point (a prompt id or a counted reply's id)."""


class ForkReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``loopd-es fork`` did: the new goal, where it branched off, and how its worker was made."""

    goal_id: str
    source_goal_id: str
    point: ForkPoint
    changed: tuple[str, ...]
    worker: ForkedWorker | None = None
    worker_error: str | None = None


async def fork_point(store: LogStore, goal_id: str, at: int | datetime) -> tuple[ForkPoint, GoalState]:
    """The last event of ``goal_id``'s stream at or before ``at`` (a global position, or a time compared
    with each event's effective time), and the goal's state after it.

    :raises UsageError: when the goal has no event by then, or ``at`` is a position past the log's end (a typo
        that would otherwise fork at the goal's last event without a word).
    """
    if isinstance(at, int) and at > (head := await store.head()):
        raise UsageError(
            f"--at {at} is past the end of the log (its last position is {head}); pick one up to it"
        )
    events: list[Envelope] = []
    async for env in store.read_stream(goal_stream(goal_id)):
        if isinstance(at, int) and env.position > at:
            break
        if isinstance(at, datetime) and parse_rfc3339(happened_at(env)) > at:
            break
        events.append(env)
    state = fold(events, initial(goal_id))
    if not events or not state.exists:
        where = f"position {at}" if isinstance(at, int) else at.isoformat()
        raise UsageError(f"goal {goal_id} did not exist yet at {where}; pick a later --at")
    last = events[-1]
    return (
        ForkPoint(
            goal_id=goal_id,
            position=last.position,
            version=last.version,
            event_id=last.event_id,
            type=last.type,
            at=happened_at(last),
            worker_session_id=state.worker_session_id,
            message_id=_last_message(events),
        ),
        state,
    )


def _last_message(events: list[Envelope]) -> str | None:
    """The newest message of the current worker the events name; a new worker starts with none."""
    found: str | None = None
    for env in events:
        if env.type == "goal.worker_assigned":
            found = None
        elif env.type == "run.started":
            found = env.data_dict().get("prompt_message_id") or found
        elif env.type == "goal.usage_accounted":
            ids = env.data_dict().get("message_ids") or ()
            found = ids[-1] if ids else found
    return found


async def _check_identity(service: GoalService, model: str | None, agent: str | None) -> None:
    """A fork's new model or agent must be one the host offers (when it can say), before anything is written.

    :raises UsageError: naming what the host does not offer.
    """
    if model is not None:
        models = await service.host.list_models()
        if models.capability == "supported" and models.find(model) is None:
            offered = ", ".join(m.ref for m in models.models[:8])
            raise UsageError(
                f"the host offers no model {model!r} (it offers {offered}); see `loopd-es models`"
            )
    if agent is not None:
        agents = await service.host.list_agents()
        if agents.capability == "supported" and agent not in agents.names():
            offered = ", ".join(agents.names()[:8])
            raise UsageError(
                f"the host offers no agent {agent!r} (it offers {offered}); see `loopd-es models`"
            )


def parse_at(text: str) -> int | datetime:
    """``--at``: a global position (digits) or an ISO 8601 time.

    :raises UsageError: for anything else.
    """
    value = text.strip()
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        return parse_cut(
            value
        )  # the end of the unit it is written to: a time copied from `history` takes its event
    except ValueError:
        raise UsageError(
            f"invalid --at {text!r}: use a global position (e.g. 42) or an ISO 8601 time "
            "(e.g. 2026-12-02T12:00:00Z)"
        ) from None


async def fork_goal(
    service: GoalService,
    source_id: str,
    at: int | datetime,
    ctx: Ctx,
    *,
    name: str | None = None,
    objective: str | None = None,
    worker: bool = True,
    **overrides: Any,
) -> ForkReport:
    """Record a fork of ``source_id`` after the event at ``at`` and give it a worker of its own.

    ``overrides`` are configuration fields (:data:`_OVERRIDABLE`) to change; ``None`` keeps the source's.

    :raises UsageError: for an unknown field, or a point before the goal existed.
    :raises RuleError: when the fork would be a second active workspace-writing goal.
    """
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
        raise UsageError(
            f"a fork cannot change {', '.join(unknown)}; it can change {', '.join(_OVERRIDABLE)}"
        )
    point, state = await fork_point(service.store, source_id, at)
    changes = {k: v for k, v in overrides.items() if v is not None and getattr(state.config, k) != v}
    await _check_identity(service, changes.get("model"), changes.get("agent"))
    changed = tuple(changes) + (("objective",) if objective not in (None, state.objective) else ())
    goal_id = str(uuid.uuid4())
    for key in ("progress_file", "artifact_dir"):  # the goal's own files: the fork writes beside, not over
        path = getattr(state.config, key)
        if path is not None:
            changes[key] = path.replace(source_id, goal_id)
    config = msgspec.structs.replace(state.config, **changes)
    writer = state.status == "active" and config.workspace_write
    async with (
        contextlib.AsyncExitStack() as held
    ):  # a writer is checked and recorded holding the writer slot
        slot = (await held.enter_async_context(writer_slot(service.store, service.clock)),) if writer else ()
        if writer:  # the single-writer rule, as for a new goal
            for other in await service.goals():
                if other.status == "active" and other.config.workspace_write:
                    raise RuleError(
                        writer_conflict(
                            other.name, other.goal_id, other.owner_session_id, state.owner_session_id
                        )
                    )
        forked_from = g.GoalForkedFrom(
            goal_id=goal_id,
            source_goal_id=source_id,
            at_position=point.position,
            at_version=point.version,
            at_event_id=point.event_id,
            name=name or f"{state.name} (fork)",
            objective=objective if objective is not None else state.objective,
            config=config,
            state=stamped_builtins(state),
            changed=changed,
            at=service.clock.now(),
        )
        forked = g.GoalForked(
            goal_id=source_id,
            fork_goal_id=goal_id,
            at_position=point.position,
            at_version=point.version,
            changed=changed,
        )
        link = {"causation_id": ctx.causation_id, "correlation_id": ctx.correlation_id}
        recorded, _ = await service.store.append_many(
            [
                (goal_stream(goal_id), [new_event(forked_from, **link)], NO_STREAM),
                (goal_stream(source_id), [new_event(forked, **link)], ANY),
            ],
            fences=slot,
        )
    make_artifact_dir(await service.load(goal_id))  # the fork's own, beside the source's
    report = ForkReport(goal_id=goal_id, source_goal_id=source_id, point=point, changed=changed)
    if not worker or point.worker_session_id is None:
        return report
    ctx = ctx.caused_by(recorded[-1].event_id)
    try:
        made = await service.host.fork_worker(
            point.worker_session_id, through=point.message_id, title=f"loopd: {forked_from.name}"
        )
    except HostError as e:
        await service.execute(c.RecordWorkerFailure(goal_id=goal_id, detail=str(e)), ctx)
        return msgspec.structs.replace(report, worker_error=str(e))
    assign = c.AssignWorker(
        goal_id=goal_id,
        worker_session_id=made.session_id,
        forked_from_session_id=made.source_session_id,
        fork_method=made.method,
        kept_messages=made.kept_messages,
    )
    await service.execute(assign, ctx)
    return msgspec.structs.replace(report, worker=made)
