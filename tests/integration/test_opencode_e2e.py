"""The whole story against a real ``opencode serve``: owner tool → engine → worker → switch → 429 → fallback → done.

Real processes: the fake model server (in this process), ``opencode serve`` with the loopd tools installed in its
project, and ``loopd-es run`` started from the project directory. The worker's answers come from the fake's
script, one step per turn; everything the test asserts is read back from the log, the fake's request log and
OpenCode's transcripts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loopd_es.errors import LogNotFoundError
from loopd_es.host.opencode import OpenCodeHost
from loopd_es.log import open_store
from tests.waits import WaitTimeout, alet_time_pass, await_until, wait_for_output

from ..opencode.fake_llm import FakeLLM
from ..opencode.server import OpenCodeServer

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(240)]


def cli(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es.cli", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


class Stack:
    """Fake model server + OpenCode (tools installed) + ``loopd-es run``, in one project directory."""

    def __init__(self, root: Path) -> None:
        self.fake = FakeLLM().start()
        self.opencode = OpenCodeServer(root / "oc", self.fake)
        self.project = self.opencode.project
        self.project.mkdir(parents=True, exist_ok=True)
        self.store = f"sqlite:{root / 'log' / 'events.db'}"
        self.env = {
            **os.environ,
            "LOOPD_ES_STORE": self.store,
            "LOOPD_ES_HOST": "",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        installed = cli(self.project, self.env, "opencode", "install", ".")
        assert installed.returncode == 0, installed.stderr
        self.opencode.start()
        self.env["LOOPD_ES_HOST"] = f"opencode:{self.opencode.url}"
        self.engine: subprocess.Popen[str] | None = None

    def start_engine(self, confirm_idle_ms: int = 300, *extra: str) -> None:
        log = self.project.parent / f"engine-{time.monotonic_ns()}.log"  # kept for post-mortems of failures
        with log.open("w") as out:
            self.engine = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "loopd_es.cli",
                    "--verbose",
                    "run",
                    "--confirm-idle-ms",
                    str(confirm_idle_ms),
                    "--lease-ms",
                    "3000",
                    *extra,
                ],
                cwd=self.project,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=out,
                text=True,
            )
        self.engine_log = log
        # said once the socket is listening
        wait_for_output(log, "serving the OpenCode tools", process=self.engine)

    def stop(self) -> None:
        if self.engine is not None:
            if self.engine.poll() is None:
                self.engine.send_signal(signal.SIGTERM)
                try:
                    self.engine.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.engine.kill()
                    self.engine.wait(timeout=10)
        self.opencode.stop()
        self.fake.stop()

    async def events(self) -> list[Envelope]:
        async with await open_store(self.store, create=False) as log:
            return [env async for env in log.read_all()]

    async def until(
        self, what: str, check: Callable[[list[Envelope]], bool], within: float = 60
    ) -> list[Envelope]:
        try:
            return await await_until(
                what, self.events, done=check, within=within, ignoring=(LogNotFoundError,)
            )
        except WaitTimeout as e:
            envs = e.last if isinstance(e.last, list) else []
            kinds = [(x.stream[:14], x.type) for x in envs][-25:]
            engine = self.engine_log.read_text()[-3000:] if hasattr(self, "engine_log") else ""
            raise AssertionError(
                f"timed out waiting for {what}; last events: {kinds}; engine said: {engine}"
            ) from e


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def create_with_fallback(stack: Stack, name: str, model: str) -> None:
    """A goal on ``model`` with ``fake/other`` as its fallback, created by the CLI."""
    created = cli(
        stack.project,
        stack.env,
        *(
            "goal",
            "create",
            name,
            "--objective",
            "Answer",
            "--model",
            model,
            "--fallback-model",
            "fake/other",
        ),
        *("--max-turns", "3", "--check", "true"),
    )
    assert created.returncode == 0, created.stderr


def of_type(envs: list[Envelope], kind: str) -> list[Envelope]:
    return [e for e in envs if e.type == kind]


def data(env: Envelope) -> dict[str, Any]:
    return env.data_dict()


async def test_an_owner_tool_starts_a_goal_that_switches_falls_back_and_completes(stack: Stack) -> None:
    fake = stack.fake
    fake.worker_script = [
        ("call", "report_goal_progress", {"summary": "read the goal", "next": "write the guide"}),
        ("slow", 8),  # four seconds: the owner's switch arrives while the worker is busy
        ("text",),  # the switched model, which answers 429: OpenCode retries, then the engine falls back
        ("call", "complete_goal", {"summary": "guide written", "evidence": "checks pass"}),
    ]
    stack.start_engine()
    host = OpenCodeHost(stack.opencode.url)
    try:
        owner = await host.create_worker(title="owner")
        create = {
            "name": "guide",
            "objective": "Write the guide",
            "model": "fake/good",
            "agent": "build",
            "fallbackModels": ["fake/other"],
            "checks": ["true"],
            "maxTurns": 10,
        }
        await host.prompt(
            owner.session_id, f"CALL loopd_create_goal {json.dumps(create)}", model="fake/good", agent="build"
        )
        envs = await stack.until("the goal's progress", lambda e: bool(of_type(e, "goal.progress")))
        created = data(of_type(envs, "goal.created")[0])
        assert created["owner_session_id"] == owner.session_id  # the tool knew which session called it
        goal_stream = of_type(envs, "goal.created")[0].stream
        goal_id = goal_stream.removeprefix("goal-")
        worker = data(of_type(envs, "goal.worker_assigned")[0])["worker_session_id"]
        assert worker != owner.session_id
        progress = of_type(envs, "goal.progress")[0]
        assert progress.stream == goal_stream and data(progress)["summary"] == "read the goal"

        # the second turn is slow: switch the model while the worker is busy
        await await_until(
            "the second turn to reach the model",
            lambda: any(r["session"] == worker and r["turn"] == 2 for r in fake.requests),
        )
        switch = {"goal_id": goal_id, "model": "fake/limited"}  # the owner asks from its OpenCode session
        await host.prompt(
            owner.session_id,
            f"CALL switch_goal_identity {json.dumps(switch)}",
            model="fake/good",
            agent="build",
        )
        envs = await stack.until("the deferred switch", lambda e: any("deferred" in x.type for x in e))

        envs = await stack.until(
            "the goal to complete", lambda e: bool(of_type(e, "goal.completed")), within=120
        )
        by_turn = [(r["turn"], r["model"]) for r in fake.requests if r["session"] == worker]
        turns = dict(by_turn)  # the model that answered each turn (tool follow-ups included)
        assert turns[1] == "good" and turns[2] == "good"
        assert "limited" in [m for t, m in by_turn if t == 3], by_turn  # the deferred switch landed next turn
        assert turns[max(turns)] == "other", by_turn  # the fallback, on the same OpenCode session
        assert {r["session"] for r in fake.requests if r["session"] in (worker,)} == {worker}
        kinds = [e.type for e in envs if e.stream == goal_stream or e.stream.startswith("switch-")]
        assert "identity.switch_deferred" in kinds or any("deferred" in k for k in kinds), kinds
        assert any("provider_limit" in k or "fallback" in k for k in kinds), kinds

        # the owner hears about it exactly once
        await stack.until(
            "the notice to be delivered", lambda e: any("delivered" in x.type for x in e), within=30
        )

        async def shown() -> list[str]:
            return [
                m.text
                for m in await host.messages(owner.session_id)
                if m.role == "user" and "completed" in m.text
            ]

        await await_until("the notice in the owner's session", shown)
        await alet_time_pass(1.0, "a second delivery, were there one, lands in the owner's session")
        notices = await shown()
        assert len(notices) == 1, notices

        history = cli(stack.project, stack.env, "history", goal_id)
        assert history.returncode == 0, history.stderr
        for needle in ("goal.created", "goal.progress", "goal.completed"):
            assert needle in history.stdout
    finally:
        await host.aclose()


async def test_a_limit_seen_while_opencode_retries_falls_back_without_waiting_for_its_retries(
    stack: Stack,
) -> None:
    """``ra30`` answers 429 with Retry-After 30: OpenCode would retry for minutes before reporting the error.
    The engine sees the retry status, aborts, and the next turn goes to the fallback on the same session."""
    stack.fake.worker_script = [("text",), ("text",), ("text",)]
    stack.start_engine()
    create_with_fallback(stack, "early", "fake/ra30")
    envs = await stack.until(
        "a turn on the fallback",
        lambda e: any(r["model"] == "other" for r in stack.fake.requests),
        within=40,
    )
    # counted from the limited model's first request, not from start-up: OpenCode's first retry would come 30 s
    # after it, so a fallback before that did not wait for OpenCode's retries
    limited_at = min(r["at"] for r in stack.fake.requests if r["model"] == "ra30")
    fallback_at = min(r["at"] for r in stack.fake.requests if r["model"] == "other")
    elapsed = fallback_at - limited_at
    assert elapsed < 25, f"the fallback took {elapsed:.1f} s: it waited for OpenCode's own retries"
    observed = [data(e) for e in of_type(envs, "identity.provider_limit_observed")]
    assert observed and observed[0]["via"] == "retry-status" and observed[0]["kind"] == "rate-limit", observed
    sessions = {r["session"] for r in stack.fake.requests}
    assert len(sessions) == 1, "the fallback must run on the same OpenCode session"
    models = [r["model"] for r in stack.fake.requests]
    assert models[0] == "ra30" and "other" in models


async def test_a_429_in_anthropics_words_falls_back_within_five_seconds_and_is_not_a_failure(
    stack: Stack,
) -> None:
    """Issue #22: Anthropic's wording ("This request would exceed the rate limit for your organization ...") with
    no Retry-After: OpenCode would retry it for ~90 s. The engine falls back on the retry status within 5 s, and
    the turn is a fallback turn: no ``run.failed``, no failure count, and the next prompt carries no warning."""
    stack.fake.worker_script = [("text",), ("text",), ("text",)]
    stack.start_engine()
    create_with_fallback(stack, "worded", "fake/anthropic429")
    first = await stack.until(
        "the first request to the limited model",
        lambda e: any(r["model"] == "anthropic429" for r in stack.fake.requests),
        within=30,
    )
    assert first is not None
    limited_at = min(r["at"] for r in stack.fake.requests if r["model"] == "anthropic429")
    envs = await stack.until(
        "a turn on the fallback",
        lambda e: any(r["model"] == "other" for r in stack.fake.requests),
        within=30,
    )
    fallback_at = min(r["at"] for r in stack.fake.requests if r["model"] == "other")
    assert fallback_at - limited_at < 5, f"the fallback took {fallback_at - limited_at:.1f} s"
    observed = [data(e) for e in of_type(envs, "identity.provider_limit_observed")]
    assert observed and observed[0]["kind"] == "rate-limit" and observed[0]["via"] == "retry-status", observed
    prepared = [data(e) for e in of_type(envs, "identity.fallback_prepared")]
    assert prepared and prepared[0]["limit"] == "rate-limit", prepared
    assert of_type(envs, "run.fell_back") and not of_type(envs, "run.failed")
    fallback_prompt = next(r["last_user"] for r in stack.fake.requests if r["model"] == "other")
    assert "WARNINGS" not in fallback_prompt and "consecutive failure" not in fallback_prompt
    assert len({r["session"] for r in stack.fake.requests}) == 1, "the fallback must run on the same session"


async def test_killing_the_engine_mid_turn_sends_no_prompt_twice(stack: Stack) -> None:
    stack.fake.worker_script = [("slow", 6), ("text",), ("text",)]
    stack.start_engine()
    created = cli(
        stack.project,
        stack.env,
        "goal",
        "create",
        "sturdy",
        "--objective",
        "Keep going",
        "--model",
        "fake/good",
        "--max-turns",
        "3",
        "--check",
        "true",
    )
    assert created.returncode == 0, created.stderr
    await await_until(
        "the first (slow) turn to run", lambda: any(r["turn"] == 1 for r in stack.fake.requests)
    )
    assert stack.engine is not None
    stack.engine.send_signal(signal.SIGKILL)
    stack.engine.wait(timeout=10)
    stack.start_engine()  # takes over once the dead engine's lease (3 s) expires
    envs = await stack.until(
        "the goal to stop at its turn limit",
        lambda e: any(x.type in ("goal.blocked", "goal.budget_limited") for x in e),
        within=90,
    )
    prompts = [e for e in envs if e.type == "run.started"]
    ids = [data(e)["prompt_message_id"] for e in prompts]
    assert len(ids) == len(set(ids))
    worker = data(of_type(envs, "goal.worker_assigned")[0])["worker_session_id"]
    users = [r["turn"] for r in stack.fake.requests if r["session"] == worker]
    host = OpenCodeHost(stack.opencode.url)
    try:
        transcript = await host.messages(worker)
    finally:
        await host.aclose()
    user_ids = [m.message_id for m in transcript if m.role == "user"]
    assert len(user_ids) == len(set(user_ids)) == len(ids), (user_ids, ids)  # each prompt delivered once
    assert sorted(set(users)) == list(range(1, len(ids) + 1))


async def test_an_opencode_restart_is_noticed_once_and_the_goal_goes_on(stack: Stack) -> None:
    """OpenCode dies mid-goal: the engine counts the worker unreachable, tells the owner once, and when OpenCode
    is back (same data directory, same sessions) the goal goes on where it was."""
    stack.fake.worker_script = [("slow", 4), ("text",), ("text",), ("text",)]
    assert stack.engine is None
    stack.engine = subprocess.Popen(  # noqa: ASYNC220 - a long-running child, not waited for here
        [
            sys.executable,
            "-m",
            "loopd_es.cli",
            "run",
            "--confirm-idle-ms",
            "300",
            "--maintenance-ms",
            "500",
            "--idle-recover-ms",
            "3000",
        ],
        cwd=stack.project,
        env=stack.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    created = cli(
        stack.project,
        stack.env,
        "goal",
        "create",
        "phoenix",
        "--objective",
        "Survive",
        "--model",
        "fake/good",
        "--max-turns",
        "4",
        "--check",
        "true",
    )
    assert created.returncode == 0, created.stderr
    await await_until("the first turn to reach the model", lambda: bool(stack.fake.requests))
    stack.opencode.stop()  # SIGTERM to the whole process group, mid-turn
    await stack.until(
        "the unreachable notice",
        lambda e: any(x.type.startswith("notification.") and "unreachable" in json.dumps(data(x)) for x in e),
        within=60,
    )
    stack.opencode.start()  # same port, same HOME: the sessions are still there
    envs = await stack.until(
        "the goal to reach its turn limit",
        lambda e: any(x.type in ("goal.blocked", "goal.budget_limited") for x in e),
        within=120,
    )
    notices = [
        data(x) for x in envs if x.type.startswith("notification.") and "unreachable" in json.dumps(data(x))
    ]
    requested = [n for n in notices if n.get("kind") == "unreachable"]
    assert len(requested) == 1, notices
    assert len(of_type(envs, "run.started")) >= 2  # it went on after the restart


WAITING = "waiting for the store or host"


def engine_states(stack: Stack) -> list[str]:
    """What ``loopd-es engines`` says each engine of the project's log is doing."""
    out = cli(stack.project, stack.env, "engines", "--json")
    return [d["state"] for d in json.loads(out.stdout)["here"]] if out.returncode == 0 else []


async def test_an_opencode_that_hangs_is_said_once_shown_in_engines_and_the_goal_goes_on_after_it(
    stack: Stack,
) -> None:
    """``kill -STOP`` on OpenCode: the connections stay open and nothing comes back, not even the heartbeat the
    event stream carries every 10 s. The engine used to trust the stream's last word (busy) for as long as the
    hang lasted: nothing on stderr, "running" in ``engines``, the goal running past its turn deadline. Now the
    silent stream is an outage said once (stderr and ``engines``), the worker is polled, found unreachable and the
    owner told once, as for an OpenCode that died; after ``kill -CONT`` the engine says so once and the goal
    goes on."""
    stack.fake.worker_script = [("slow", 6), ("text",), ("text",)]
    stack.start_engine(300, "--maintenance-ms", "500")
    created = cli(
        stack.project,
        stack.env,
        *("goal", "create", "frozen", "--objective", "Wait it out", "--model", "fake/good"),
        *("--max-turns", "3", "--check", "true", "--timeout-ms", "3000"),
    )
    assert created.returncode == 0, created.stderr
    await await_until("the first (slow) turn to reach the model", lambda: bool(stack.fake.requests))
    assert stack.opencode.process is not None
    group = stack.opencode.process.pid
    os.killpg(group, signal.SIGSTOP)
    try:
        await await_until(
            "the engine to say it waits for the host",
            lambda: WAITING in stack.engine_log.read_text(),
            within=90,
        )
        await await_until("`engines` to say so", lambda: engine_states(stack) == [WAITING], within=30)
        await stack.until(
            "the unreachable notice (the turn's 3 s deadline long past)",
            lambda e: any(x.type == "notification.requested" and data(x)["kind"] == "unreachable" for x in e),
            within=120,
        )
    finally:
        os.killpg(group, signal.SIGCONT)
    await await_until(
        "the engine to say the host answers again",
        lambda: "answer again" in stack.engine_log.read_text(),
        within=90,
    )
    envs = await stack.until(
        "the goal to end",
        lambda e: any(x.type in ("goal.blocked", "goal.completed", "goal.budget_limited") for x in e),
        within=120,
    )
    said = stack.engine_log.read_text()
    assert said.count(WAITING) == 1 and said.count("answer again") == 1, said[-3000:]
    requested = [data(x) for x in of_type(envs, "notification.requested") if data(x)["kind"] == "unreachable"]
    assert len(requested) == 1, requested
    await await_until("`engines` to say it runs", lambda: engine_states(stack) == ["running"], within=30)


async def test_an_unreachable_opencode_is_said_once_not_on_every_retry_and_once_when_it_is_back(
    stack: Stack,
) -> None:
    """OpenCode not running when the engine starts: "event stream ... dropped; reconnecting" was printed every
    5 s without ``--verbose`` and ``engines`` said "running". It is said once (each retry only with
    ``--verbose``), ``engines`` says the engine waits, and its return is said once."""
    stack.opencode.stop()
    stack.start_engine()  # with --verbose: each retry is one line, so the test can count them
    await await_until(
        "three retries of the event stream",
        lambda: stack.engine_log.read_text().count("reconnecting in") >= 3,
        within=60,
    )
    await await_until("`engines` to say it waits", lambda: engine_states(stack) == [WAITING], within=30)
    assert stack.engine_log.read_text().count(WAITING) == 1
    stack.opencode.start()
    await await_until(
        "the engine to say the host answers again",
        lambda: "answer again" in stack.engine_log.read_text(),
        within=60,
    )
    await await_until("`engines` to say it runs", lambda: engine_states(stack) == ["running"], within=30)
    said = stack.engine_log.read_text()
    assert said.count(WAITING) == 1 and said.count("answer again") == 1, said[-3000:]
