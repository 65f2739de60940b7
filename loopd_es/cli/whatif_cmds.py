"""``loopd-es whatif GOAL|--all --set KEY=VALUE ...`` and the handler of ``loopd-es replay --check``.

Both re-decide recorded goals with the current deciders (:mod:`loopd_es.replay.redecide`): ``whatif`` under a
changed policy, reporting the first decision that would differ and what it would save; ``replay --check``
under the recorded one, failing (exit 3) when the current code would not make a decision the log recorded.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import EXIT_CONFLICT, EXIT_OK, UsageError
from ..ids import resolve_goal_id
from ..text_safe import term_line
from .options import store_url

if TYPE_CHECKING:
    from ..log.base import LogStore
    from ..replay.redecide import GoalReplay


def register(subparsers: Any) -> None:
    """Add ``whatif`` to the command tree (``replay --check`` is registered with ``replay``)."""
    from ..replay.policy import KEYS

    p = subparsers.add_parser(
        "whatif",
        help="re-run goals' recorded decisions under a changed policy: what would differ, what it would save",
        description="Re-run each goal's recorded decisions through the current deciders with a changed policy, "
        "using the recorded host observations (idles, usage, errors, provider limits, check results) as inputs. "
        "For each goal: the first event where the decision would differ, what would have happened instead, and "
        "how far the recorded observations still apply (past that point the log cannot say what the model "
        "would have done, and nothing is invented).",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("goal", nargs="?", metavar="GOAL", help="a goal id or a unique prefix of one")
    which.add_argument("--all", action="store_true", help="every goal in the log, with totals")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a policy change (repeatable); KEY is one of {', '.join(KEYS)}; a limit can be set to none",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_whatif)


async def _whatif(args: argparse.Namespace) -> int:
    from ..log import open_store
    from ..replay.policy import parse_policy
    from ..replay.whatif import totals, whatif

    policy = parse_policy(args.set)
    if policy.empty:
        raise UsageError(
            "whatif: give at least one --set KEY=VALUE (`loopd-es replay --check` replays as recorded)"
        )
    async with await open_store(store_url(args), create=False) as store:
        ids = None if args.all else [await _resolve(store, args.goal)]
        reports = await whatif(store, policy, ids)
    sums = totals(reports)
    sentence = sums.sentence(policy.describe())
    if args.json:
        body = {
            "policy": policy,
            "notes": policy.notes(),
            "goals": [_goal_json(rep) for rep in reports],
            "totals": sums,
            "summary": sentence,
        }
        sys.stdout.write(msgspec.json.encode(body).decode() + "\n")
        return EXIT_OK
    for note in policy.notes():
        print(term_line(f"note: {note}"))
    for rep in reports:
        for line in _goal_lines(rep):
            print(term_line(line))
    if args.all:
        print(term_line(sentence))
    return EXIT_OK


def _goal_json(rep: GoalReplay) -> dict[str, Any]:
    body: dict[str, Any] = msgspec.to_builtins(rep)
    body["beyond"] = rep.beyond()
    return body


def _goal_lines(rep: GoalReplay) -> list[str]:
    name = f" {rep.name!r}" if rep.name else ""
    head = f"goal {rep.goal_id}{name}: {rep.decisions} decision(s) re-made over {rep.events} events"
    d = rep.divergence
    if d is None:
        return [f"{head}; every decision as recorded", f"  {rep.beyond()}"]
    lines = [
        f"{head}",
        f"  first difference at event #{d.position} ({d.event_type}, v{d.version}), {d.field}: "
        f"recorded {_show(d.recorded)}, would be {_show(d.replayed)}",
        f"  {d.instead}",
    ]
    if d.outcome == "stops_earlier":
        lines.append(
            f"  stops earlier: saves {rep.saved_turns} of {rep.recorded_turns} recorded turn(s), "
            f"{rep.saved_tokens} tokens and ${rep.saved_cost:.4f} (the recorded usage of the turns that would "
            "not run)"
        )
    lines.append(f"  {rep.beyond()}")
    lines.extend(f"  assumes {a}" for a in dict.fromkeys(rep.assumptions))
    return lines


def _show(value: Any) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 160 else text[:157] + "..."


async def _resolve(store: LogStore, text: str) -> str:
    from ..domain.streams import GOAL_PREFIX

    ids = [s[len(GOAL_PREFIX) :] for s in await store.streams() if s.startswith(GOAL_PREFIX)]
    return resolve_goal_id(text, ids)


async def check(args: argparse.Namespace) -> int:
    """``replay --check``: every recorded goal re-decided as recorded; exit 3 naming each goal that differs."""
    from ..log import open_store
    from ..replay.policy import Policy
    from ..replay.whatif import whatif

    async with await open_store(store_url(args), create=False) as store:
        ids = None if args.stream is None else [await _resolve(store, args.stream.removeprefix("goal-"))]
        reports = await whatif(store, Policy(), ids)
    failed = [rep for rep in reports if rep.divergence is not None]
    decisions = sum(rep.decisions for rep in reports)
    if args.json:
        body = {
            "ok": not failed,
            "goals": len(reports),
            "decisions": decisions,
            "failures": [{"goal_id": rep.goal_id, **msgspec.to_builtins(rep.divergence)} for rep in failed],
        }
        sys.stdout.write(msgspec.json.encode(body).decode() + "\n")
    else:
        for rep in failed:
            d = rep.divergence
            assert d is not None
            print(
                term_line(
                    f"goal {rep.goal_id}: event #{d.position} ({d.event_type}, v{d.version}) field {d.field}: "
                    f"recorded {_show(d.recorded)}, the current code decides {_show(d.replayed)}"
                )
            )
        if not failed:
            print(
                f"replay --check: {len(reports)} goal(s), {decisions} recorded decision(s): all as recorded"
            )
    if failed:
        sys.stderr.write(
            f"loopd-es replay --check: {len(failed)} of {len(reports)} goal(s) would be read differently by "
            "this version's deciders\n"
        )
        return EXIT_CONFLICT
    return EXIT_OK
