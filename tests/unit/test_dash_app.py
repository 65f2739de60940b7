"""The dashboard under Textual's test pilot: views fill from the read models, change when the log grows, and
every key runs the same CLI operation (its events land in the log)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from textual.binding import Binding
from textual.widgets import DataTable, Static, TabbedContent

from loopd_es.cli import main as cli
from loopd_es.dash.app import Config, Dashboard
from loopd_es.log import open_store
from tests.waits import alet_time_pass, await_until

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

pytestmark = pytest.mark.anyio


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """A log with two goals on the simulated host (created through the CLI, as a user would)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPD_ES_STORE", raising=False)
    monkeypatch.delenv("LOOPD_ES_HOST", raising=False)
    url = f"sqlite:{tmp_path / '.loopd' / 'events.db'}"
    for name, objective in (
        ("docs", "Write the guide"),
        ("evil\x1b[2J\x07name", "Objective with [b]markup[/b]"),
    ):
        assert (
            cli.main(
                "--store",
                url,
                "goal",
                "create",
                name,
                "--objective",
                objective,
                "--model",
                "openai/gpt-5",
                "--agent",
                "build",
                "--read-only",
            )
            == 0
        )
    return Config(
        store_url=url,
        read_db=tmp_path / ".loopd" / "read.db",
        cli=[sys.executable, "-m", "loopd_es.cli", "--store", url],
    )


def table_text(app: Dashboard, table_id: str) -> str:
    table = app.query_one(table_id, DataTable)
    return "\n".join(" ".join(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count))


def pane_text(app: Dashboard) -> str:
    rendered: Any = app.query_one("#goal-detail", Static).render()
    return str(rendered)


async def events_of(url: str) -> list[Envelope]:
    async with await open_store(url, create=False) as store:
        return [e async for e in store.read_all()]


async def test_goals_fill_the_table_and_the_detail_pane(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)):
        await await_until("the first redraw", lambda: app.refreshes > 0)
        text = table_text(app, "#goal-table")
        assert "docs" in text and "active" in text and "openai/gpt-5" in text
        assert "\x1b" not in text and "\x07" not in text  # a hostile name cannot drive the terminal
        await await_until("'turns' in pane_text(app)", lambda: "turns" in pane_text(app))
        detail = pane_text(app)
        assert "identity openai/gpt-5 / build" in detail and "runs" in detail


async def test_an_append_by_another_process_shows_without_a_key(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)):
        await await_until("the first redraw", lambda: app.refreshes > 0)
        assert "paused" not in table_text(app, "#goal-table")
        docs = next(g["goal_id"] for g in app.snap.goals if g["name"] == "docs")
        done = await anyio.run_process([*workspace.cli, "goal", "pause", docs], check=False)
        assert done.returncode == 0, done.stderr
        await await_until(
            "'paused' in table_text(app, '#goal-table')", lambda: "paused" in table_text(app, "#goal-table")
        )


async def test_keys_run_the_cli_operation_and_its_events_land(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        chosen = app.goal_id
        assert chosen is not None
        await pilot.press("p")
        await await_until(
            "the goal to show paused",
            lambda: any(g["goal_id"] == chosen and g["status"] == "paused" for g in app.snap.goals),
        )
        events = await events_of(workspace.store_url)
        assert any(e.type == "goal.paused" and e.stream == f"goal-{chosen}" for e in events)
        await pilot.press("r")
        await await_until(
            "the goal to show active again",
            lambda: any(g["goal_id"] == chosen and g["status"] == "active" for g in app.snap.goals),
        )


async def test_clear_asks_first(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        chosen = app.goal_id
        await pilot.press("x")
        await pilot.press("n")  # no: nothing happens
        await await_until("the question to close", lambda: type(app.screen).__name__ != "ConfirmScreen")
        await alet_time_pass(0.5, "a clear, were one run, lands in the log")
        assert not any(e.type == "goal.cleared" for e in await events_of(workspace.store_url))
        await pilot.press("x")
        await pilot.press("y")
        await await_until(
            "all(g['goal_id'] != chosen for g in app.snap.goals)",
            lambda: all(g["goal_id"] != chosen for g in app.snap.goals),
        )
        assert any(e.type == "goal.cleared" for e in await events_of(workspace.store_url))


async def test_history_with_a_time_cursor_and_explain(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        await pilot.press("h")
        await await_until("'goal.created' in pane_text(app)", lambda: "goal.created" in pane_text(app))
        last = pane_text(app)
        assert "cursor at #" in last
        await pilot.press("left_square_bracket")
        await await_until("pane_text(app) != last", lambda: pane_text(app) != last)
        assert app.cursor == len(app.positions) - 2
        await pilot.press("e")
        await await_until("'is active' in pane_text(app)", lambda: "is active" in pane_text(app))


async def test_help_and_the_switch_picker(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(80, 24)) as pilot:  # the smallest terminal it promises to fit
        await await_until("the first redraw", lambda: app.refreshes > 0)
        await pilot.press("question_mark")
        await await_until(
            "type(app.screen).__name__ == 'HelpScreen'", lambda: type(app.screen).__name__ == "HelpScreen"
        )
        await pilot.press("escape")
        await pilot.press("m")
        await await_until(
            "type(app.screen).__name__ == 'PickScreen'", lambda: type(app.screen).__name__ == "PickScreen"
        )
        screen: Any = app.screen
        assert "openai/gpt-5-mini" in screen.choices  # the host's catalog to pick from
        chosen = app.goal_id
        target = screen.choices.index("openai/gpt-5-mini")
        for _ in range(target + 1):
            await pilot.press("down")
        await pilot.press("enter")
        # the worker is busy with its first turn: the switch is deferred, and the pane says so
        await await_until(
            "the switch to show",
            lambda: any(
                g["goal_id"] == chosen and (g["model"] == "openai/gpt-5-mini" or g["pending_switch"])
                for g in app.snap.goals
            ),
        )
        switched = [e for e in await events_of(workspace.store_url) if e.type.startswith("identity.")]
        assert switched and all(
            e.stream in (f"goal-{chosen}",) or e.stream.startswith("switch-") for e in switched
        )


async def test_a_missing_log_is_a_message_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = await anyio.to_thread.run_sync(
        lambda: cli.main("--store", f"sqlite:{tmp_path / 'none.db'}", "dash")
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


async def test_the_loops_tab_shows_a_task(workspace: Config, tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text('{"sessions": [{"id": "s1"}]}')
    done = await anyio.run_process(
        [
            *workspace.cli,
            "loop",
            "--host",
            f"sim:{tmp_path / 'host.json'}",
            "--session",
            "s1",
            "--message-id",
            "m1",
            "add",
            "5m",
            "--jitter=false",
            "check the deploy",
        ],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    app = Dashboard(workspace)
    async with app.run_test(size=(120, 30)):
        await await_until(
            "'check the deploy' in table_text(app, '#loop-table')",
            lambda: "check the deploy" in table_text(app, "#loop-table"),
        )
        text = table_text(app, "#loop-table")
        assert "s1" in text and "active" in text


async def test_owner_keys_nudge_send_and_interactive(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        chosen = app.goal_id
        before = {e.event_id for e in await events_of(workspace.store_url)}

        async def new_types() -> set[str]:
            return {e.type for e in await events_of(workspace.store_url) if e.event_id not in before}

        await pilot.press("N")
        await await_until("goal.nudged in the log", new_types, done=lambda types: "goal.nudged" in types)
        await pilot.press("s")
        await await_until(
            "type(app.screen).__name__ == 'InputScreen'", lambda: type(app.screen).__name__ == "InputScreen"
        )
        await pilot.press(*"look at the logs")
        await pilot.press("enter")
        await await_until(
            "goal.input in the log",
            new_types,
            done=lambda types: any(t.startswith("goal.input") for t in types),
        )
        await pilot.press("i")
        await await_until(
            "the goal to show active again",
            lambda: any(g["goal_id"] == chosen and g["interactive"] for g in app.snap.goals),
        )


async def test_the_events_tab_and_the_timeline_key(workspace: Config, tmp_path: Path) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        app.w("TabbedContent", TabbedContent).active = "events"
        await await_until(
            "'goal.created' in table_text(app, '#event-table')",
            lambda: "goal.created" in table_text(app, "#event-table"),
        )
        app.w("TabbedContent", TabbedContent).active = "goals"
        chosen = app.goal_id
        assert chosen is not None
        await pilot.press("o")
        page = tmp_path / f"timeline-{chosen[:8]}.html"
        await await_until("the timeline page to be written", page.exists)
        assert "<html" in page.read_text().lower()


async def test_the_commands_tab_shows_output_and_terminates(workspace: Config) -> None:
    started = await anyio.run_process(
        [*workspace.cli, "cmd", "start", "--title", "ticker", "--", "sh", "-c", "echo hello-dash; sleep 30"],
        check=False,
    )
    assert started.returncode == 0, started.stderr
    command_id = started.stdout.decode().split()[0]
    app = Dashboard(workspace)
    async with app.run_test(size=(100, 30)) as pilot:
        await await_until(
            "'ticker' in table_text(app, '#command-table')",
            lambda: "ticker" in table_text(app, "#command-table"),
        )
        app.w("TabbedContent", TabbedContent).active = "commands"

        def detail() -> str:
            rendered: Any = app.w("#command-detail", Static).render()
            return str(rendered)

        await await_until(
            "'hello-dash' in detail()", lambda: "hello-dash" in detail()
        )  # the output tail, live
        assert "sh -c" in detail()
        await pilot.press("t")
        await await_until(
            "the command to stop running",
            lambda: any(
                c["command_id"] == command_id and c["status"] != "running" for c in app.snap.commands
            ),
            within=30,
        )


async def test_tab_and_shift_tab_change_tabs_at_80x24(workspace: Config) -> None:
    """The help promises Tab/Shift-Tab change tabs; Textual's own Tab only moves the focus."""
    app = Dashboard(workspace)
    async with app.run_test(size=(80, 24)) as pilot:
        await await_until("the first redraw", lambda: app.refreshes > 0)
        tabs = app.w("TabbedContent", TabbedContent)
        order = ["goals", "commands", "loops", "notifications", "events"]
        seen = [tabs.active]
        for _ in order:
            await pilot.press("tab")
            seen.append(tabs.active)
        assert seen == [*order, "goals"]  # every tab in order, then round again
        await pilot.press("shift+tab")
        assert tabs.active == "events"
        assert isinstance(app.focused, DataTable) and app.focused.id == "event-table"  # arrows move in it
        await pilot.press("shift+tab", "shift+tab", "shift+tab", "shift+tab")
        assert tabs.active == "goals"
        await pilot.press("s")  # in a dialog, Tab stays in the dialog
        await await_until("the input dialog", lambda: type(app.screen).__name__ == "InputScreen")
        await pilot.press("tab")
        assert tabs.active == "goals"
        await pilot.press("escape")


async def test_the_cost_column_fits_at_80_columns(workspace: Config) -> None:
    app = Dashboard(workspace)
    async with app.run_test(size=(80, 24)):
        await await_until("the first redraw", lambda: app.refreshes > 0)
        table = app.query_one("#goal-table", DataTable)
        names = [str(c.label) for c in table.ordered_columns]
        through_cost = table.ordered_columns[: names.index("cost") + 1]
        right_edge = sum(c.get_render_width(table) for c in through_cost)
        assert right_edge <= table.scrollable_content_region.width, (right_edge, table.size)
        assert "$0.0000" in table_text(app, "#goal-table")


def test_every_key_the_help_names_is_bound() -> None:
    from loopd_es.dash.screens import HELP

    bound = {key for b in Dashboard.BINDINGS if isinstance(b, Binding) for key in b.key.split(",")}
    named = {
        "p": "p pause", "r": "r resume", "R": "R retry", "N": "N nudge", "s": "s send", "i": "i interactive",
        "m": "m switch model", "a": "a switch agent", "x": "x clear", "h": "h history", "e": "e explain",
        "o": "o write", "t": "t terminate", "k": "k kill", "c": "c interrupt", "enter": "Enter attach",
        "left_square_bracket": "[ and ]", "right_square_bracket": "[ and ]", "tab": "Tab/Shift-Tab",
        "shift+tab": "Tab/Shift-Tab", "q": "q quit", "question_mark": "? this help",
    }  # fmt: skip
    for key, words in named.items():
        assert words in HELP, f"the help no longer says {words!r}: update this list"
        assert key in bound, f"the help names {words!r} but no binding has {key!r}"
