"""Provider limits and model fallback (docs/reference/loopd.md#s3-11, #s6): a fallback turn, or a failure then
the observation.

A provider error reaches a goal the way the host reports it (a ``session.error``, a prompt the provider
refused, or OpenCode's retry status while it retries a limit by itself). When it is a limit and a fallback
model is ready for the next turn, the turn ends as a fallback turn (``run.fell_back``): not a failure, so no
failure is counted, no backoff is waited and the next prompt carries no warning. Otherwise the run failure is
recorded first (backoff or block, as any failure, keeping the error's own message as the reference does), then
the observation is decided by :class:`~loopd_es.domain.goal_commands.ObserveProviderError`: the
docs/reference/loopd.md#s6
classification, the next usable fallback in order (each model at most once per goal), duplicates reusing the
prepared one, stale and ineligible observations preparing nothing. The prepared pending switch is applied by the
next permitted turn (:meth:`loopd_es.app.goals.Goals.continue_turn`); interactive goals record and prepare but
are never woken here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from msgspec.structs import replace

from ..domain import goal_commands as c
from ..domain.provider_limit import describe_error

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from .ports import Ctx, GoalPort

Source = Literal["prompt-delivery", "session-error"]


async def observe_provider_error(
    service: GoalPort,
    goal_id: str,
    error: Any,
    ctx: Ctx,
    *,
    source: Source = "session-error",
    expected_model: str | None = None,
    record_failure: bool = True,
    run_id: str | None = None,
    generation: int | None = None,
    via: str | None = None,
) -> list[Envelope]:
    """A fallback turn, or the run failure (unless the caller already did) and the
    docs/reference/loopd.md#s3-11 observation.

    ``run_id``/``generation`` name the run the error was seen on: a failure of an earlier run is not recorded.
    """
    text = describe_error(error)
    recorded: list[Envelope] = []
    observe = c.ObserveProviderError(
        goal_id=goal_id, error=error, error_text=text, source=source, expected_model=expected_model, via=via
    )
    if record_failure:
        as_turn = replace(observe, fallback_turn=True, run_id=run_id, generation=generation)
        fell_back = await service.execute(as_turn, ctx)
        if fell_back:
            return fell_back
        failure = c.RecordRunFailure(
            goal_id=goal_id, error_text=text, source=source, run_id=run_id, generation=generation
        )
        recorded += await service.execute(failure, ctx)
    recorded += await service.execute(observe, ctx if not recorded else ctx.caused_by(recorded[-1].event_id))
    return recorded
