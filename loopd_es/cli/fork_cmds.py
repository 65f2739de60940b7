"""``loopd-es fork GOAL --at POSITION|TIME [...]`` and ``loopd-es compare GOAL_A GOAL_B``.

``fork`` writes (the new goal, the link on the source, the fork's worker on the host); ``compare`` only reads.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Final

import msgspec

from ..errors import UsageError
from ..text_safe import term_line
from .options import add_host_option, decimal_integer, decimal_number, store_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fork`` and ``compare`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "fork",
        help="a new goal whose state is GOAL's at one event, with its own worker (and another model, budget...)",
        description="Create a new goal whose state is GOAL's after the event at --at (a global position, or "
        "the last event by an ISO 8601 time). The two are linked both ways (goal.forked_from / goal.forked), "
        "so history and the HTML timeline show the branch. The fork gets its own worker: the host forks the "
        "worker's session at the matching message when it can, else a new session is primed with the "
        "transcript up to it; an active fork then starts its first turn (--no-start only records it). --model, "
        "--agent, --objective and the budgets change the fork only.",
    )
    p.add_argument("goal", metavar="GOAL", help="the goal id, or a prefix that matches exactly one goal")
    p.add_argument("--at", required=True, metavar="POSITION|TIME", help="fork after this event")
    p.add_argument("--name", help="the fork's name (default: the source's name + ' (fork)')")
    p.add_argument("--objective", help="the fork's objective (default: the source's)")
    p.add_argument("--model", metavar="PROVIDER/MODEL", help="the fork's model")
    p.add_argument("--agent", help="the fork's agent")
    p.add_argument("--max-turns", type=decimal_integer, metavar="N", help="the fork's turn limit (0: none)")
    p.add_argument("--max-failures", type=decimal_integer, metavar="N", help="the fork's failure limit")
    p.add_argument("--token-budget", type=decimal_integer, metavar="N", help="the fork's token budget")
    p.add_argument("--cost-budget", type=decimal_number, metavar="USD", help="the fork's cost budget")
    p.add_argument("--no-worker", action="store_true", help="record the fork only; make no worker session")
    p.add_argument(
        "--no-start",
        action="store_true",
        help="do not start the fork's first turn (default: an active fork with a worker starts, as a new goal "
        "does)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_host_option(p)
    p.set_defaults(handler=_fork)

    p = sub.add_parser(
        "compare",
        help="two goals side by side (a fork and its source): identity, budget, usage, outcome",
        description="Fold both goals and show them side by side: how they are related (B forked from A, A "
        "from B, or both from one goal), each one's status, identity, budgets, usage and outcome (≠ marks a "
        "difference), and the events each had after the point they share.",
    )
    p.add_argument("a", metavar="GOAL_A", help="a goal id or unique prefix")
    p.add_argument("b", metavar="GOAL_B", help="another goal id or unique prefix")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_compare)


_UPPER: Final = {
    "max_turns": 1_000_000,
    "max_failures": 1_000_000,
    "token_budget": 10**15,
    "cost_budget": None,
}
"""The bounds ``goal create`` (and ``loopd_create_goal``) takes for the same options; a cost budget is any
positive, finite number of dollars."""


def _in_bounds(name: str, value: float | None) -> None:
    flag = "--" + name.replace("_", "-")
    if value is None:
        return
    if name == "max_turns" and value == 0:
        return  # no turn limit, as `goal create --max-turns 0`
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} must be a number > 0, got {value}")
    upper = _UPPER[name]
    if upper is not None and value > upper:
        raise UsageError(f"{flag} must be at most {upper}, got {value}")


async def _fork(args: argparse.Namespace) -> int:
    from ..app.fork import fork_goal, parse_at
    from ..app.goals import Goals
    from ..app.service import Ctx, GoalService
    from ..host import host_url, open_host
    from ..log import open_store

    at = parse_at(args.at)
    for flag, text in (("--name", args.name), ("--objective", args.objective)):
        if text is not None and not text.strip():
            raise UsageError(f"{flag} must not be empty (leave it out to keep the source's)")
    for name in _UPPER:
        _in_bounds(name, getattr(args, name))
    overrides: dict[str, Any] = {
        "model": args.model,
        "agent": args.agent,
        "max_turns": args.max_turns,
        "max_failures": args.max_failures,
        "token_budget": args.token_budget,
        "cost_budget": args.cost_budget,
    }
    async with await open_store(store_url(args), create=False) as store:
        host = await open_host(host_url(args.host))
        try:
            service = GoalService(store, host)
            source = await service.resolve_id(args.goal)
            ctx = Ctx.new()
            report = await fork_goal(
                service,
                source,
                at,
                ctx,
                name=args.name,
                objective=args.objective,
                worker=not args.no_worker,
                **overrides,
            )
            turn = None
            if report.worker is not None and not args.no_start:
                turn = (await Goals(service).continue_turn(report.goal_id, ctx, explicit=True)).result
        finally:
            await host.aclose()
    if args.json:
        out = {**msgspec.to_builtins(report), "first_turn": turn}
        sys.stdout.write(msgspec.json.encode(out).decode() + "\n")
        return 0
    p = report.point
    lines = [
        f"forked goal {report.source_goal_id} at #{p.position} ({p.type}, v{p.version}) into goal {report.goal_id}",
    ]
    if report.changed:
        lines.append(f"changed: {', '.join(report.changed)}")
    if report.worker is not None:
        w = report.worker
        how = {
            "fork": f"the host forked session {w.source_session_id} ({w.kept_messages} messages kept)",
            "primed": f"a new session primed with {w.kept_messages} messages of {w.source_session_id}",
            "new": "a new session (no messages yet at that point)",
        }[w.method]
        lines.append(f"worker {w.session_id}: {how}")
    elif report.worker_error is not None:
        lines.append(f"no worker: {report.worker_error}")
    if turn is not None:
        lines.append(f"first turn: {turn}")
    sys.stdout.write("".join(term_line(line) + "\n" for line in lines))
    return 0


async def _compare(args: argparse.Namespace) -> int:
    from ..app.compare import compare_goals
    from ..log import open_store
    from ..postmortem.compare import compare_text
    from ..postmortem.links import resolve_goal

    async with await open_store(store_url(args), create=False) as store:
        a, b = await resolve_goal(store, args.a), await resolve_goal(store, args.b)
        if a == b:
            raise UsageError(
                f"{args.a!r} and {args.b!r} are the same goal ({a}); compare two different goals"
            )
        result = await compare_goals(store, a, b)
    if args.json:
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
    else:
        sys.stdout.write("".join(term_line(line) + "\n" for line in compare_text(result)))
    return 0
