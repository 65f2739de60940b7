"""Host commands: ``models`` (the host's model and agent catalogs, as the reference's ``loopd_list_models``) and
``host hold|held|release`` (stop the simulated host's calls at their start, so a race can be played on purpose).

Quota is always printed as ``unknown``: no host reports remaining balance, and a local rate-limit observation
is not balance data (docs/reference/loopd.md#s1-6), so loopd-es never pretends otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import stamped_builtins
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
    p.add_argument(
        "search",
        nargs="?",
        default=None,
        metavar="TEXT",
        help="only models whose providerID/modelID or name contains TEXT (any case)",
    )
    p.add_argument("--usable", action="store_true", help="only models positively known usable")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.set_defaults(handler=_models)
    _register_holds(sub)


def _register_holds(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..host.holds import HOLDABLE

    p = sub.add_parser(
        "host",
        help="hold the simulated host's calls (prompt, switch_model, ...) until released",
        description="Stop calls of the simulated host (sim:FILE) at their start, in every process that uses "
        "it, until released: a race (a turn asked for during a switch, a stop during a /loop prompt) then "
        f"happens in the order you choose. Calls: {', '.join(HOLDABLE)}.",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="ACTION")
    hold = verbs.add_parser("hold", help="hold CALL... from now on", description="Hold CALL... from now on.")
    hold.add_argument("calls", nargs="+", metavar="CALL", help="a host call, e.g. prompt or switch_model")
    release = verbs.add_parser(
        "release",
        help="let the held calls of CALL... go on (every call without CALL)",
        description="Let the calls waiting at CALL... go on and hold no more of them (every call without CALL).",
    )
    release.add_argument("calls", nargs="*", metavar="CALL", help="a held call (default: all)")
    held = verbs.add_parser(
        "held",
        help="what is held, and the calls waiting there",
        description="Print the held calls and the calls waiting at them; --wait CALL first waits until one is.",
    )
    held.add_argument("--wait", default=None, metavar="CALL", help="wait until a call of CALL is held")
    held.add_argument("--count", type=int, default=1, metavar="N", help="with --wait: until N calls are held")
    held.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="with --wait: give up after S seconds (exit 3)",
    )
    held.add_argument("--json", action="store_true", help="print one JSON document")
    for v in (hold, release, held):
        add_host_option(v)
        v.set_defaults(handler=_host_holds)


async def _host_holds(args: argparse.Namespace) -> int:
    import anyio

    from ..errors import ConflictError, UsageError
    from ..host.simulated import SimulatedHost

    if args.verb == "held" and (args.count < 1 or args.timeout <= 0):
        raise UsageError("--count must be >= 1 and --timeout > 0")
    host = await open_host(host_url(args.host))
    try:
        if not isinstance(host, SimulatedHost):
            raise UsageError(
                f"`loopd-es host {args.verb}` holds the simulated host's calls only, not {host.url}"
            )
        if args.verb == "hold":
            await host.hold(*args.calls)
            sys.stdout.write(f"holding {', '.join(args.calls)}\n")
            return EXIT_OK
        if args.verb == "release":
            freed = await host.release(*args.calls)
            sys.stdout.write(
                f"released {', '.join(args.calls) or 'every call'}: {len(freed)} call(s) go on\n"
            )
            return EXIT_OK
        if args.wait is not None:
            with anyio.move_on_after(args.timeout) as waited:
                await host.wait_held(args.wait, count=args.count)
            if waited.cancelled_caught:
                raise ConflictError(
                    f"fewer than {args.count} {args.wait} call(s) held after {args.timeout:g} s"
                )
        holds, waiting = await host.held()
    finally:
        await host.aclose()
    if args.json:
        doc = {"holds": holds, "held": msgspec.to_builtins(waiting)}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return EXIT_OK
    lines = [f"holds: {', '.join(holds) or 'none'}"]
    lines += [f"  #{h.ticket} {h.op} {h.session_id or '-'} (pid {h.pid})" for h in waiting]
    sys.stdout.write("\n".join(term_line(line) for line in lines) + "\n")
    return EXIT_OK


async def _models(args: argparse.Namespace) -> int:
    host = await open_host(host_url(args.host))
    try:
        models = await host.list_models()
        agents = await host.list_agents()
    finally:
        await host.aclose()
    listed = len(models.models)
    models = shown_models(models, search=args.search, usable_only=args.usable)
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
            "listed": listed,
        }
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return EXIT_OK
    sys.stdout.write(
        "\n".join(
            term_line(line)
            for line in [
                *render_models(models, listed=listed),
                *render_agents(agents),
                *_render_goals(goals),
            ]
        )
        + "\n"
    )
    return EXIT_OK


_USABLE_FIRST: Final = {True: 0, "unknown": 1, False: 2}


def shown_models(models: ModelCatalog, *, search: str | None, usable_only: bool) -> ModelCatalog:
    """The catalog as ``models`` shows it: usable models first (then unknown, then unusable), filtered by
    ``search`` (a case-insensitive substring of ``provider/model`` or the name) and ``usable_only``."""
    needle = (search or "").casefold()
    kept = [
        m
        for m in models.models
        if (not usable_only or m.usable is True)
        and (not needle or needle in m.ref.casefold() or needle in m.name.casefold())
    ]
    kept.sort(key=lambda m: _USABLE_FIRST.get(m.usable, 1))  # stable: the host's order within each group
    return msgspec.structs.replace(models, models=tuple(kept))


def summary_line(models: ModelCatalog, total: int | None = None) -> str:
    """The reference's one-line summary: ``Models: <n> across <p> provider(s) [cap/switching]. Quota: ...``.

    ``total``: how many models the host has, when ``models`` is a filtered view of them (said at the end).
    """
    shown = "" if total is None or total == len(models.models) else f" Shown: {len(models.models)}."
    return (
        f"Models: {len(models.models) if total is None else total} across {len(models.providers)} provider(s) "
        f"[{models.capability}/{models.switching}]. Quota: unknown — {models.quota.limitation}{shown}"
    )


def agents_line(agents: AgentCatalog) -> str:
    """The reference's agent line: ``Agents [cap/switching]: name (mode), ...`` or ``none``."""
    listed = ", ".join(f"{a.name} ({a.mode})" for a in agents.agents) or "none"
    return f"Agents [{agents.capability}/{agents.switching}]: {listed}"


def render_models(models: ModelCatalog, *, listed: int | None = None) -> list[str]:
    """The summary line, then one row per model: reference, usable, provider connected, limits.

    ``listed``: how many models the host has, when ``models`` is a filtered view of them.
    """
    lines = [summary_line(models, listed)]
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
    """Each goal's identity and pending switch (docs/reference/loopd.md#s3-21 ``assignedGoals``), folded from
    the log."""
    return await assigned_goals(store_url(args))


def _render_goals(goals: list[dict[str, Any]]) -> list[str]:
    return render_goal_rows(goals)


# -- the per-goal part of `loopd-es models` ------------------------------------------------------------------


def goal_row(state: GoalState) -> dict[str, Any]:
    """One goal's identity, pending switches and fallback bookkeeping (docs/reference/loopd.md#s3-21
    ``assignedGoals``)."""
    return {
        "id": state.goal_id,
        "name": state.name,
        "status": state.status,
        "model": state.config.model,
        "agent": state.config.agent,
        "worker_session_id": state.worker_session_id,
        "interactive": state.interactive,
        "pending_identity": stamped_builtins(state.pending_identity),
        "model_switch": stamped_builtins(
            {
                "pending": state.model_pending,
                "last": state.model_last,
                "last_failure": state.model_last_failure,
            }
        ),
        "agent_switch": stamped_builtins(
            {
                "pending": state.agent_pending,
                "last": state.agent_last,
                "last_failure": state.agent_last_failure,
            }
        ),
        "model_fallback": stamped_builtins(state.model_fallback),
        "fallback_models": list(state.config.fallback_models),
        "last_provider_limit": stamped_builtins(state.last_provider_limit),
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
