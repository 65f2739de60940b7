"""Provider limits and model fallback (reference §3.11, §6): record the failure, classify, prepare a fallback.

A provider error reaches a goal the way the host reports it (a ``session.error``, or a prompt the provider
refused). The run failure is recorded first (backoff or block, as any failure), then the observation is
decided by :class:`~loopd_es.domain.goal_commands.ObserveProviderError`: the exact §6 classification, the next
usable fallback in order (each model at most once per goal), duplicates reusing the prepared one, stale and
ineligible observations preparing nothing. The prepared pending switch is applied by the next permitted turn
(:meth:`loopd_es.app.goals.Goals.continue_turn`); interactive goals record and prepare but are never woken here.

Only a safe description of the error is stored (status and code), never its message or headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ..domain import goal_commands as c

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from .ports import Ctx, GoalPort

Source = Literal["prompt-delivery", "session-error"]


def safe_error_text(error: Any) -> str:
    """``provider error (status 429, code insufficient_quota)``: what a run failure may store of ``error``.

    The same error always gives the same text, so a duplicate observation is recognised (§3.11 step 3).
    """
    wrapper = error if isinstance(error, dict) else {}
    cause = wrapper.get("cause")
    root: dict[str, Any] = cause if isinstance(cause, dict) else wrapper
    data = root.get("data") if isinstance(root.get("data"), dict) else {}
    assert isinstance(data, dict)
    status = next(
        (
            v
            for v in (root.get("statusCode"), root.get("status"), data.get("statusCode"), data.get("status"))
            if isinstance(v, int) and not isinstance(v, bool)
        ),
        None,
    )
    code = root.get("code") if isinstance(root.get("code"), str) else data.get("code")
    parts = [f"status {status}" if status is not None else "no status"]
    if isinstance(code, str) and code.isprintable() and len(code) <= 64:
        parts.append(f"code {code}")
    return "provider error (" + ", ".join(parts) + ")"


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
    """Record the run failure (unless the caller already did) and the §3.11 observation; returns both.

    ``run_id``/``generation`` name the run the error was seen on: a failure of an earlier run is not recorded.
    """
    text = safe_error_text(error)
    recorded: list[Envelope] = []
    if record_failure:
        failure = c.RecordRunFailure(
            goal_id=goal_id, error_text=text, source=source, run_id=run_id, generation=generation
        )
        recorded += await service.execute(failure, ctx)
    observe = c.ObserveProviderError(
        goal_id=goal_id, error=error, error_text=text, source=source, expected_model=expected_model, via=via
    )
    recorded += await service.execute(observe, ctx if not recorded else ctx.caused_by(recorded[-1].event_id))
    return recorded
