"""One-shot queries run without an event loop (``cli/loopless.py``) answer exactly as with one.

The demo's log (goals, switches, commands, notifications) is queried twice per command line: through
``sqlite:PATH`` (the snapshot, no loop) and through ``sqlite:PATH?synchronous=FULL`` (a URL option the snapshot
leaves to the full store, so the ordinary path runs). A fresh interpreter shows which path ran: without the
loop, neither asyncio nor anyio is ever imported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path

import anyio
import pytest

from loopd_es.cli import loopless
from loopd_es.cli.loopless import Handler, run_without_loop
from loopd_es.cli.main import STORE_ENV, main
from loopd_es.cli.options import LOOPLESS_FLAG
from loopd_es.events import goal as g
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store
from loopd_es.log.base import NeedsEventLoop


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo's log with its read models at the head, and one of its goals."""
    root = tmp_path_factory.mktemp("loopless") / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "loopd_es", "demo", "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    store = f"sqlite:{root / 'events.db'}"
    listed = subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", store, "goals", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return root / "events.db", json.loads(listed.stdout)["goals"][0]["goal_id"]


def _run(capsys: pytest.CaptureFixture[str], store: str, *argv: str) -> tuple[int, str, str]:
    code = main("--store", store, *argv)
    out, err = capsys.readouterr()
    return code, out, err


QUERIES = [
    ["read"],
    ["read", "--limit", "1"],
    ["read", "--last", "3"],
    ["read", "--backwards", "--limit", "5"],
    ["read", "--json", "--type", "goal.created", "--type", "goal.blocked"],
    ["read", "--stream", "notifications", "--from", "2"],
    ["read", "--stream", "no-such-stream"],
    ["streams"],
    ["goals"],
    ["goals", "--all", "--json"],
    ["goals", "--status", "blocked"],
    ["commands"],
    ["identities", "{goal}"],
    ["goal", "show", "{goal}"],
    ["goal", "show", "no-such-goal"],
    ["history", "{goal}"],
    ["history", "{goal}", "--json"],
    ["history", "{goal}", "--until", "5"],
    ["explain", "{goal}"],
    ["explain", "{goal}", "--json"],
]


@pytest.mark.parametrize("argv", QUERIES, ids=" ".join)
def test_a_query_answers_the_same_with_and_without_the_event_loop(
    demo: tuple[Path, str],
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, goal = demo
    monkeypatch.delenv(STORE_ENV, raising=False)
    answered: list[int | str | None] = []

    def driver(handler: Handler, args: argparse.Namespace) -> int | None:
        try:
            answered.append(run_without_loop(handler, args))
        except Exception as e:  # the error main says in one line, as the full path says it
            answered.append(type(e).__name__)
            raise
        return answered[-1]  # type: ignore[return-value]

    monkeypatch.setattr(loopless, "run_without_loop", driver)
    line = [a.replace("{goal}", goal) for a in argv]
    without_loop = _run(capsys, f"sqlite:{path}", *line)
    with_loop = _run(capsys, f"sqlite:{path}?synchronous=FULL", *line)
    assert without_loop == with_loop
    assert answered[0] is not None and answered[1:] == [None]  # without the loop, then with it
    assert without_loop[1] or without_loop[2]  # it answered something: an empty pair would match anything


def _fresh(store: str, *argv: str) -> tuple[int, list[str], str]:
    """Run ``argv`` in a fresh interpreter: its exit code, which of asyncio and anyio it imported, its output."""
    script = (
        "import sys\n"
        "from loopd_es.cli.main import main\n"
        f"code = main('--store', {store!r}, *{list(argv)!r})\n"
        "loaded = [m for m in ('asyncio', 'anyio') if m in sys.modules]\n"
        "print('LOADED', ','.join(loaded), code, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    marker = done.stderr.strip().splitlines()[-1].split(" ")
    return int(marker[2]), [m for m in marker[1].split(",") if m], done.stdout


@pytest.mark.parametrize(
    "argv", [["read", "--limit", "1"], ["streams"], ["goals"], ["history", "{goal}"], ["explain", "{goal}"]]
)
def test_a_query_on_a_current_sqlite_log_never_imports_the_event_loop(
    demo: tuple[Path, str], argv: list[str]
) -> None:
    path, goal = demo
    code, loaded, out = _fresh(f"sqlite:{path}", *[a.replace("{goal}", goal) for a in argv])
    assert (code, loaded) == (0, []) and out


def test_read_models_behind_the_log_are_caught_up_with_the_loop_then_read_without_it(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    subprocess.run(
        [sys.executable, "-m", "loopd_es", "demo", "--dir", str(root)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    store = f"sqlite:{root / 'events.db'}"
    code, loaded, before = _fresh(store, "goals", "--all", "--json")
    assert (code, loaded) == (0, [])
    goal = json.loads(before)["goals"][0]

    async def pause() -> None:
        async with await open_store(store, create=False) as log:
            stream = f"goal-{goal['goal_id']}"
            await log.append(stream, [new_event(g.GoalPaused(goal_id=goal["goal_id"]))])

    anyio.run(pause)
    code, loaded, after = _fresh(store, "goals", "--all", "--json")
    assert code == 0 and "asyncio" in loaded  # the read models were behind: caught up the ordinary way
    row = next(r for r in json.loads(after)["goals"] if r["goal_id"] == goal["goal_id"])
    assert row["status"] == "paused" != goal["status"]
    code, loaded, again = _fresh(store, "goals", "--all", "--json")
    assert (code, loaded, again) == (0, [], after)  # current again: no loop


def test_a_query_on_another_backend_runs_with_the_loop(tmp_path: Path) -> None:
    store = f"ndjson:{tmp_path / 'events.ndjson'}"
    assert (
        main(
            "--store",
            store,
            "append",
            "--stream",
            "s-1",
            "--type",
            "goal.paused",
            "--data",
            '{"goal_id": "x"}',
        )
        == 0
    )
    code, loaded, out = _fresh(store, "read")
    assert code == 0 and "asyncio" in loaded and "goal.paused" in out


def test_a_missing_log_is_said_as_the_store_says_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nothing.db"
    assert _run(capsys, f"sqlite:{missing}", "read") == _run(
        capsys, f"sqlite:{missing}?synchronous=FULL", "read"
    )
    code, _, err = _run(capsys, f"sqlite:{missing}", "goals")
    assert code == 2 and "no log at" in err and not missing.exists()


def _args(command: str = "read") -> argparse.Namespace:
    return argparse.Namespace(command=command)


def test_the_driver_returns_the_exit_code_and_clears_its_flag() -> None:
    args = _args()
    seen = []

    async def handler(given: argparse.Namespace) -> int:
        seen.append(getattr(given, LOOPLESS_FLAG))
        return 7

    assert run_without_loop(handler, args) == 7
    assert seen == [True] and getattr(args, LOOPLESS_FLAG) is False


def test_the_driver_answers_none_when_the_command_needs_the_loop() -> None:
    async def handler(_: argparse.Namespace) -> int:
        raise NeedsEventLoop("a read model to catch up")

    assert run_without_loop(handler, _args()) is None


class _Suspension:
    def __await__(self) -> Generator[str, None, None]:
        yield "a future of some event loop"


def test_a_command_that_suspends_without_a_loop_is_a_bug_said_by_name() -> None:
    async def handler(_: argparse.Namespace) -> int:
        await _Suspension()  # what awaiting real I/O does: hand control to a loop, which is not there
        return 0

    with pytest.raises(RuntimeError, match="`goals` suspended without an event loop"):
        run_without_loop(handler, _args("goals"))
