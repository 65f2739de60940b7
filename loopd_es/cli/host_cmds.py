"""Host commands: ``models`` (the host's model and agent catalogs, as the reference's ``loopd_list_models``).

Quota is always printed as ``unknown``: no host reports remaining balance, and a local rate-limit observation
is not balance data (reference §1.6), so loopd-es never pretends otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import EXIT_OK
from ..host import DEFAULT_HOST, HOST_ENV, host_url, open_host
from ..text_safe import term_line

if TYPE_CHECKING:
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


def add_host_option(parser: argparse.ArgumentParser) -> None:
    """``--host URL``, shared by every command that talks to a worker host."""
    parser.add_argument(
        "--host",
        default=None,
        metavar="URL",
        help=f"the worker host: sim:FILE (JSON or TOML script) (default: ${HOST_ENV} or {DEFAULT_HOST})",
    )


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
        "\n".join(term_line(line) for line in [*render_models(models), *render_agents(agents), *_render_goals(goals)])
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
    from .main import store_url
    from .saga_cmds import assigned_goals

    return await assigned_goals(store_url(argparse.Namespace(store=getattr(args, "store", None))))


def _render_goals(goals: list[dict[str, Any]]) -> list[str]:
    from .saga_cmds import render_goal_rows

    return render_goal_rows(goals)
