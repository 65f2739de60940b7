"""The tool channel: the custom tools inside OpenCode call the engine here, on loopback, with a token.

Only OpenCode's custom tools are told which session called them (``sessionID``, ``messageID``, ``callID``); MCP
tools and bash are not (docs/reference/opencode-host.md#s7). So ``loopd-es opencode install`` writes one small
tool file per
tool into the project's ``.opencode/tool/`` that forwards the call and its context here, and the engine checks
ownership as the reference does: worker tools find their goal by the calling session (among active or blocked
goals, docs/reference/loopd.md#s3-16); owner tools act only on goals whose owner is the calling session, or
without ``goal_id`` on the
first such goal that is not complete (docs/reference/loopd.md#s3, owner-tool goal targeting). The command
tools (``loopd_command_*``,
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
from msgspec import UnsetType

from ..app.goal_index import GoalIndex
from ..app.service import GoalService
from ..domain.rules import RuleError
from ..errors import LoopdError, UsageError
from . import tool_args as a
from .command_tools import COMMAND_TOOL_NAMES, COMMAND_TOOLS, NO_SESSION, CommandCall, CommandTools
from .operations import Operations, Result
from .tool_inspect import inspect_reply
from .tool_replies import (
    CreatedReply,
    CreateFailedReply,
    completion_reply,
    create_failed_reply,
    created_reply,
    reply_of,
)
from .tool_roles import CALLER, caller_of, role_refusal
from .tool_server import Handler, socket_path
from .tool_spec import ToolArgs, ToolArgsError, ToolSpec
from .tool_switch import switch_reply
from .tool_titles import title_for
from .tool_views import assigned_goal, list_row, reference_json

if TYPE_CHECKING:
    from ..clock import Clock
    from ..domain.state import GoalState
    from ..host.events import EngineHost
    from ..log.base import LogStore

log = logging.getLogger("loopd_es.engine.tools")

CONFIG_NAME: Final = "engine.json"
"""``<project>/.opencode/loopd/engine.json``: the tool channel's address and token, written by the install step."""


WORKER_TOOLS: Final = (
    ToolSpec(
        "get_goal",
        "worker",
        "Get the background goal this session is working on: objective, progress, budgets, blocker.",
    ),
    ToolSpec(
        "report_goal_progress", "worker", "Record progress on your background goal.", a.ReportProgressArgs
    ),
    ToolSpec(
        "complete_goal",
        "worker",
        "Claim your background goal is complete; its checks run before it is accepted.",
        a.CompleteArgs,
    ),
    ToolSpec("block_goal", "worker", "Stop: your background goal cannot go on without help.", a.BlockArgs),
)
OWNER_TOOLS: Final = (
    ToolSpec(
        "loopd_create_goal",
        "owner",
        "Start a background goal: a worker session works on the objective turn "
        "after turn until its checks pass or it blocks.",
        a.CreateGoalArgs,
    ),
    ToolSpec("pause_goal", "owner", "Pause one of your background goals.", a.GoalTarget),
    ToolSpec("resume_goal", "owner", "Resume a paused goal, or retry a blocked one.", a.GoalTarget),
    ToolSpec("clear_goal", "owner", "Remove one of your background goals for good.", a.GoalTarget),
    ToolSpec("nudge_goal", "owner", "Start the next turn of one of your goals now.", a.GoalTarget),
    ToolSpec(
        "send_goal_input",
        "owner",
        "Send text to one of your goals' worker as its next turn.",
        a.SendInputArgs,
        blank_reaches=True,
    ),
    ToolSpec(
        "switch_goal_identity",
        "owner",
        "Switch an existing goal's worker model and/or agent on the same worker session (deferred while it "
        "works); resume=true resumes a blocked goal after a safe switch.",
        a.SwitchIdentityArgs,
        blank_reaches=True,
    ),
    ToolSpec(
        "loopd_list_models",
        "owner",
        "List the host's providers, models and agents, the quota limitation, and the identity of each of your "
        "goals (no secrets are returned).",
    ),
    ToolSpec("list_background_goals", "owner", "List your background goals that are not complete."),
    ToolSpec(
        "inspect_background_goal",
        "owner",
        "Inspect one of your goals in full: objective, config, progress, blocker, identity switches, runtime, "
        "and what its worker is doing (transcript tail, progress history, artifacts, pending input).",
        a.InspectArgs,
    ),
    ToolSpec("abort_goal_worker", "owner", "Abort the worker's current turn.", a.GoalTarget),
    ToolSpec(
        "force_complete_goal",
        "owner",
        "Mark one of your goals complete without its checks.",
        a.ForceCompleteArgs,
    ),
    ToolSpec("force_block_goal", "owner", "Block one of your goals.", a.ForceBlockArgs),
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
    """One call as the tool file forwards it: the tool's name, its arguments (decoded by the tool's Struct
    later, so a wrong argument is answered naming the tool) and OpenCode's call context."""

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
        self.commands = CommandTools(store, store_url, directory, self._service("").load)

    def _service(self, owner: str) -> GoalService:
        """The goal service alone, for calls that only look goals up (cheaper than :meth:`_ops`)."""
        return GoalService(
            self.store, self.host, clock=self.clock, directory=self.directory, owner=owner, index=self.index
        )

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
        if not isinstance(session, str) or not session or (session == "main" and not command):
            # a command tool takes "main" on to the service, which refuses it as an owner
            # (docs/reference/loopd.md#s3-17): no_session is for a call that has no session at all
            refusal = NO_SESSION if command else "No session context available."
            return {"ok": False, "errorCode": "no_session", "message": refusal}
        if self.index is not None and (refused := await role_refusal(spec, session, self.index)) is not None:
            return refused
        CALLER.set(caller_of(spec, session, call.context))
        empty: tuple[object, ...] = (
            (None,) if command or spec.blank_reaches else (None, "")
        )  # "" reaches the reference's own checks
        missing = [name for name in spec.required() if call.args.get(name) in empty]
        if missing:
            return {"ok": False, "message": f"Missing required argument(s): {', '.join(missing)}."}
        given = {k: v for k, v in call.args.items() if v is not None}  # JSON null: the argument is absent
        try:
            args = spec.decode(given)
        except ToolArgsError as e:
            return {"ok": False, "errorCode": "invalid_arguments", "message": str(e)}
        try:
            result: Result | dict[str, Any] | msgspec.Struct
            if command:
                who = CommandCall(session=session, context=call.context, caller=CALLER.get())
                result = await self.commands.call(spec.name, who, args)
            else:
                result = await getattr(self, "_" + spec.name)(session, args)
        except RuleError as e:
            return _refusal(str(e), e.code)
        except LoopdError as e:
            return {"ok": False, "message": str(e)}
        if isinstance(result, Result):
            return reply_of(result)
        if isinstance(result, msgspec.Struct):
            out: dict[str, Any] = msgspec.to_builtins(result)
            return out
        return result

    # -- worker tools --------------------------------------------------------------------------------

    async def _get_goal(self, session: str, args: ToolArgs) -> Result | dict[str, Any]:
        result = await self._ops(session).get_goal(session)
        return {"ok": True, "goalID": result.goal_id, **result.data} if result.ok else result

    async def _report_goal_progress(self, session: str, args: a.ReportProgressArgs) -> Result:
        return await self._ops(session).report_progress(
            session, args.summary, args.next or None, _opt(args.evidence)
        )

    async def _complete_goal(self, session: str, args: a.CompleteArgs) -> dict[str, Any]:
        return completion_reply(await self._ops(session).complete(session, args.summary, args.evidence))

    async def _block_goal(self, session: str, args: a.BlockArgs) -> Result:
        return await self._ops(session).block(session, args.reason, args.needed)

    # -- owner tools ---------------------------------------------------------------------------------

    async def _loopd_create_goal(
        self, session: str, args: a.CreateGoalArgs
    ) -> CreatedReply | CreateFailedReply | Result:
        ops = self._ops(session)
        result = await ops.create(args.name, args.objective, **args.options())
        if result.goal_id is None:
            return result
        if not result.ok:
            return create_failed_reply(result)
        return created_reply(result, await ops.service.load(result.goal_id), args)

    async def _owned(
        self,
        session: str,
        args: a.GoalTarget | a.InspectArgs,
        *,
        want: Callable[[GoalState], bool] | None = None,
        missing: str = "No matching active goal for this session.",
    ) -> GoalState:
        goals = await self._service(session).goals_of_owner(session)
        goal_id = args.goal_id or None
        if goal_id:
            found = next((g for g in goals if g.goal_id == goal_id and g.owner_session_id == session), None)
        else:
            chosen = want or (lambda g: g.status != "complete")
            found = next((g for g in goals if g.owner_session_id == session and chosen(g)), None)
        if found is None:
            raise RuleError(missing)
        return found

    async def _pause_goal(self, session: str, args: a.GoalTarget) -> Result:
        return await self._ops(session).pause((await self._owned(session, args)).goal_id)

    async def _resume_goal(self, session: str, args: a.GoalTarget) -> Result | dict[str, Any]:
        goal = await self._owned(
            session,
            args,
            want=lambda g: g.status in ("paused", "blocked"),
            missing="No matching paused/blocked goal for this session.",
        )
        ops = self._ops(session)
        if goal.status == "blocked":
            return await ops.retry(goal.goal_id)
        if goal.status in ("active", "paused"):
            return await ops.resume(goal.goal_id)
        # docs/reference/loopd.md#s3-4: the owner tool resumes a paused goal and retries a blocked one; any
        # other status (budget_limited, complete ...) is left as it is. The reference then still answers that it
        # resumed (#s8-2, a bug designed around): the answer here says that nothing changed, and why.
        return {
            "ok": False,
            "goalID": goal.goal_id,
            "status": goal.status,
            "message": f'Goal "{goal.name}" is {goal.status}; only a paused or blocked goal can be resumed. '
            "Nothing changed.",
        }

    async def _clear_goal(self, session: str, args: a.GoalTarget) -> Result:
        return await self._ops(session).clear((await self._owned(session, args)).goal_id)

    async def _nudge_goal(self, session: str, args: a.GoalTarget) -> Result:
        return await self._ops(session).nudge((await self._owned(session, args)).goal_id)

    async def _send_goal_input(self, session: str, args: a.SendInputArgs) -> Result:
        goal = await self._owned(session, args)
        if not args.text.strip():  # docs/reference/loopd.md#s3-7
            return Result(ok=False, message="Nothing to send.", goal_id=goal.goal_id, status=goal.status)
        return await self._ops(session).send(goal.goal_id, args.text)

    async def _switch_goal_identity(self, session: str, args: a.SwitchIdentityArgs) -> dict[str, Any]:
        model = None if isinstance(args.model, UnsetType) else args.model
        agent = None if isinstance(args.agent, UnsetType) else args.agent
        goals = await self._service(session).goals_of_owner(session)
        return await switch_reply(
            self._ops(session), goals, session, args.goal_id, model, agent, resume=args.resume is True
        )

    async def _loopd_list_models(self, session: str, args: ToolArgs) -> dict[str, Any]:
        """docs/reference/loopd.md#s3-21: the catalogs, and this session's goals (none for a worker)."""
        models, agents = await self.host.list_models(), await self.host.list_agents()
        owned = await self._service(session).goals_of_owner(session)
        agent_catalog = reference_json(agents)
        return {
            "ok": True,
            **reference_json(models),
            "agents": agent_catalog.get("agents", []),
            "agentCatalog": agent_catalog,
            "assignedGoals": [assigned_goal(g) for g in owned if g.owner_session_id == session],
        }

    async def _list_background_goals(self, session: str, args: ToolArgs) -> dict[str, Any]:
        goals = await self._service(session).goals_of_owner(session)
        rows = [list_row(g) for g in goals if g.status != "complete"]
        if not rows:
            return {"ok": True, "goals": [], "message": "No active background goals for this session."}
        return {"ok": True, "goals": rows}

    async def _inspect_background_goal(self, session: str, args: a.InspectArgs) -> dict[str, Any]:
        goal = await self._owned(session, args)
        return await inspect_reply(self.store, self.host, goal, args)

    async def _abort_goal_worker(self, session: str, args: a.GoalTarget) -> Result:
        return await self._ops(session).abort_worker((await self._owned(session, args)).goal_id)

    async def _force_complete_goal(self, session: str, args: a.ForceCompleteArgs) -> Result:
        goal = await self._owned(session, args)
        return await self._ops(session).force_complete(goal.goal_id, _opt(args.summary), _opt(args.evidence))

    async def _force_block_goal(self, session: str, args: a.ForceBlockArgs) -> Result:
        goal = await self._owned(session, args)
        return await self._ops(session).force_block(goal.goal_id, _opt(args.reason), _opt(args.needed))


def _opt(value: str | UnsetType) -> str | None:
    return value if isinstance(value, str) and value else None


def _refusal(message: str, code: str | None) -> dict[str, Any]:
    return {"ok": False, "message": message} | ({"errorCode": code} if code else {})


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
