"""``loopd-es dash``: the live terminal dashboard (Textual).

Tabs for goals, commands, loops, notifications and recent events; a goal pane (status, phase, identity and
pending switch, budgets as bars, last progress, blocker, runs, switches, and its history with a time cursor or
its explanation); a command pane with the output tail. The dashboard runs the projector itself, so the screen
changes within the projector's lag of an append by any process (it follows the log; it never polls the database
in a loop). Every action runs the same CLI command a user would type (one code path), and its result shows as a
notice while its events appear in the views.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.coordinate import Coordinate
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Header, Static, TabbedContent, TabPane

from ..clock import from_ms
from ..postmortem.who import who_lines
from ..text_safe import term_block, term_line
from . import data
from .screens import ConfirmScreen, HelpScreen, InputScreen, PickScreen

W = TypeVar("W", bound=Widget)


def safe(value: Any, width: int = 60) -> Text:
    """Untrusted text (names, objectives, errors, output) as plain text: no markup, no escapes, one line."""
    text = term_line("" if value is None else str(value))
    return Text(text if len(text) <= width else text[: width - 1] + "…")


def bar(used: float, limit: float | None, width: int = 20) -> Text:
    """``[#####.....] used/limit`` (or just ``used`` without a limit)."""
    if not limit:
        return Text(f"{used:g} (no limit)")
    share = max(0.0, min(1.0, used / limit))
    filled = round(share * width)
    style = "red" if share >= 1 else "yellow" if share >= 0.8 else "green"
    out = Text("[")
    out.append("#" * filled, style=style)
    out.append("." * (width - filled))
    out.append(f"] {used:g}/{limit:g}")
    return out


def loop_cells(r: dict[str, Any]) -> tuple[Any, ...]:
    """A ``loops`` row: times are epoch milliseconds in the read model."""
    return (
        safe(r.get("task_id"), 14),
        safe(r.get("session_id"), 14),
        r.get("mode") or "",
        r.get("status") or "",
        _ms(r.get("next_due_at")),
        _ms(r.get("last_fired_at")),
        str(r.get("fires", 0)),
        str(r.get("missed", 0)),
        safe(r.get("prompt"), 40),
    )


def _ms(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return from_ms(value).strftime("%m-%d %H:%M:%S")


GOAL_COLUMNS: tuple[str, ...] = ("id", "name", "status", "turns", "cost", "phase", "model", "agent")
"""The numbers before the identity: at 80 columns a long model name is cut at the right, never the cost (the
goal pane shows the whole identity)."""


def goal_cells(g: dict[str, Any]) -> tuple[Any, ...]:
    turns = f"{g['turns_used']}/{g['max_turns'] or '-'}"
    return (
        g["goal_id"][:8],
        safe(g["name"], 20),
        g["status"],
        turns,
        f"${g['cost_used']:.4f}",
        g["phase"],
        safe(g["model"], 28),
        safe(g["agent"], 12),
    )


def command_cells(c: dict[str, Any]) -> tuple[Any, ...]:
    return (
        c["command_id"][:12],
        safe(c["title"], 24),
        c["status"],
        c["end_reason"] or "",
        (c["goal_id"] or "")[:8],
        (c["started_at"] or "")[:19],
    )


def note_cells(n: dict[str, Any]) -> tuple[Any, ...]:
    state = "delivered" if n.get("delivered_at") else "pending"
    return (
        (n.get("requested_at") or "")[:19],
        (n.get("goal_id") or "")[:8],
        n.get("kind", ""),
        state,
        safe(n.get("text"), 70),
    )


def fill(table: DataTable[Any], rows: list[tuple[str, tuple[Any, ...]]], selected: str | None) -> str | None:
    """Show ``rows`` (key, cells) in ``table``, changing only what changed; returns the selected key, kept when
    it is still there. Rebuilding a 1,000-row table on every append would cost more than the append itself."""
    keys = [key for key, _ in rows]
    shown = [str(row_key.value) for row_key in table.rows]
    if shown == keys:
        for row_index, (_, cells) in enumerate(rows):
            current = table.get_row_at(row_index)
            for column, value in enumerate(cells):
                if str(current[column]) != str(value):
                    table.update_cell_at(Coordinate(row_index, column), value)
    else:
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
    if not keys:
        return None
    chosen = selected if selected in keys else keys[0]
    if table.cursor_row != keys.index(chosen):
        table.move_cursor(row=keys.index(chosen))
    return chosen


@dataclass
class Config:
    store_url: str
    read_db: Path
    cli: list[str]  # how to run `loopd-es` with the same store


class Dashboard(App[None]):
    """The dashboard app; ``config`` says which log, which read database and how to run the CLI."""

    TITLE = "loopd-es"
    CSS = """
    #goal-pane, #command-pane { height: 1fr; border: round $accent; padding: 0 1; }
    #tables { height: 1fr; }
    DataTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        # priority: otherwise the screen's own Tab (move the focus) runs first and the tabs never change
        Binding("tab", "tab(1)", "next tab", show=False, priority=True),
        Binding("shift+tab", "tab(-1)", "previous tab", show=False, priority=True),
        Binding("p", "goal('pause')", "pause"),
        Binding("r", "goal('resume')", "resume"),
        Binding("R", "goal('retry')", "retry"),
        Binding("N", "nudge", "nudge"),
        Binding("s", "send", "send"),
        Binding("i", "interactive", "interactive"),
        Binding("m", "switch('model')", "model"),
        Binding("a", "switch('agent')", "agent"),
        Binding("x", "clear", "clear"),
        Binding("h", "history", "history"),
        Binding("e", "explain", "explain"),
        Binding("left_square_bracket", "cursor(-1)", "earlier", show=False),
        Binding("right_square_bracket", "cursor(1)", "later", show=False),
        Binding("o", "timeline", "timeline", show=False),
        Binding("t", "command('terminate')", "terminate", show=False),
        Binding("k", "command('kill')", "kill", show=False),
        Binding("c", "command('interrupt')", "interrupt", show=False),
        Binding("enter", "attach", "attach", show=False),
    ]

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.snap = data.Snapshot()
        self.goal_id: str | None = None
        self.command_id: str | None = None
        self.pane_mode = "detail"  # detail | history | explain
        self.cursor: int | None = None  # the history's time cursor (an index into positions)
        self.positions: list[int] = []
        self.refreshes = 0  # how many times the views were redrawn from the read models (tests wait on it)
        self._reloading = False
        self._reload_again = False

    # -- layout ----------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="goals"):
            with TabPane("Goals", id="goals"), Vertical():
                yield DataTable(id="goal-table", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="goal-pane"):
                    yield Static("Select a goal.", id="goal-detail", markup=False)
            with TabPane("Commands", id="commands"), Vertical():
                yield DataTable(id="command-table", cursor_type="row")
                with VerticalScroll(id="command-pane"):
                    yield Static("Select a command.", id="command-detail", markup=False)
            with TabPane("Loops", id="loops"):
                yield DataTable(id="loop-table", cursor_type="row")
            with TabPane("Notifications", id="notifications"):
                yield DataTable(id="notification-table", cursor_type="row")
            with TabPane("Events", id="events"):
                yield DataTable(id="event-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.w("#goal-table", DataTable).add_columns(*GOAL_COLUMNS)
        self.w("#command-table", DataTable).add_columns("id", "title", "status", "end", "goal", "started")
        self.w("#loop-table", DataTable).add_columns(
            "task", "session", "mode", "status", "next due", "last fire", "fires", "missed", "prompt"
        )
        self.w("#notification-table", DataTable).add_columns("requested", "goal", "kind", "state", "text")
        self.w("#event-table", DataTable).add_columns("#", "recorded", "stream", "type")
        # the arrows select goals at once, as the help says: focused after the screen's own first focus (the tabs)
        self.call_after_refresh(self.w("#goal-table", DataTable).focus)
        self.follow()
        # a command's output goes to its file, not to the log: while the pane shows it, read its tail twice a second
        self.set_interval(0.5, self._output_tick)

    async def _output_tick(self) -> None:
        with contextlib.suppress(NoMatches):
            if self.w("TabbedContent", TabbedContent).active == "commands" and self.command_id is not None:
                await self.show_command()

    def action_tab(self, step: int) -> None:
        """Tab/Shift-Tab change tabs, as the help says; in a dialog they move between its fields as usual."""
        if len(self.screen_stack) > 1:
            (self.screen.focus_next if step > 0 else self.screen.focus_previous)()
            return
        tabs = self.w("TabbedContent", TabbedContent)
        panes = [pane.id for pane in tabs.query(TabPane) if pane.id]
        tabs.active = panes[(panes.index(tabs.active) + step) % len(panes)]
        with contextlib.suppress(NoMatches):  # the arrows then move in the tab's table
            tabs.get_pane(tabs.active).query_one(DataTable).focus()

    def w(self, selector: str, kind: type[W]) -> W:
        """A widget of the main screen, whichever screen (help, a dialog) is on top."""
        if not self.screen_stack:  # closing
            raise NoMatches(selector)
        return self.screen_stack[0].query_one(selector, kind)

    # -- live data -------------------------------------------------------------------------------------

    @work(exclusive=True, group="follow")
    async def follow(self) -> None:
        """Run the projector: catch up, then apply appends as they land, redrawing after each commit."""
        from ..log import open_store
        from ..projector import Projector, load_registry

        try:
            store = await open_store(self.config.store_url, create=False)
        except Exception as e:
            self.w("#goal-detail", Static).update(Text(f"cannot open the log: {e}"))
            return
        self.store = store
        try:
            async with await Projector.open(store, load_registry(), self.config.read_db) as projector:

                def committed(_result: object, _at: float) -> None:
                    self.call_later(self.reload)

                projector.on_commit = committed
                await projector.run_once()
                await self.reload()
                await projector.follow(poll_interval=5.0)
        except Exception as e:
            self.w("#goal-detail", Static).update(Text(f"the read models cannot be used: {e}"))
        finally:
            await store.aclose()

    async def reload(self) -> None:
        """Redraw every view from one snapshot of the read models (one redraw at a time)."""
        if self._reloading:
            self._reload_again = True  # commits that land meanwhile are drawn by one more round
            return
        self._reloading = True
        try:
            while True:
                self._reload_again = False
                await self._reload()
                if not self._reload_again:
                    return
        except NoMatches:  # the app is closing: its widgets are already gone
            return
        finally:
            self._reloading = False

    async def _reload(self) -> None:
        self.snap = await anyio.to_thread.run_sync(data.snapshot, self.config.read_db)
        goals = [(g["goal_id"], goal_cells(g)) for g in self.snap.goals]
        self.goal_id = fill(self.w("#goal-table", DataTable), goals, self.goal_id)
        commands = [(c["command_id"], command_cells(c)) for c in self.snap.commands]
        self.command_id = fill(self.w("#command-table", DataTable), commands, self.command_id)
        loops = [(str(r.get("task_id")), loop_cells(r)) for r in self.snap.loops]
        fill(self.w("#loop-table", DataTable), loops, None)
        notes = [(str(n.get("position")), note_cells(n)) for n in self.snap.notifications]
        fill(self.w("#notification-table", DataTable), notes, None)
        if self.w("TabbedContent", TabbedContent).active == "events":  # read the log only when it is shown
            await self.show_events()
        await self.show_goal()
        await self.show_command()
        self.refreshes += 1

    async def show_events(self) -> None:
        events = await data.recent_events(self.store)
        rows = [
            (
                str(e["position"]),
                (str(e["position"]), e["recorded_at"][11:23], safe(e["stream"], 40), e["type"]),
            )
            for e in events
        ]
        fill(self.w("#event-table", DataTable), rows, None)

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "events":
            with contextlib.suppress(NoMatches):
                await self.show_events()

    @on(DataTable.RowHighlighted, "#goal-table")
    async def _goal_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key is not None and key != self.goal_id:
            self.goal_id, self.pane_mode, self.cursor = key, "detail", None
            with contextlib.suppress(NoMatches):  # the app may be closing
                await self.show_goal()

    @on(DataTable.RowHighlighted, "#command-table")
    async def _command_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key is not None and key != self.command_id:
            self.command_id = key
            with contextlib.suppress(NoMatches):
                await self.show_command()

    async def show_goal(self) -> None:
        pane = self.w("#goal-detail", Static)
        if self.goal_id is None:
            pane.update(Text("No goals yet: create one with `loopd-es goal create`."))
            return
        if self.pane_mode == "history":
            until = self.positions[self.cursor] if self.positions and self.cursor is not None else None
            lines = await data.history_lines(self.store, self.config.read_db, self.goal_id, until)
            head = (
                f"history (cursor at #{until}; [ and ] move it, h closes)"
                if until
                else "history ([ and ] scrub)"
            )
            pane.update(Text("\n".join([head, "", *(term_block(x) for x in lines)])))
            return
        if self.pane_mode == "explain":
            lines = await data.explain_lines(self.store, self.config.read_db, self.goal_id)
            pane.update(Text("\n".join(term_block(x) for x in lines)))
            return
        g = await anyio.to_thread.run_sync(data.goal_detail, self.config.read_db, self.goal_id)
        pane.update(render_goal(g) if g else Text("The goal is gone."))

    async def show_command(self) -> None:
        pane = self.w("#command-detail", Static)
        row = next((c for c in self.snap.commands if c["command_id"] == self.command_id), None)
        if row is None:
            pane.update(Text("No commands yet: start one with `loopd-es cmd start`."))
            return
        tail = await anyio.to_thread.run_sync(data.output_tail, self.config.store_url, row["command_id"], 40)
        out = Text()
        out.append(f"{row['command_id']}  {term_line(row['title'])}  [{row['status']}]\n", style="bold")
        out.append(f"$ {term_line(row['command_line'])}\n")
        for said in who_lines(row):
            out.append(f"{said}\n", style="dim")
        if row.get("watch_filter") or row.get("watch_until"):
            out.append(
                f"watch: filter={term_line(row.get('watch_filter') or '-')} "
                f"until={term_line(row.get('watch_until') or '-')} state={row['watch_state']}\n"
            )
        out.append("\n".join(term_block(line) for line in tail))
        pane.update(out)

    # -- actions ---------------------------------------------------------------------------------------

    async def run_cli(self, *args: str, stdin: str | None = None) -> None:
        """Run ``loopd-es ARGS`` (the same operation as typing it) and show its answer as a notice."""
        command = [*self.config.cli, *args]
        result = await anyio.run_process(command, input=stdin.encode() if stdin else None, check=False)
        said = (result.stdout or result.stderr).decode("utf-8", "replace").strip().splitlines()
        text = term_line(said[0] if said else f"{shlex.join(args)}: done")
        self.notify(text, severity="information" if result.returncode == 0 else "error", timeout=6)

    async def action_goal(self, verb: str) -> None:
        if self.goal_id:
            await self.run_cli("goal", verb, self.goal_id)

    async def action_nudge(self) -> None:
        if self.goal_id:
            await self.run_cli("owner", "nudge", self.goal_id)

    def action_send(self) -> None:
        if self.goal_id:
            goal = self.goal_id

            async def send(text: str | None) -> None:
                if text:
                    await self.run_cli("owner", "send", goal, text)

            self.push_screen(InputScreen("Send to the worker:"), send)

    async def action_interactive(self) -> None:
        row = next((g for g in self.snap.goals if g["goal_id"] == self.goal_id), None)
        if row is not None:
            await self.run_cli("goal", "interactive", row["goal_id"], "off" if row["interactive"] else "on")

    async def action_switch(self, what: str) -> None:
        if not self.goal_id:
            return
        goal = self.goal_id
        result = await anyio.run_process([*self.config.cli, "models", "--json"], check=False)
        choices: list[str] = []
        if result.returncode == 0:
            import json

            doc = json.loads(result.stdout or b"{}")
            if what == "model":  # the shape of `loopd-es models --json`
                choices = [
                    f"{m['provider_id']}/{m['model_id']}"
                    for m in doc.get("models") or []
                    if m.get("usable") is not False
                ]
            else:
                choices = [a["name"] for a in doc.get("agents") or []]

        async def switch(choice: str | None) -> None:
            if choice:
                await self.run_cli("goal", "switch-identity", goal, f"--{what}", choice)

        self.push_screen(PickScreen(f"Switch the {what} to:", choices), switch)

    def action_clear(self) -> None:
        if self.goal_id:
            goal = self.goal_id
            name = next((g["name"] for g in self.snap.goals if g["goal_id"] == goal), goal)

            async def clear(yes: bool | None) -> None:
                if yes:
                    await self.run_cli("goal", "clear", goal)

            self.push_screen(ConfirmScreen(f"Clear goal {term_line(name)!r} for good? (y/n)"), clear)

    async def action_history(self) -> None:
        if self.goal_id is None:
            return
        if self.pane_mode == "history":
            self.pane_mode, self.cursor = "detail", None
        else:
            self.pane_mode = "history"
            self.positions = await data.history_positions(self.store, self.config.read_db, self.goal_id)
            self.cursor = len(self.positions) - 1 if self.positions else None
        await self.show_goal()

    async def action_explain(self) -> None:
        self.pane_mode = "detail" if self.pane_mode == "explain" else "explain"
        await self.show_goal()

    async def action_cursor(self, step: int) -> None:
        if self.pane_mode == "history" and self.cursor is not None and self.positions:
            self.cursor = max(0, min(len(self.positions) - 1, self.cursor + step))
            await self.show_goal()

    async def action_timeline(self) -> None:
        if self.goal_id:
            path = Path.cwd() / f"timeline-{self.goal_id[:8]}.html"
            await self.run_cli("history", self.goal_id, "--html", str(path))

    async def action_command(self, verb: str) -> None:
        if self.command_id and self.w("TabbedContent", TabbedContent).active == "commands":
            await self.run_cli("cmd", verb, self.command_id)

    def action_attach(self) -> None:
        if self.command_id and self.w("TabbedContent", TabbedContent).active == "commands":
            import subprocess

            with self.suspend():  # the terminal is the command's until Ctrl-], then back to the dashboard
                subprocess.run([*self.config.cli, "cmd", "attach", self.command_id], check=False)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def render_goal(g: dict[str, Any]) -> Text:
    out = Text()
    out.append(term_line(g["name"]), style="bold")
    out.append(f"  {g['goal_id']}\n")
    out.append(f"status {g['status']}  phase {g['phase']}{'  interactive' if g['interactive'] else ''}\n")
    out.append(f"identity {term_line(g['model'] or '-')} / {term_line(g['agent'] or '-')}")
    if g.get("pending_switch"):
        out.append(f"  pending switch: {term_line(g['pending_switch'])}", style="yellow")
    if g.get("switch_in_flight"):
        out.append(f"  switching: {term_line(g['switch_in_flight'])}", style="yellow")
    out.append("\n\nturns  ")
    out.append(bar(g["turns_used"], g["max_turns"]))
    out.append("\ntokens ")
    out.append(bar(g["tokens_used"], g["token_budget"]))
    out.append("\ncost $ ")
    out.append(bar(round(g["cost_used"], 4), g["cost_budget"]))
    out.append("\n\n")
    if g.get("last_progress"):
        out.append(f"progress: {term_line(g['last_progress'])}")
        if g.get("last_progress_next"):
            out.append(f" (next: {term_line(g['last_progress_next'])})")
        out.append("\n")
    if g.get("blocker_reason"):
        out.append(
            f"blocked: {term_line(g['blocker_reason'])}; needed: {term_line(g['blocker_needed'] or '-')}\n",
            style="red",
        )
    if g.get("last_error"):
        out.append(f"last error: {term_line(g['last_error'])}\n")
    for said in who_lines(g):  # the OpenCode tool calls that created, ended or last changed it
        out.append(f"{said}\n", style="dim")
    out.append("\nruns\n", style="bold")
    for r in g.get("runs", [])[-10:]:
        out.append(
            f"  #{r['turn']:<3} {r['kind']:<12} {r['status']:<10} {r['tokens']:>7} tok  "
            f"${r['cost']:.4f}  {(r['started_at'] or '')[11:19]}\n"
        )
    if g.get("switches"):
        out.append("\nswitches\n", style="bold")
        for s in g["switches"][-6:]:
            out.append(
                f"  {term_line(str(s.get('model') or ''))} {term_line(str(s.get('agent') or ''))} "
                f"{s.get('outcome') or s.get('status') or ''}\n"
            )
    out.append("\nh history · e explain · p pause · r resume · m model · a agent · ? help")
    return out


def main_config(store_url: str, read_db: Path) -> Config:
    return Config(
        store_url=store_url, read_db=read_db, cli=[sys.executable, "-m", "loopd_es.cli", "--store", store_url]
    )


__all__ = ("Config", "Dashboard", "main_config", "render_goal")
