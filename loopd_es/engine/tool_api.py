"""The tool channel: the custom tools inside OpenCode call the engine here, on loopback, with a token.

Only OpenCode's custom tools are told which session called them (``sessionID``, ``messageID``, ``callID``); MCP
tools and bash are not (opencode-host.md §7). So ``loopd-es opencode install`` writes one small tool file per
tool into the project's ``.opencode/tool/`` that forwards the call and its context here, and the engine checks
ownership as the reference does: worker tools find their goal by the calling session (among active or blocked
goals, §3.16); owner tools act only on goals whose owner is the calling session, or without ``goal_id`` on the
first such goal that is not complete (§3, owner-tool goal targeting). The command tools (``loopd_command_*``,
:mod:`.command_tools`) are owner tools too: they act only on commands the calling session started.

The engine answers ``POST /tool`` with a JSON body (:func:`tool_handler`) on a Unix socket that only this user can
reach (:mod:`.tool_server`); the socket's path and the token are in ``.opencode/loopd/engine.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..app.goal_index import GoalIndex
from ..domain.rules import RuleError
from ..errors import LoopdError, UsageError
from .command_tools import COMMAND_TOOL_NAMES, COMMAND_TOOLS, NO_SESSION, CommandTools
from .operations import Operations, Result
from .tool_roles import CALLER, caller_of, role_refusal
from .tool_server import Handler, socket_path
from .tool_spec import ToolSpec
from .tool_titles import title_for

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..host.events import EngineHost
    from ..log.base import LogStore
    from .clock import Clock

log = logging.getLogger("loopd_es.engine.tools")

CONFIG_NAME: Final = "engine.json"
"""``<project>/.opencode/loopd/engine.json``: the tool channel's address and token, written by the install step."""


WORKER_TOOLS: Final = (
    ToolSpec(
        "get_goal",
        "worker",
        "Get the background goal this session is working on: objective, progress, budgets, blocker.",
        {},
    ),
    ToolSpec(
        "report_goal_progress",
        "worker",
        "Record progress on your background goal.",
        {
            "summary": ("string", True, "what was done"),
            "next": ("string", False, "what comes next"),
        },
    ),
    ToolSpec(
        "complete_goal",
        "worker",
        "Claim your background goal is complete; its checks run before it is accepted.",
        {
            "summary": ("string", True, "what was achieved"),
            "evidence": ("string", True, "how it was verified"),
        },
    ),
    ToolSpec(
        "block_goal",
        "worker",
        "Stop: your background goal cannot go on without help.",
        {
            "reason": ("string", True, "why it is blocked"),
            "needed": ("string", True, "what is needed to go on"),
        },
    ),
)
_GOAL_ID = ("string", False, "the goal's id (default: your first goal that is not complete)")
OWNER_TOOLS: Final = (
    ToolSpec(
        "loopd_create_goal",
        "owner",
        "Start a background goal: a worker session works on the objective turn "
        "after turn until its checks pass or it blocks.",
        {
            "name": ("string", True, "a short name"),
            "objective": ("string", True, "what the worker must achieve"),
            "model": ("string", False, "providerID/modelID"),
            "agent": ("string", False, "the worker's agent"),
            "fallbackModels": (
                "array",
                False,
                "ordered providerID/modelID fallbacks for rate limits and quota",
            ),
            "checks": ("array", False, "shell commands that must pass before the goal completes"),
            "checkCwd": ("string", False, "where the checks run"),
            "costBudget": ("number", False, "dollars"),
            "maxTurns": ("number", False, "turn limit (0 = unlimited)"),
            "workspaceWrite": ("boolean", False, "whether the goal writes the workspace (default true)"),
            "interactive": ("boolean", False, "manual mode: the engine starts no turns itself"),
        },
    ),
    ToolSpec("pause_goal", "owner", "Pause one of your background goals.", {"goal_id": _GOAL_ID}),
    ToolSpec("resume_goal", "owner", "Resume a paused goal, or retry a blocked one.", {"goal_id": _GOAL_ID}),
    ToolSpec("clear_goal", "owner", "Remove one of your background goals for good.", {"goal_id": _GOAL_ID}),
    ToolSpec("nudge_goal", "owner", "Start the next turn of one of your goals now.", {"goal_id": _GOAL_ID}),
    ToolSpec(
        "send_goal_input",
        "owner",
        "Send text to one of your goals' worker as its next turn.",
        {
            "goal_id": _GOAL_ID,
            "text": ("string", True, "what to tell the worker"),
        },
    ),
    ToolSpec(
        "switch_goal_identity",
        "owner",
        "Switch a goal's worker model and/or agent (deferred while it works).",
        {
            "goal_id": ("string", True, "the goal's id"),
            "model": ("string", False, "providerID/modelID"),
            "agent": ("string", False, "agent name"),
        },
    ),
    ToolSpec("loopd_list_models", "owner", "List the models and agents a goal can use.", {}),
    ToolSpec("list_background_goals", "owner", "List your background goals and their state.", {}),
    ToolSpec("abort_goal_worker", "owner", "Abort the worker's current turn.", {"goal_id": _GOAL_ID}),
    ToolSpec(
        "force_complete_goal",
        "owner",
        "Mark one of your goals complete without its checks.",
        {
            "goal_id": _GOAL_ID,
            "summary": ("string", False, ""),
            "evidence": ("string", False, ""),
        },
    ),
    ToolSpec(
        "force_block_goal",
        "owner",
        "Block one of your goals.",
        {
            "goal_id": _GOAL_ID,
            "reason": ("string", False, ""),
            "needed": ("string", False, ""),
        },
    ),
    *COMMAND_TOOLS,
)
TOOLS: Final = {spec.name: spec for spec in (*WORKER_TOOLS, *OWNER_TOOLS)}


def hidden_from_workers() -> dict[str, bool]:
    """The per-prompt ``tools`` map that keeps owner tools out of a worker's reach (OpenCode makes it sticky)."""
    return {spec.name: False for spec in OWNER_TOOLS}


class ToolApiConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the tool channel listens (a Unix socket) and the token a call must carry."""

    socket: str
    token: str

    @classmethod
    def load(cls, path: Path) -> ToolApiConfig:
        """The config in ``path``.

        :raises UsageError: when it is unreadable, or from a version that served tools on a TCP port.
        """
        try:
            return msgspec.json.decode(path.read_bytes(), type=cls)
        except (OSError, msgspec.DecodeError) as e:
            raise UsageError(
                f"{path}: not a tool channel config ({e}); run `loopd-es opencode install` again"
            ) from e

    @classmethod
    def new(cls, project: Path) -> ToolApiConfig:
        """A fresh token and this project's socket (named by its absolute path, so projects never share one).

        :raises SocketPathError: when the socket path would be too long.
        """
        digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
        return cls(socket=str(socket_path(f"tools-{digest}.sock")), token=secrets.token_urlsafe(32))


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    context: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolDispatcher:
    """Runs one tool call with the reference's ownership rules and messages; never raises for a refusal."""

    def __init__(
        self,
        store: LogStore,
        host: EngineHost,
        clock: Clock,
        directory: str,
        *,
        store_url: str | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.clock = clock
        self.directory = directory
        self.index: GoalIndex | None = GoalIndex(store)
        """Every goal folded once and caught up per call: a call costs what it touches, not the log's size."""
        self.commands = CommandTools(store, store_url, directory, self._ops("").service.load)

    def _ops(self, owner: str) -> Operations:
        return Operations(
            self.store,
            self.host,
            clock=self.clock,
            directory=self.directory,
            owner=owner,
            index=self.index,
            caller=CALLER.get(),
        )

    async def call(self, call: ToolCall) -> dict[str, Any]:
        """The reply to ``call``, with the ``title`` OpenCode shows for it where the reference gives one."""
        reply = await self._call(call)
        title = title_for(call.tool, reply)
        return reply if title is None else {**reply, "title": title}

    async def _call(self, call: ToolCall) -> dict[str, Any]:
        spec = TOOLS.get(call.tool)
        if spec is None:
            return {"ok": False, "message": f"Unknown loopd tool {call.tool!r}."}
        command = spec.name in COMMAND_TOOL_NAMES
        session = call.context.get("sessionID")
        if not isinstance(session, str) or not session or session == "main":
            refusal = NO_SESSION if command else "No session context available."
            return {"ok": False, "errorCode": "no_session", "message": refusal}
        if self.index is not None and (refused := await role_refusal(spec, session, self.index)) is not None:
            return refused
        CALLER.set(caller_of(spec, session, call.context))
        empty: tuple[object, ...] = (
            (None,) if command else (None, "")
        )  # "" reaches the reference's own checks
        missing = [
            name for name, (_, required, _) in spec.args.items() if required and call.args.get(name) in empty
        ]
        if missing:
            return {"ok": False, "message": f"Missing required argument(s): {', '.join(missing)}."}
        try:
            result: Result | dict[str, Any]
            if command:
                result = await self.commands.call(spec.name, session, call.args, call.context)
            else:
                result = await getattr(self, "_" + spec.name)(session, call.args)
        except RuleError as e:
            return {"ok": False, "message": str(e)}
        except LoopdError as e:
            return {"ok": False, "message": str(e)}
        if isinstance(result, Result):
            return {k: v for k, v in msgspec.to_builtins(result).items() if v not in (None, {}, "")} | {
                "ok": result.ok
            }
        return result

    # -- worker tools --------------------------------------------------------------------------------

    async def _get_goal(self, session: str, args: dict[str, Any]) -> Result:
        result = await self._ops(session).get_goal(session)
        if not result.ok:
            return Result(ok=False, message=result.message, status="none")
        return result

    async def _report_goal_progress(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).report_progress(session, str(args["summary"]), _opt(args, "next"))

    async def _complete_goal(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).complete(session, str(args["summary"]), str(args["evidence"]))

    async def _block_goal(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).block(session, str(args["reason"]), str(args["needed"]))

    # -- owner tools ---------------------------------------------------------------------------------

    async def _loopd_create_goal(self, session: str, args: dict[str, Any]) -> Result:
        config: dict[str, Any] = {}
        for arg, field, kind in _CREATE_ARGS:
            if args.get(arg) is not None:
                value = args[arg]
                config[field] = tuple(str(v) for v in value) if kind is tuple else kind(value)
        return await self._ops(session).create(str(args["name"]), str(args["objective"]), **config)

    async def _owned(
        self,
        session: str,
        args: dict[str, Any],
        *,
        want: Callable[[GoalState], bool] | None = None,
        missing: str = "No matching active goal for this session.",
    ) -> GoalState:
        goals = await self._ops(session).service.goals_of_owner(session)
        goal_id = args.get("goal_id")
        if goal_id:
            found = next((g for g in goals if g.goal_id == goal_id and g.owner_session_id == session), None)
        else:
            chosen = want or (lambda g: g.status != "complete")
            found = next((g for g in goals if g.owner_session_id == session and chosen(g)), None)
        if found is None:
            raise RuleError(missing)
        return found

    async def _pause_goal(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).pause((await self._owned(session, args)).goal_id)

    async def _resume_goal(self, session: str, args: dict[str, Any]) -> Result:
        goal = await self._owned(
            session,
            args,
            want=lambda g: g.status in ("paused", "blocked"),
            missing="No matching paused/blocked goal for this session.",
        )
        ops = self._ops(session)
        return await (ops.retry(goal.goal_id) if goal.status == "blocked" else ops.resume(goal.goal_id))

    async def _clear_goal(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).clear((await self._owned(session, args)).goal_id)

    async def _nudge_goal(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).nudge((await self._owned(session, args)).goal_id)

    async def _send_goal_input(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).send((await self._owned(session, args)).goal_id, str(args["text"]))

    async def _switch_goal_identity(self, session: str, args: dict[str, Any]) -> Result:
        model, agent = _opt(args, "model"), _opt(args, "agent")
        if model is None and agent is None:
            raise RuleError("At least one of model or agent is required.")
        goal = await self._owned(session, args)
        return await self._ops(session).switch_identity(goal.goal_id, model=model, agent=agent)

    async def _loopd_list_models(self, session: str, args: dict[str, Any]) -> dict[str, Any]:
        models, agents = await self.host.list_models(), await self.host.list_agents()
        return {"ok": True, **msgspec.to_builtins(models), "agents": list(agents.names())}

    async def _list_background_goals(self, session: str, args: dict[str, Any]) -> dict[str, Any]:
        goals = await self._ops(session).service.goals_of_owner(session)
        return {
            "ok": True,
            "goals": [
                {
                    "id": g.goal_id,
                    "name": g.name,
                    "status": g.status,
                    "phase": g.phase,
                    "model": g.config.model,
                    "agent": g.config.agent,
                }
                for g in goals
            ],
        }

    async def _abort_goal_worker(self, session: str, args: dict[str, Any]) -> Result:
        return await self._ops(session).abort_worker((await self._owned(session, args)).goal_id)

    async def _force_complete_goal(self, session: str, args: dict[str, Any]) -> Result:
        goal = await self._owned(session, args)
        return await self._ops(session).force_complete(
            goal.goal_id, _opt(args, "summary"), _opt(args, "evidence")
        )

    async def _force_block_goal(self, session: str, args: dict[str, Any]) -> Result:
        goal = await self._owned(session, args)
        return await self._ops(session).force_block(goal.goal_id, _opt(args, "reason"), _opt(args, "needed"))


_CREATE_ARGS: Final[tuple[tuple[str, str, Any], ...]] = (
    ("model", "model", str),
    ("agent", "agent", str),
    ("fallbackModels", "fallback_models", tuple),
    ("checks", "checks", tuple),
    ("checkCwd", "check_cwd", str),
    ("costBudget", "cost_budget", float),
    ("maxTurns", "max_turns", int),
    ("workspaceWrite", "workspace_write", bool),
    ("interactive", "interactive", bool),
)


def _opt(args: dict[str, Any], name: str) -> str | None:
    value = args.get(name)
    return None if value in (None, "") else str(value)


# -- the route the tool server hands us ---------------------------------------------------------------


def tool_handler(call: Callable[[ToolCall], Awaitable[dict[str, Any]]]) -> Handler:
    """The tool server's handler: ``/tool`` decodes a :class:`ToolCall` and answers ``call``'s reply."""

    async def handle(route: str, body: bytes) -> tuple[int, bytes]:
        if route != "/tool":
            return 404, _json({"ok": False, "message": f"no route {route!r}: POST /tool only"})
        try:
            request = msgspec.json.decode(body, type=ToolCall)
        except msgspec.DecodeError as e:
            return 400, _json({"ok": False, "message": f"invalid tool call: {e}"})
        try:
            answer = await call(request)
        except Exception as e:  # a bug must not take the engine down: the model gets a one-line answer
            log.exception("tool %s failed", request.tool)
            answer = {
                "ok": False,
                "message": f"internal error in the engine ({type(e).__name__}); see its log",
            }
        return 200, _json(answer)

    return handle


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, default=str).encode()
