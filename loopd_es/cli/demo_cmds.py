"""``loopd-es demo``: a short scripted story on the embedded defaults, told by the real commands.

Every step runs an ordinary ``loopd-es`` command against a fresh SQLite log and the simulated host, so
every line the demo prints comes from the real log and read models; only the host's behaviour (a busy
worker, a refused agent switch) is scripted, through the simulated host's own test controls.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ..errors import EXIT_OK, UsageError
from ..host import open_host
from ..host.sim_script import FailureRule
from ..host.simulated import SimulatedHost

_MARKER = ".loopd-demo"
_HOST_SCRIPT: dict[str, Any] = {
    "models": [
        {"provider": "openai", "id": "gpt-5"},
        {"provider": "openai", "id": "gpt-5-mini"},
        {"provider": "anthropic", "id": "claude-sonnet-4-5"},
        {"provider": "anthropic", "id": "claude-haiku-4-5"},
    ],
    "agents": [{"name": "build"}, {"name": "plan"}, {"name": "review"}],
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "demo",
        help="play a short scripted story (switches, a 429 and fallback, a rollback, a budget stop)",
        description="Creates DIR (default ./loopd-demo, replaced if an earlier demo made it) with a SQLite log "
        "and a simulated host, plays a story through the ordinary commands, then prints the goals, one goal's "
        "history and explanation, and where its HTML timeline was written.",
    )
    p.add_argument(
        "--dir", type=Path, default=Path("loopd-demo"), help="where to put the demo's log and files"
    )
    p.set_defaults(handler=_demo)


class _Story:
    """Runs ``loopd-es`` commands in-process against the demo's log and host, printing what they print."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = f"sqlite:{root / 'events.db'}"
        self.host = f"sim:{root / 'host.json'}"

    async def say(self, text: str) -> None:
        print(f"\n== {text}", flush=True)

    async def run(self, *args: str, show: bool = True) -> str:
        """Run one command; print its output (indented) and return it. A failing step stops the demo."""
        from .main import main

        argv = ("--store", self.store, *args)
        if args[0] in ("models", "sim", "owner", "worker") or (args[0] == "goal" and args[1] != "show"):
            argv = (*argv, "--host", self.host)

        def call() -> tuple[int, str, str]:
            # commands may write to sys.stdout.buffer, so capture through a real text layer over bytes
            out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(*argv)
            return code, _text(out), _text(err)

        code, out, err = await anyio.to_thread.run_sync(call)
        if show:
            print(f"$ loopd-es {' '.join(_quote(a) for a in args)}")
            for line in (out + err).rstrip().splitlines():
                print(f"  {line}")
        if code not in (0, 3):
            raise UsageError(f"demo step `loopd-es {' '.join(args)}` failed ({code}): {err.strip()}")
        return out

    async def session_of(self, goal: str) -> str:
        shown = json.loads(await self.run("goal", "show", goal, "--json", show=False))
        return str(shown["goal"]["worker_session_id"])


async def _demo(args: argparse.Namespace) -> int:
    root: Path = args.dir
    await anyio.to_thread.run_sync(_prepare, root)
    story = _Story(root)
    host = await open_host(story.host)
    assert isinstance(host, SimulatedHost)  # the demo scripts the simulated host's behaviour
    try:
        await _play(story, host)
    finally:
        await host.aclose()
    return EXIT_OK


def _prepare(root: Path) -> None:
    """A fresh directory: replace an earlier demo's, never anything else."""
    if root.exists() and any(root.iterdir()):
        if not (root / _MARKER).exists():
            raise UsageError(f"{root} exists and is not an earlier demo; pass --dir NEW_DIR")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / _MARKER).write_text("made by loopd-es demo; safe to delete\n")
    (root / "host.json").write_text(json.dumps(_HOST_SCRIPT, indent=2))


async def _play(story: _Story, host: SimulatedHost) -> None:
    await story.say("Two goals on the simulated host")
    docs = (
        await story.run(
            "goal",
            "create",
            "docs",
            "--objective",
            "Write the user guide",
            "--model",
            "openai/gpt-5",
            "--agent",
            "build",
            "--fallback-model",
            "anthropic/claude-sonnet-4-5",
            "--fallback-model",
            "openai/gpt-5-mini",
        )
    ).splitlines()[0]
    tests = (
        await story.run(
            "goal",
            "create",
            "tests",
            "--objective",
            "Make the test suite pass",
            "--model",
            "openai/gpt-5-mini",
            "--agent",
            "build",
            "--max-turns",
            "2",
            "--read-only",
            "--interactive",
        )
    ).splitlines()[0]

    await story.say("A switch while the worker is busy is deferred, then applied at the next idle turn")
    await host.set_status(await story.session_of(docs), "busy")
    await story.run("goal", "switch-identity", docs, "--agent", "plan")
    await host.reply(await story.session_of(docs))  # the worker answers: idle
    await story.run("goal", "idle", docs)

    await story.say(
        "A 429 from the provider prepares the first usable fallback, applied once the wait is over"
    )
    error = {"statusCode": 429, "message": "Rate limit reached", "responseHeaders": {"retry-after": "1"}}
    await story.run("goal", "observe-error", docs, "--error", json.dumps(error))
    await anyio.sleep(2.2)  # the run's back-off (2 s) and the provider's Retry-After (1 s)
    await host.reply(await story.session_of(docs))
    await story.run("goal", "idle", docs)

    await story.say("A combined switch whose agent half the host refuses: the model half is rolled back")
    await host.reply(await story.session_of(tests))
    await story.run("goal", "idle", tests)  # the first turn ends; an interactive goal starts no other
    await host.inject(FailureRule(op="switch_agent", session=await story.session_of(tests), error="rejected"))
    await story.run(
        "goal", "switch-identity", tests, "--model", "anthropic/claude-haiku-4-5", "--agent", "review"
    )
    await host.clear_failures()
    await story.run("identities", tests)

    await story.say("Back on auto, the second goal runs out of turns")
    await story.run("goal", "interactive", tests, "off")
    for _ in range(4):
        await host.reply(await story.session_of(tests))
        out = await story.run("goal", "idle", tests)
        if "blocked" in out or "not active" in out:
            break

    await _engine_part(story, host)

    await story.say("What the read models say")
    await story.run("goals")
    await story.say("The history of the docs goal")
    await story.run("history", docs)
    await story.say("Why the tests goal is where it is")
    await story.run("explain", tests)
    html = story.root / "timeline.html"
    await story.run("history", docs, "--html", str(html), show=False)
    print(f"\nThe HTML timeline of the docs goal is in {html}; the log is {story.store}.")
    print(f"Explore: loopd-es --store {story.store} read | goals | history GOAL | explain GOAL")


async def _engine_part(story: _Story, host: SimulatedHost) -> None:
    """The engine drives a goal by itself: the worker only answers; nobody pokes ``goal idle``."""
    from ..engine.core import EngineConfig
    from ..engine.daemon import RunOptions, run_daemon

    await story.say("`loopd-es run`: the engine drives a goal by itself (the worker only answers)")
    options = RunOptions(
        store_url=story.store,
        host_url=story.host,
        holder="demo-engine",
        config=EngineConfig(confirm_idle_ms=100, maintenance_ms=500),
        lease_ms=3000,
        directory=str(story.root),
    )
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        # the commands run with stdout redirected (process-wide), so the engine writes past the redirection
        tg.start_soon(
            run_daemon,
            options,
            stop,
            lambda line: print(f"  [engine] {line}", file=sys.__stdout__, flush=True),
        )
        report = (
            await story.run(
                "goal",
                "create",
                "report",
                "--objective",
                "Summarise the week",
                "--model",
                "openai/gpt-5",
                "--agent",
                "build",
                "--max-turns",
                "2",
                "--read-only",
            )
        ).splitlines()[0]
        session = await story.session_of(report)
        for turn in range(1, 4):
            await story.run("sim", "reply", session, "--input", "1200", "--output", "300", "--cost", "0.02")
            if not await _wait_prompts(host, session, turn + 1):
                break
        await _wait_status(story, report, "blocked")
        stop.set()
    await story.run("notifications", "--goal", report)


async def _wait_prompts(host: SimulatedHost, session: str, count: int, limit_s: float = 15.0) -> bool:
    with anyio.move_on_after(limit_s):
        while True:  # the host's state is a file other processes write: poll it
            if len([p for p in (await host.snapshot()).prompts if p.session_id == session]) >= count:
                return True
            await anyio.sleep(0.05)
    return False


async def _wait_status(story: _Story, goal: str, status: str, limit_s: float = 15.0) -> None:
    with anyio.move_on_after(limit_s):
        while True:
            if (
                json.loads(await story.run("goal", "show", goal, "--json", show=False))["goal"]["status"]
                == status
            ):
                return
            await anyio.sleep(0.1)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", "replace")


def _quote(arg: str) -> str:
    return (
        arg
        if arg and all(c.isalnum() or c in "-_/.:=@" for c in arg)
        else "'" + arg.replace("'", "'\\''") + "'"
    )
