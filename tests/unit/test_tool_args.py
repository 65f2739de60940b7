"""Every tool's arguments decode strictly through its Struct (issue #22, items 1 and 2).

A table of wrongly typed, unknown and out-of-range values for every argument of every tool, each answered
with one line naming the field and nothing stored; the defects the issue names, one by one; every
``loopd_create_goal`` option reaching the goal's configuration and honoured (``maxFailures``); and the
``goal create`` flags made from the same Struct.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loopd_es.app.service import Ctx
from loopd_es.domain import goal_commands as c
from loopd_es.engine.core import EngineConfig
from loopd_es.engine.tool_api import TOOLS, ToolCall, ToolDispatcher
from loopd_es.engine.tool_args import CREATE_OPTIONS, CreateGoalArgs, options_table
from loopd_es.host.sim_script import FailureRule, HostScript

from ._engine_harness import Rig, rig

if TYPE_CHECKING:
    from loopd_es.engine.tool_spec import ToolSpec

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]

_VALID: dict[str, Any] = {"string": "x", "integer": 1, "number": 1, "boolean": True, "array": ["x"]}
_WRONG: dict[str, list[Any]] = {  # values of the wrong JSON type for each schema type
    "string": [123, True, ["a", "b"], {"a": "b"}],
    "integer": ["5", True, 1.5, [1]],
    "number": ["5", False, [1], {"n": 1}],
    "boolean": ["false", "true", 0, 1],
    "array": ["abc", {"a": "b"}, 123, [1, 2]],
    "object": [["x"], "k=v", {"k": 1}],
}


def _valid(schema: dict[str, Any]) -> Any:
    if schema.get("type") == "object":
        return {"K": "v"}
    value = _VALID[schema["type"]]
    minimum = schema.get("minimum")
    return max(value, minimum) if isinstance(minimum, int) else value


def _base(spec: ToolSpec) -> dict[str, Any]:
    """The required arguments of ``spec`` with values of the right type."""
    return {name: _valid(spec.properties()[name]) for name in spec.required()}


def _cases() -> list[tuple[str, str, Any]]:
    """(tool, field, wrong value) for every argument of every tool, plus out-of-range values where bounded."""
    cases: list[tuple[str, str, Any]] = []
    for spec in TOOLS.values():
        for name, schema in spec.properties().items():
            cases.extend((spec.name, name, wrong) for wrong in _WRONG[schema["type"]])
            if "maximum" in schema:
                cases.append((spec.name, name, schema["maximum"] * 2 + 1))
            for bound, past in (("maxLength", "x"), ("maxItems", ["x"])):
                if bound in schema:
                    cases.append((spec.name, name, past * (schema[bound] + 1)))
            if "minimum" in schema:
                cases.append((spec.name, name, schema["minimum"] - 1))
        cases.append((spec.name, "noSuchArgument", "x"))
    return cases


async def _call(d: ToolDispatcher, tool: str, session: str = "owner-1", **args: Any) -> dict[str, Any]:
    return await d.call(ToolCall(tool=tool, args=args, context={"sessionID": session}))


async def _head(r: Rig) -> int:
    return await r.store.head()


async def test_every_wrong_value_of_every_tool_is_one_line_naming_the_field(tmp_path: Path) -> None:
    cases = _cases()
    assert {tool for tool, _, _ in cases} == set(TOOLS)  # every tool is in the table
    async with rig(tmp_path) as r:
        d = ToolDispatcher(
            r.store, r.host, r.clock, str(tmp_path), store_url=f"sqlite:{tmp_path / 'events.db'}"
        )
        head = await _head(r)
        for tool, field, wrong in cases:
            spec = TOOLS[tool]
            answer = await _call(d, tool, **{**_base(spec), field: wrong})
            case = (tool, field, wrong, answer)
            assert answer["ok"] is False and answer["errorCode"] == "invalid_arguments", case
            message = answer["message"]
            assert message.startswith(f"Invalid arguments for {tool}: ") and "\n" not in message, case
            assert f"`$.{field}" in message or f"unknown field `{field}`" in message, case
        assert await _head(r) == head  # nothing stored
        assert not (tmp_path / ".opencode").exists()  # no artifact directory, no command log


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("loopd_create_goal", {"workspaceWrite": "false"}, "workspaceWrite"),
        ("loopd_create_goal", {"interactive": "false"}, "interactive"),
        ("loopd_create_goal", {"checks": "abc"}, "checks"),
        ("loopd_create_goal", {"checks": {"npm test": True}}, "checks"),
        ("loopd_create_goal", {"fallbackModels": 123}, "fallbackModels"),
        ("loopd_create_goal", {"maxFailures": "2"}, "maxFailures"),
        ("loopd_create_goal", {"timeoutMs": 1e19}, "timeoutMs"),
        (
            "loopd_command_start",
            {"title": "t", "command": "echo", "timeout_seconds": 1e19},
            "timeout_seconds",
        ),
        ("loopd_command_start", {"title": "t", "command": "echo", "cwd": "a\x00b"}, "cwd"),
        ("loopd_command_start", {"title": "t", "command": "echo", "args": ["a", 1]}, "args[1]"),
        ("loopd_command_start", {"title": "t", "command": "echo", "env": {"A": 1}}, "env[...]"),
        ("loopd_command_resize", {"command_id": "c1", "cols": "80", "rows": 24}, "cols"),
    ],
)
async def test_the_coercions_the_issue_names_are_refused(
    tmp_path: Path, tool: str, args: dict[str, Any], field: str
) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(
            r.store, r.host, r.clock, str(tmp_path), store_url=f"sqlite:{tmp_path / 'events.db'}"
        )
        base = {"name": "g", "objective": "o"} if tool == "loopd_create_goal" else {}
        answer = await _call(d, tool, **base, **args)
        assert answer["ok"] is False and f"`$.{field}`" in answer["message"], answer
        assert "internal error" not in answer["message"]
        assert await _head(r) == 0


async def test_create_takes_every_option_replies_in_the_reference_names_and_honours_max_failures(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        options: dict[str, Any] = {
            "fallbackModels": ["openai/gpt-5-mini"],
            "checks": ["true"],
            "checkCwd": str(tmp_path),
            "workspaceWrite": False,
            "progressFile": str(tmp_path / "p.md"),
            "costBudget": 2.5,
            "tokenBudget": 9000,
            "maxTurns": 7,
            "maxNoProgress": 4,
            "maxFailures": 2,
            "maxEvaluatorRejections": 6,
            "compactEvery": 3,
            "timeoutMs": 60_000,
            "scheduleEveryMs": 5000,
            "scheduleMaxRuns": 2,
            "interactive": True,
        }
        created = await _call(d, "loopd_create_goal", name="g", objective="o", **options)
        assert created["ok"] is True and created["title"] == "Goal created", created
        assert {k: created[k] for k in options} == options  # read back under the names they were given as
        state = await r.state(created["goalID"])
        assert created["workerSessionID"] == state.worker_session_id is not None
        assert "goal_id" not in created
        cfg = state.config
        assert (cfg.max_failures, cfg.compact_every, cfg.timeout_ms, cfg.token_budget) == (2, 3, 60_000, 9000)
        assert (
            cfg.schedule is not None and cfg.schedule.every_ms,
            cfg.schedule and cfg.schedule.max_runs,
        ) == (
            5000,
            2,
        )
        assert cfg.workspace_write is False and state.interactive is True and cfg.checks == ("true",)

        for n in (1, 2):
            await r.engine.service.execute(
                c.RecordRunFailure(goal_id=state.goal_id, error_text=f"error {n}"), Ctx.new()
            )
        blocked = await r.state(state.goal_id)
        assert blocked.status == "blocked", blocked  # at maxFailures 2, not the default 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"scheduleEveryMs": 500}, "scheduleEveryMs must be a number >= 1000"),
        ({"scheduleMaxRuns": 2}, "scheduleMaxRuns requires scheduleEveryMs"),
        ({"scheduleEveryMs": 1000, "scheduleMaxRuns": 1.5}, "scheduleMaxRuns must be an integer >= 1"),
    ],
)
async def test_schedule_options_are_refused_in_the_reference_words(
    tmp_path: Path, args: dict[str, Any], message: str
) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        answer = await _call(d, "loopd_create_goal", name="g", objective="o", **args)
        assert answer == {
            "ok": False,
            "errorCode": "invalid_schedule",
            "message": message,
            "title": "Goal not created",
        }
        assert await _head(r) == 0


def test_the_create_options_cover_the_struct_and_the_command() -> None:
    fields = set(CreateGoalArgs.__struct_fields__) - {"name", "objective"}
    assert set(CREATE_OPTIONS) == fields
    assert {o.field for o in CREATE_OPTIONS.values()} <= set(c.CreateGoal.__struct_fields__)
    table = options_table()
    assert all(f"| `{name}` |" in table and o.flag in table for name, o in CREATE_OPTIONS.items())


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _loopd(tmp_path, "goal", "create", "g", "--objective", "o", *args)


def _loopd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", *args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_goal_create_takes_the_options_and_goal_show_names_them(tmp_path: Path) -> None:
    made = _cli(tmp_path, "--max-failures", "2", "--compact-every", "3", "--timeout-ms", "60000",
                "--token-budget", "900", "--schedule-every-ms", "5000", "--read-only")  # fmt: skip
    assert made.returncode == 0, made.stderr
    goal_id = made.stdout.splitlines()[0]
    shown = _loopd(tmp_path, "goal", "show", goal_id, "--json")
    assert shown.returncode == 0, shown.stderr
    options = json.loads(shown.stdout)["goal"]["options"]
    listed = _loopd(tmp_path, "goals", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["goals"][0]["options"] == options
    assert (options["maxFailures"], options["compactEvery"], options["timeoutMs"]) == (2, 3, 60_000)
    assert (options["tokenBudget"], options["scheduleEveryMs"], options["workspaceWrite"]) == (
        900,
        5000,
        False,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [(("--max-failures", "0"), "--max-failures"), (("--timeout-ms", "10"), "--timeout-ms")],
)
def test_goal_create_refuses_out_of_range_values_naming_the_flag(
    tmp_path: Path, args: tuple[str, ...], flag: str
) -> None:
    refused = _cli(tmp_path, *args)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert flag in refused.stderr and "Traceback" not in refused.stderr


async def test_a_goal_that_cannot_start_replies_its_stage_and_what_to_do(tmp_path: Path) -> None:
    script = HostScript(failures=(FailureRule(op="create_worker", error="unavailable"),))
    async with rig(tmp_path, script) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        answer = await _call(d, "loopd_create_goal", name="g", objective="o", maxFailures=2)
        assert answer["ok"] is False and answer["title"] == "Goal creation failed", answer
        assert (answer["status"], answer["failedStage"]) == ("blocked", "worker_create")
        assert f'resume_goal (goal_id "{answer["goalID"]}")' in answer["nextAction"]
        assert (await r.state(answer["goalID"])).config.max_failures == 2


async def test_max_no_progress_finishes_a_goal_whose_turns_report_nothing(tmp_path: Path) -> None:
    """The reference never counts turns without progress (its guard is dead); a goal that asks for it gets it.
    A reported progress starts the count again; a goal without the option counts nothing, as before."""
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        created = await _call(
            d, "loopd_create_goal", name="g", objective="o", workspaceWrite=False, maxNoProgress=2
        )
        plain = await _call(d, "loopd_create_goal", name="h", objective="o", workspaceWrite=False)
        gid, other = created["goalID"], plain["goalID"]
        sid = created["workerSessionID"]

        async def turn(session: str, progress: bool = False) -> None:
            if progress:
                assert (await _call(d, "report_goal_progress", session, summary="step", next="n"))["ok"]
            await r.host.reply(session)
            await r.pump()
            await r.advance(0)

        await turn(sid, progress=True)
        await turn(sid)
        state = await r.state(gid)
        assert state.no_progress_count == 1 and not state.force_finish_requested
        await turn(sid)
        state = await r.state(gid)
        assert state.force_finish_requested is True and state.status == "active"
        assert "## FINAL REPORT REQUIRED — STOPPING SOON" in (await r.prompts(sid))[-1]
        await turn(sid)
        state = await r.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == "No progress for 3 consecutive turns (force-finish ignored)"

        await turn(plain["workerSessionID"])
        assert (await r.state(other)).no_progress_count == 0
