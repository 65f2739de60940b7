"""``loopd-es goal ...``: goals, identity switches and provider errors, through the deciders and the sagas.

Every command opens the log (``--store``) and the worker host (``--host``, the simulated host by default),
first settles any switch saga a crashed process left open (:func:`loopd_es.sagas.recovery.recover`), then
runs its use case. Outcomes print as the reference words them; a rule violation exits 3 with the reference's
message; a refused switch exits 3 too (nothing half-done stays recorded).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import EXIT_CONFLICT, EXIT_OK, EXIT_STORAGE, ConflictError, UsageError
from ..host import host_url, open_host
from ..text_safe import term_line
from .goal_options import add_create_options, create_options, in_flags
from .options import add_host_option, store_url
from .query_cmds import add_goal_show
from .words import cli_words

if TYPE_CHECKING:
    from ..app.goals import Goals, TurnReport
    from ..app.service import Ctx
    from ..domain.state import GoalState
    from ..events.envelope import Envelope

_Action = Callable[["Goals", argparse.Namespace, "Ctx"], Awaitable[int]]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``goal`` and its subcommands to the ``loopd-es`` parser."""
    goal = sub.add_parser(
        "goal",
        help="create goals, switch their worker identity, pause/resume, feed provider errors",
        description="Goals and their worker identity, recorded as events; identity switches run as sagas "
        "against the worker host (default: the simulated host).",
    )
    cmds = goal.add_subparsers(dest="goal_command", metavar="ACTION", required=True)

    def add(name: str, help_: str, action: _Action, *, goal_arg: bool = True) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        if goal_arg:
            p.add_argument("goal", metavar="GOAL", help="the goal id, or a unique prefix of it")
        add_host_option(p)
        p.set_defaults(handler=_handler(action))
        return p

    p = add("create", "create a goal, its worker session and its first turn", _create, goal_arg=False)
    p.add_argument("name", metavar="NAME")
    add_create_options(p)

    p = add("switch-identity", "switch the worker's model and/or agent (same goal, same session)", _switch)
    p.add_argument("--model", metavar="P/M")
    p.add_argument("--agent", metavar="A")
    p.add_argument("--resume", action="store_true", help="also resume a blocked goal")
    add("pause", "pause an active goal and abort its worker's run", _pause)
    add("resume", "resume a paused (or retry a blocked) goal", _resume)
    add("retry", "retry a blocked goal (failure counters reset)", _retry)
    add("clear", "remove a goal (irreversible)", _clear)
    p = add("interactive", "turn manual mode on or off", _interactive)
    p.add_argument("mode", choices=("on", "off"))
    p = add("observe-error", "feed a provider error as the host reports it (a session error)", _observe)
    p.add_argument("--error", required=True, metavar="JSON", help="e.g. '{\"statusCode\": 429}'")
    p.add_argument("--source", choices=("session-error", "prompt-delivery"), default="session-error")
    p.add_argument("--model", metavar="P/M", help="the model the error was for (default: the goal's)")
    add("idle", "the worker went idle: finish the run, apply pending switches, continue", _idle)
    add("compact", "compact the worker session (applies pending switches first)", _compact)
    add_goal_show(cmds)  # answered from the read models (query_cmds)
    add("recover", "settle identity switches a crashed process left open", _recover, goal_arg=False)


def _handler(action: _Action) -> Callable[[argparse.Namespace], Awaitable[int]]:
    async def run(args: argparse.Namespace) -> int:
        from ..app.service import Ctx

        if action is _create:
            await _check_before_a_first_log(args)
        async with _goals(args, create=action is _create) as goals:  # no log holds the goal to act on
            for report in await goals.recover():
                print(
                    f"recovered identity switch {report.switch_id} of goal {report.goal_id}: {report.outcome}",
                    file=sys.stderr,
                )
            if getattr(args, "goal", None) is not None:
                args.goal = await goals.service.resolve_id(args.goal)
            return await action(goals, args, Ctx.new())

    return run


async def _check_before_a_first_log(args: argparse.Namespace) -> None:
    """Where ``goal create`` would make the log, decide the creation on an empty log in memory first: a
    refused creation (a bad argument) then leaves no empty log, or schema, behind.

    :raises UsageError: naming the flag at fault, as :func:`_create` would.
    """
    import uuid

    from ..app.service import GoalService
    from ..domain import goal_commands as c
    from ..domain.rules import BadArgument
    from ..errors import LogNotFoundError
    from ..log import open_store
    from ..log.memory import MemoryLog

    try:
        store = await open_store(store_url(args), create=False)
    except LogNotFoundError:
        pass
    else:
        await store.aclose()
        return
    name = f"create-check-{uuid.uuid4()}"
    try:
        async with await MemoryLog.open(name) as scratch:
            host = await open_host(host_url(args.host))
            try:
                await GoalService(scratch, host).check(
                    c.CreateGoal(
                        goal_id=str(uuid.uuid4()), name=args.name, objective=args.objective,
                        owner_session_id="cli", **create_options(args),
                    )
                )  # fmt: skip
            except BadArgument as e:
                raise UsageError(in_flags(str(e))) from None
            finally:
                await host.aclose()
    finally:
        MemoryLog.forget(name)


@asynccontextmanager
async def _goals(args: argparse.Namespace, *, create: bool) -> AsyncIterator[Goals]:
    from ..app.goals import Goals
    from ..app.service import GoalService
    from ..log import open_store

    store = await open_store(store_url(args), create=create)
    try:
        host = await open_host(host_url(args.host))
        try:
            yield Goals(GoalService(store, host))
        finally:
            await host.aclose()
    finally:
        await store.aclose()


def _say(*lines: str) -> None:
    """Print lines through the terminal sanitiser (goal names, errors and reasons come from outside), naming
    commands where the shared messages name tools."""
    sys.stdout.write("".join(f"{term_line(cli_words(line))}\n" for line in lines))


async def _state(goals: Goals, goal_id: str) -> GoalState:
    return await goals.service.load(goal_id)


# -- actions ----------------------------------------------------------------------------------------------


async def _create(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    from ..domain.rules import BadArgument

    for what, text in (("NAME", args.name), ("--objective", args.objective)):
        if (
            not text.strip()
        ):  # the tool refuses them as missing; a goal needs both to be told apart and steered
            raise UsageError(f"{what} must not be empty")
    try:
        state = await goals.create(args.name, args.objective, ctx, **create_options(args))
    except BadArgument as e:  # the tool's words for the tool's fields; here, the flags
        raise UsageError(in_flags(str(e))) from None
    _say(state.goal_id)
    if (
        state.status == "blocked"
    ):  # recorded blocked, as the reference does: the id on stdout, the why on stderr
        return await _not_started(goals, state.goal_id, "was recorded but could not start")
    _say(
        f'Goal "{state.name}" created and started in the background. Artifacts: {state.config.artifact_dir}.'
    )
    return EXIT_OK


async def _not_started(goals: Goals, goal_id: str, what: str = "could not start") -> int:
    """A worker session the host would not make: why, on stderr, and what to do (exit 4, a host problem)."""
    state = await _state(goals, goal_id)
    reason = state.blocker.reason if state.blocker else "worker failed"
    sys.stderr.write(
        term_line(
            f'loopd-es: goal "{state.name}" {what}: {cli_words(reason)}; once the host can make its worker, '
            f"`loopd-es goal resume {state.goal_id}` starts it (a model or agent the host refuses needs a new goal)"
        )
        + "\n"
    )
    return EXIT_STORAGE


async def _switch(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    from ..app.goals import SwitchFailedError

    report = await goals.switch_identity(
        args.goal, ctx, model=args.model, agent=args.agent, resume=args.resume
    )
    if report.outcome in ("failed", "rolled-back", "rollback-failed"):
        raise SwitchFailedError(report)
    _say(
        f"Identity switch: {'deferred' if report.outcome == 'next-prompt' else report.outcome}",
        report.message(),
    )
    if report.resumed:
        _say("Goal resumed.")
    return EXIT_OK if report.ok else EXIT_CONFLICT


async def _pause(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    before = await _state(goals, args.goal)
    recorded = await goals.pause(args.goal, ctx)
    if recorded:
        _say(f'Goal "{before.name}" paused. Resume with `loopd-es goal resume {before.goal_id}`.')
    elif before.status == "paused":
        _say(f'Goal "{before.name}" is already paused.')
    else:
        raise ConflictError(f'Goal "{before.name}" is {before.status}; only an active goal can be paused.')
    return EXIT_OK


async def _resume(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    before = await _state(goals, args.goal)
    if before.status == "active":
        _say(f'Goal "{before.name}" is already active.')
        return EXIT_OK
    if before.status == "blocked":
        recorded, turn = await goals.retry(args.goal, ctx)
    else:
        recorded, turn = await goals.resume(args.goal, ctx)
    if _worker_refused(recorded):
        return await _not_started(goals, args.goal)
    _say(f'Goal "{before.name}" resumed.', *_turn_lines(turn))
    return _turn_exit(turn)


async def _retry(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    before = await _state(goals, args.goal)
    recorded, turn = await goals.retry(args.goal, ctx)
    if not recorded:
        hint = " (`loopd-es goal resume` resumes a paused one)" if before.status == "paused" else ""
        raise ConflictError(
            f'Goal "{before.name}" is {before.status}; only a blocked goal can be retried{hint}.'
        )
    if _worker_refused(recorded):
        return await _not_started(goals, args.goal)
    _say(f'Goal "{before.name}" retried.', *_turn_lines(turn))
    return _turn_exit(turn)


def _worker_refused(recorded: list[Envelope]) -> bool:
    """Whether the host refused the worker session resume or retry had to make (the goal is blocked again)."""
    return len(recorded) > 1 and recorded[-1].type == "goal.blocked"


def _turn_exit(turn: TurnReport | None) -> int:
    """A refused pending switch exits 3 (conflict), as it did when it was raised."""
    return EXIT_CONFLICT if turn is not None and turn.result == "switch-failed" else EXIT_OK


async def _clear(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    before = await _state(goals, args.goal)
    await goals.clear(args.goal, ctx)
    _say(f'Goal "{before.name}" cleared and removed.')
    return EXIT_OK


async def _interactive(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    on = args.mode == "on"
    await goals.set_interactive(args.goal, on, ctx)
    name = (await _state(goals, args.goal)).name
    if on:
        _say(
            f'Goal "{name}" is now manual: the engine will not start turns — steer it with '
            f"`loopd-es owner send|nudge {args.goal}`."
        )
    else:
        _say(f'Goal "{name}" is back on auto: the engine resumes idle recovery and retries.')
    return EXIT_OK


async def _existing(goals: Goals, goal_id: str) -> None:
    """Refuse a goal that was cleared, as ``pause`` and ``resume`` do (``Goal not found.``, exit 3): ``idle``
    said "goal is complete" and ``observe-error`` "not a provider limit" of one."""
    from ..domain.rules import require_goal

    require_goal(await goals.service.load(goal_id), None)


async def _observe(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    from ..domain.rules import invalid_model, is_model_ref

    try:
        error: Any = msgspec.json.decode(args.error)
    except msgspec.DecodeError as e:
        raise UsageError(f"--error is not valid JSON ({e}); e.g. --error '{{\"statusCode\": 429}}'") from None
    if args.model is not None and not is_model_ref(args.model):
        raise UsageError(f"--model: {invalid_model(args.model)}")
    await _existing(goals, args.goal)
    recorded = await goals.observe_error(args.goal, error, ctx, source=args.source, expected_model=args.model)
    lines: list[str] = []
    for envelope in recorded:
        data = envelope.data_dict()
        if envelope.type == "run.failed":
            retry = f", retry after {data['retry_after']}" if data.get("retry_after") else ""
            lines.append(f"run failed ({data['consecutive_failures']} consecutive{retry})")
        elif envelope.type == "goal.blocked":
            lines.append(f"goal blocked: {data['reason']}")
        elif envelope.type == "identity.provider_limit_observed":
            retry = f", retry at {data['retry_at']}" if data.get("retry_at") else ""
            status = f", status {data['status_code']}" if data.get("status_code") is not None else ""
            lines.append(
                f"provider limit: {data['kind']} ({data['source']}{status}{retry}) on {data.get('model')}"
            )
        elif envelope.type == "identity.fallback_prepared":
            limit = {"rate-limit": "rate limit", "quota": "quota"}.get(data.get("limit") or "", "limit")
            lines.append(
                f"fallback prepared after a {limit}: {data['model']} (applies on the next permitted idle turn)"
            )
        elif envelope.type == "run.fell_back":
            lines.append(
                f"turn ended as a fallback turn (not a failure): next turn on {data['to_model']} at once"
            )
        elif envelope.type.startswith("identity.fallback_"):
            lines.append(f"fallback {envelope.type.rsplit('_', 1)[-1]}: nothing prepared")
    if not any(e.type == "identity.provider_limit_observed" for e in recorded):
        lines.append("not a provider limit: no observation recorded")
    _say(*lines)
    return EXIT_OK


async def _idle(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    await _existing(goals, args.goal)
    turn = await goals.idle(args.goal, ctx)
    lines = _turn_lines(turn)
    if turn.result == "not-active":  # say why: the idle confirmation may just have stopped it
        state = await goals.service.load(turn.goal_id)
        reason = f": {state.blocker.reason}" if state.status == "blocked" and state.blocker else ""
        lines[-1] = f"goal is {state.status}{reason}: no turn"
    _say(*lines)
    return EXIT_OK


async def _compact(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    reports = await goals.compact(args.goal, ctx)
    _say(*(f"pending switch: {r.message()}" for r in reports), "compacted")
    return EXIT_OK


async def _recover(goals: Goals, args: argparse.Namespace, ctx: Ctx) -> int:
    _say("recovery done")
    return EXIT_OK


def _turn_lines(turn: TurnReport | None) -> list[str]:
    if turn is None:
        return []
    lines = [f"pending switch: {r.message()}" for r in turn.switches]
    text = {
        "started": "turn started",
        "not-active": "goal is not active: no turn",
        "running": "a turn is running: nothing to do",
        "no-worker": "goal has no worker session",
        "busy": (
            "the host says the worker is still busy: its turn is not over, nothing was recorded "
            "(`goal idle` again once it is idle)"
            if turn.detail == "turn-not-over"
            else "worker is not idle: pending switches wait for the next idle turn"
        ),
        "waiting": f"waiting for retry until {turn.detail}",
        "interactive": "goal is interactive: the engine starts no turn (pending switches wait for an explicit "
        "turn)",
        "prompt-failed": f"prompt failed: {turn.detail}",
        "switch-failed": "no turn: the pending switch was refused and the goal is blocked",
        "switching": "an identity switch is being applied: the turn waits for it",
        "queued": "an identity switch is being applied: the turn is queued and starts once it ends",
    }[turn.result]
    return [*lines, text]
