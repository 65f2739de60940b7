"""Host commands: ``models`` (the host's model and agent catalogs, as the reference's ``loopd_list_models``).

Quota is always printed as ``unknown``: no host reports remaining balance, and a local rate-limit observation
is not balance data (reference §1.6), so loopd-es never pretends otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import EXIT_OK, LoopdError
from ..host import host_url, open_host
from ..text_safe import term_line
from .options import add_host_option, store_url

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..host.base import AgentCatalog, ModelCatalog


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the host commands to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "models",
        help="list the host's models and agents (quota is always unknown)",
        description="Show the worker host's model catalog (providers, models and whether each is usable), "
        "its agents, and whether a live session's model and agent can be switched.",
    )
    add_host_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.set_defaults(handler=_models)


async def _models(args: argparse.Namespace) -> int:
    host = await open_host(host_url(args.host))
    try:
        models = await host.list_models()
        agents = await host.list_agents()
    finally:
        await host.aclose()
    goals = await _assigned_goals(args)
    if args.json:
        agent_catalog: dict[str, Any] = msgspec.to_builtins(agents)
        doc: dict[str, Any] = {
            "ok": models.capability != "unavailable",
            "host": host.url,
            **msgspec.to_builtins(models),
            "agents": agent_catalog.pop("agents"),
            "agent_catalog": agent_catalog,
            "assigned_goals": goals,
        }
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return EXIT_OK
    sys.stdout.write(
        "\n".join(
            term_line(line)
            for line in [*render_models(models), *render_agents(agents), *_render_goals(goals)]
        )
        + "\n"
    )
    return EXIT_OK


def summary_line(models: ModelCatalog) -> str:
    """The reference's one-line summary: ``Models: <n> across <p> provider(s) [cap/switching]. Quota: ...``."""
    return (
        f"Models: {len(models.models)} across {len(models.providers)} provider(s) "
        f"[{models.capability}/{models.switching}]. Quota: unknown — {models.quota.limitation}"
    )


def agents_line(agents: AgentCatalog) -> str:
    """The reference's agent line: ``Agents [cap/switching]: name (mode), ...`` or ``none``."""
    listed = ", ".join(f"{a.name} ({a.mode})" for a in agents.agents) or "none"
    return f"Agents [{agents.capability}/{agents.switching}]: {listed}"


def render_models(models: ModelCatalog) -> list[str]:
    """The summary line, then one row per model: reference, usable, provider connected, limits."""
    lines = [summary_line(models)]
    if not models.models:
        return lines
    connected = {p.provider_id: p.connected for p in models.providers}
    width = max(len(m.ref) for m in models.models)
    lines.append(f"  {'MODEL':<{width}}  USABLE   CONNECTED  CONTEXT   QUOTA")
    for m in models.models:
        context = f"{m.context_limit:,}" if m.context_limit is not None else "-"
        lines.append(
            f"  {m.ref:<{width}}  {_word(m.usable):<7}  {_word(connected.get(m.provider_id, 'unknown')):<9}  "
            f"{context:<8}  unknown"
        )
    return lines


def render_agents(agents: AgentCatalog) -> list[str]:
    """The agent line."""
    return [agents_line(agents)]


def _word(value: bool | str) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


async def _assigned_goals(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each goal's identity and pending switch (reference §3.21 ``assignedGoals``), folded from the log."""
    return await assigned_goals(store_url(args))


def _render_goals(goals: list[dict[str, Any]]) -> list[str]:
    return render_goal_rows(goals)


# -- the per-goal part of `loopd-es models` ------------------------------------------------------------------


def goal_row(state: GoalState) -> dict[str, Any]:
    """One goal's identity, pending switches and fallback bookkeeping (reference §3.21 ``assignedGoals``)."""
    return {
        "id": state.goal_id,
        "name": state.name,
        "status": state.status,
        "model": state.config.model,
        "agent": state.config.agent,
        "worker_session_id": state.worker_session_id,
        "interactive": state.interactive,
        "pending_identity": msgspec.to_builtins(state.pending_identity),
        "model_switch": msgspec.to_builtins(
            {
                "pending": state.model_pending,
                "last": state.model_last,
                "last_failure": state.model_last_failure,
            }
        ),
        "agent_switch": msgspec.to_builtins(
            {
                "pending": state.agent_pending,
                "last": state.agent_last,
                "last_failure": state.agent_last_failure,
            }
        ),
        "model_fallback": msgspec.to_builtins(state.model_fallback),
        "fallback_models": list(state.config.fallback_models),
        "last_provider_limit": msgspec.to_builtins(state.last_provider_limit),
    }


def _pending_text(row: dict[str, Any]) -> str:
    pair = row["pending_identity"]
    if pair:
        return f"{pair['model']} / {pair['agent']}"
    parts = []
    if row["model_switch"]["pending"]:
        parts.append(
            f"model {row['model_switch']['pending']['model']} ({row['model_switch']['pending']['reason']})"
        )
    if row["agent_switch"]["pending"]:
        parts.append(f"agent {row['agent_switch']['pending']['agent']}")
    return ", ".join(parts) or "-"


async def assigned_goals(url: str) -> list[dict[str, Any]]:
    """Every goal of the log at ``url`` as :func:`goal_row` describes it; ``[]`` when there is no log."""
    from ..app.service import GoalService
    from ..log import open_store

    try:
        store = await open_store(url, create=False)
    except LoopdError:
        return []
    try:
        service = GoalService(store, _NoHost())  # reading goals needs no host
        return [goal_row(state) for state in await service.goals()]
    finally:
        await store.aclose()


def render_goal_rows(goals: list[dict[str, Any]]) -> list[str]:
    """``Goals:`` then one line per goal: id, identity, pending switch."""
    return ["Goals:" if goals else "Goals: none"] + [
        f"  {row['id']}  {row['name']!r}  {row['status']}  {row['model'] or '-'} / {row['agent'] or '-'}  "
        f"pending: {_pending_text(row)}"
        for row in goals
    ]


class _NoHost:
    """A host stand-in for read-only use of :class:`GoalService` (never called)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"no host for read-only goal queries ({name})")
