"""Each interface speaks its own language, a refusal exits non-zero and errors name what is at fault (#22, item 9).

In-process CLI runs on a real SQLite log and a simulated host whose catalog lists an unusable model first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.cli.words import cli_words
from loopd_es.engine.core import EngineConfig
from loopd_es.errors import EXIT_CONFLICT, EXIT_USAGE

from ._cli_env import cli_env
from ._engine_harness import rig

SCRIPT = {
    "models": [
        {"provider": "p", "id": "gone", "name": "Gone", "usable": False},
        {"provider": "p", "id": "maybe", "name": "Maybe", "usable": "unknown"},
        {"provider": "p", "id": "m", "name": "Main"},
        {"provider": "q", "id": "other", "name": "Other M"},
    ],
    "agents": [{"name": "build"}],
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return cli_env(tmp_path, monkeypatch, SCRIPT)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(*args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _create(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code, out, err = _run(
        capsys, "goal", "create", "g", "--objective", "o", "--model", "p/m", "--read-only", *extra
    )
    assert code == 0, err
    return out.splitlines()[0]


def test_the_cli_names_cli_commands_and_a_refusal_exits_3(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gid = _create(capsys)
    code, out, err = _run(capsys, "goal", "retry", gid)
    assert code == EXIT_CONFLICT and out == ""
    assert err == 'loopd-es: Goal "g" is active; only a blocked goal can be retried.\n'
    code, out, _ = _run(capsys, "goal", "interactive", gid, "on")
    assert code == 0 and f"`loopd-es owner send|nudge {gid}`" in out and ":send" not in out
    code, out, _ = _run(capsys, "goal", "pause", gid)
    assert code == 0 and out.strip() == f'Goal "g" paused. Resume with `loopd-es goal resume {gid}`.'
    code, out, err = _run(capsys, "goal", "retry", gid)
    assert code == EXIT_CONFLICT and "(`loopd-es goal resume` resumes a paused one)" in err
    code, out, err = _run(capsys, "owner", "nudge", gid)
    assert (
        code == EXIT_CONFLICT
        and err.strip() == "loopd-es: Goal is paused; resume or retry it before nudging."
    )


@pytest.mark.parametrize(
    ("said", "cli"),
    [
        (
            "Goal has no worker session. Use resume_goal or retry_goal.",
            "Use `loopd-es goal resume` or `loopd-es goal retry`.",
        ),
        ("Discover models with loopd_list_models.", "Discover models with `loopd-es models --usable`."),
        ("steer it with :send/nudge.", "steer it with `loopd-es owner send|nudge`."),
        (
            "use inspect_background_goal, nudge_goal, pause_goal",
            "use `loopd-es goal show`, `loopd-es owner nudge`, `loopd-es goal pause`",
        ),
        (
            "my_resume_goal_notes and `resume_goal`",
            "my_resume_goal_notes and `resume_goal`",
        ),  # not a tool name here
    ],
)
def test_tool_names_become_commands_in_cli_messages(said: str, cli: str) -> None:
    assert cli_words(said).endswith(cli)


def test_an_unusable_model_is_refused_by_name_before_anything_is_stored(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for model in ("p/gone", "p/maybe", "p/absent"):
        code, out, err = _run(
            capsys, "goal", "create", "g", "--objective", "o", "--model", model, "--read-only"
        )
        assert code == EXIT_USAGE and out == "", (model, out)  # a model the host does not offer: bad input
        assert err.startswith(f'loopd-es: Model "{model}" is unavailable or not positively known usable.')
        assert "`loopd-es models --usable`" in err and "loopd_list_models" not in err
    code, out, err = _run(
        capsys, "goal", "create", "g", "--objective", "o", "--model", "p/m", "--fallback-model", "p/gone"
    )
    assert code == EXIT_USAGE and 'Fallback model "p/gone" is unavailable' in err
    code, out, _ = _run(capsys, "streams")
    assert "goal-" not in out  # nothing was stored for any refused goal


def test_models_lists_usable_first_and_filters(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "models")
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "/" in line]
    assert code == 0 and rows == ["p/m", "q/other", "p/maybe", "p/gone"]
    code, out, _ = _run(capsys, "models", "--usable")
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "/" in line]
    assert rows == ["p/m", "q/other"] and "Models: 4 across" in out and "Shown: 2." in out
    code, out, _ = _run(capsys, "models", "M", "--json")  # any case, in the reference or the name
    doc = json.loads(out)
    assert [m["model_id"] for m in doc["models"]] == ["m", "other", "maybe"] and doc["listed"] == 4


@pytest.mark.anyio
async def test_a_nudge_and_a_send_past_max_turns_are_charged_then_one_wrap_up_turn_then_blocked(
    tmp_path: Path,
) -> None:
    """docs/reference/loopd.md#s3-6, #s3-7, #s3-13: owner turns are charged and not refused by the limit,
    which is enforced at the
    next confirmed idle: one force-finish turn, then blocked with "(force-finish ignored)"."""
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(max_turns=2)

        async def turn_ends() -> None:
            await r.host.reply(sid)
            await r.pump()
            await r.advance(0)

        await turn_ends()  # turn 1 confirmed: turn 2 starts (2/2)
        assert (await r.state(gid)).budget_turn_count == 2
        assert (await r.ops.nudge(gid)).message == 'Re-prompted worker for "g".'
        assert (await r.ops.send(gid, "also this")).message == 'Sent to "g" as its own turn.'
        assert (await r.state(gid)).budget_turn_count == 4  # both charged, neither refused
        await turn_ends()  # the limit holds at this idle: one wrap-up turn
        state = await r.state(gid)
        assert state.force_finish_requested is True and state.budget_turn_count == 5
        assert "## FINAL REPORT REQUIRED — STOPPING SOON" in (await r.prompts(sid))[-1]
        await turn_ends()
        state = await r.state(gid)
        assert state.status == "blocked" and state.budget_turn_count == 5
        assert (
            state.blocker is not None
            and state.blocker.reason == "Reached max turns (2) (force-finish ignored)"
        )
