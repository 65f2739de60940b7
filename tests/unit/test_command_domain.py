"""The command reducer and deciders: end reasons, exactly-once awaits, the reference's messages."""

from __future__ import annotations

import shlex
import subprocess
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd_es.clock import parse_rfc3339
from loopd_es.domain.command import (
    CommandNotFoundError,
    CommandState,
    CommandStateError,
    OutputFacts,
    compile_read_pattern,
    compile_watch_regex,
    decide_await,
    decide_cancel_goal_awaits,
    decide_exit,
    decide_missing,
    decide_remove,
    decide_signal,
    decide_until_fired,
    decide_until_stop,
    decide_watch,
    evolve,
    fold,
    is_dangerous_regex,
    validate_start,
)
from loopd_es.errors import UsageError
from loopd_es.events.catalogue import decode_data
from loopd_es.events.command import (
    COMMAND_EVENT_TYPES,
    AwaitFired,
    AwaitRequested,
    CommandExited,
    CommandStarted,
    SignalReason,
    SignalSent,
    WatchSpec,
)

from .._profiles import scaled

if TYPE_CHECKING:
    from loopd_es.events.base import Event

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
FACTS = OutputFacts(output_bytes=3, stream_bytes=3, tail="bye")


def started(**kw: object) -> CommandState:
    fields: dict[str, object] = {
        "command_id": "c0ffee00-1111",
        "title": "dev",
        "command": "npm",
        "args": ["run"],
        "cwd": "/tmp",
        "started_at": NOW,
    }
    fields.update(kw)
    s = evolve(None, CommandStarted(**fields))  # type: ignore[arg-type]
    assert s is not None
    return s


def apply(s: CommandState, events: list[Event]) -> CommandState:
    out = fold(events, s)
    assert out is not None
    return out


def test_natural_exit_is_exited_exit() -> None:
    [ev] = decide_exit(started(), exit_code=0, signal=None, now=NOW, output=FACTS)
    assert isinstance(ev, CommandExited)
    assert (ev.status, ev.end_reason, ev.exit_code) == ("exited", "exit", 0)


def test_terminate_claim_defaults_143_and_kill_137() -> None:
    s = apply(started(), decide_signal(started(), "SIGTERM", "terminate"))
    ev = decide_exit(s, exit_code=None, signal="SIGTERM", now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited)
    assert (ev.status, ev.end_reason, ev.exit_code, ev.signal) == ("terminated", "terminate", 143, "SIGTERM")
    s = apply(started(), decide_signal(started(), "SIGKILL", "kill"))
    ev = decide_exit(s, exit_code=None, signal="SIGKILL", now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited)
    assert (ev.end_reason, ev.exit_code, ev.signal) == ("terminate", 137, "SIGKILL")


def test_interrupt_is_no_termination_claim() -> None:
    s = apply(started(), decide_signal(started(), "SIGINT", "interrupt"))
    ev = decide_exit(s, exit_code=None, signal="SIGINT", now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited)
    assert (ev.status, ev.end_reason, ev.signal) == ("exited", "exit", "SIGINT")


@pytest.mark.parametrize("first", ["timeout", "until"])
def test_timeout_and_until_are_never_overwritten(first: str) -> None:
    s = started(watch=WatchSpec(until="READY"), timeout_seconds=5)
    claim = decide_until_stop(s) if first == "until" else decide_signal(s, "SIGTERM", "timeout")
    s = apply(s, claim)
    s = apply(s, decide_signal(s, "SIGTERM", "terminate"))  # a later user terminate
    s = apply(s, decide_signal(s, "SIGKILL", "kill"))
    ev = decide_exit(s, exit_code=None, signal="SIGKILL", now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited) and ev.end_reason == first and ev.status == "terminated"
    assert ev.last_error is not None
    assert ("timed out" if first == "timeout" else 'Watch until pattern "READY" matched') in ev.last_error


def test_second_exit_decides_nothing_and_a_stray_one_changes_nothing() -> None:
    s = apply(started(), decide_exit(started(), exit_code=0, signal=None, now=NOW, output=FACTS))
    assert decide_exit(s, exit_code=1, signal=None, now=NOW, output=FACTS) == []
    stray = CommandExited(command_id=s.id, status="terminated", end_reason="terminate", ended_at=NOW)
    assert apply(s, [stray]).status == "exited"


def test_exit_fires_every_await_once_with_a_bounded_tail() -> None:
    s = apply(
        started(),
        [
            AwaitRequested(goal_id="g1", command_id="c"),
            AwaitRequested(goal_id="g2", command_id="c", until="READY"),
        ],
    )
    facts = OutputFacts(tail="x" * 4096)
    events = decide_exit(s, exit_code=7, signal=None, now=NOW, output=facts)
    fired = [e for e in events if isinstance(e, AwaitFired)]
    assert [f.goal_id for f in fired] == ["g1", "g2"]
    assert "exitCode=7" in fired[0].evidence and "signal=none" in fired[0].evidence
    s = apply(s, events)
    assert s.awaits == () and decide_exit(s, exit_code=7, signal=None, now=NOW, output=facts) == []


def test_missing_and_missing_past_deadline() -> None:
    s = started()
    ev = decide_missing(s, now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited) and (ev.status, ev.end_reason) == ("missing", "missing")
    assert ev.last_error is not None and "no live execution" in ev.last_error
    s = started(timeout_seconds=1, deadline_at=NOW - timedelta(hours=1))
    ev = decide_missing(s, now=NOW, output=FACTS)[0]
    assert isinstance(ev, CommandExited) and (ev.status, ev.end_reason) == ("missing", "missing")
    assert ev.last_error is not None and "timeout elapsed" in ev.last_error


def test_remove_refused_while_running_with_the_reference_message() -> None:
    with pytest.raises(
        CommandStateError,
        match=r'^Command "dev" is still running — terminate it first \(terminate ≠ remove\)\.$',
    ):
        decide_remove(started())
    s = apply(started(), [AwaitRequested(goal_id="g1", command_id="c")])
    s = apply(s, decide_exit(s, exit_code=0, signal=None, now=NOW, output=FACTS))
    s2 = apply(started(), [AwaitRequested(goal_id="g1", command_id="c")])
    s2 = apply(s2, decide_signal(s2, "SIGTERM", "terminate"))
    events = decide_remove(apply(s, []))
    assert [e.event_type for e in events] == ["command.removed"]
    with pytest.raises(CommandNotFoundError):
        decide_remove(apply(s, events))


def test_await_cases() -> None:
    s = started()
    events, msg = decide_await(s, goal_id="g", until=None, ignore_case=False, output=FACTS)
    assert msg == 'Goal "g" now awaits "dev" (fires once on exit).'
    s2 = apply(s, events)
    assert decide_await(s2, goal_id="g", until=None, ignore_case=False, output=FACTS) == (
        [],
        'Already awaiting "dev" for goal "g".',
    )
    events, msg = decide_await(
        s, goal_id="g", until="READY", ignore_case=False, output=FACTS, matched=["READY 1"]
    )
    assert msg.startswith('Pattern "READY" already present') and isinstance(events[0], AwaitFired)
    done = apply(s, decide_exit(s, exit_code=0, signal=None, now=NOW, output=FACTS))
    events, msg = decide_await(done, goal_id="g", until=None, ignore_case=False, output=FACTS)
    assert msg == 'Command "dev" already exited; wake-up delivered to goal "g".'
    assert isinstance(events[0], AwaitFired) and events[0].immediate
    _, msg = decide_await(done, goal_id="g", until=None, ignore_case=False, output=FACTS, raced=True)
    assert "exited while registering" in msg
    with pytest.raises(UsageError, match="non-empty regex"):
        decide_await(s, goal_id="g", until="", ignore_case=False, output=FACTS)
    with pytest.raises(UsageError, match="dangerous"):
        decide_await(s, goal_id="g", until="(a+)+", ignore_case=False, output=FACTS)


def test_until_await_fires_once_and_cancel() -> None:
    s = apply(started(), [AwaitRequested(goal_id="g", command_id="c", until="READY")])
    fired = decide_until_fired(s, "g", ["READY player one"], "tail")
    assert len(fired) == 1 and isinstance(fired[0], AwaitFired) and "READY player one" in fired[0].evidence
    assert decide_until_fired(apply(s, fired), "g", ["READY again"], "tail") == []
    cancelled = decide_cancel_goal_awaits(s, "g", "goal paused")
    assert apply(s, cancelled).awaits == () and decide_cancel_goal_awaits(s, "other", "goal paused") == []


def test_validation_messages() -> None:
    with pytest.raises(UsageError, match="^title is required$"):
        validate_start(" ", "x", None, None)
    with pytest.raises(UsageError, match="^command is required$"):
        validate_start("t", "", None, None)
    for bad in (0, -5, 1.5, float("nan"), True):
        with pytest.raises(UsageError, match="^timeoutSeconds must be a positive integer in seconds$"):
            validate_start("t", "x", bad, None)
    with pytest.raises(UsageError, match="Invalid watch filter regex '\\(unclosed'"):
        validate_start("t", "x", None, WatchSpec(filter="(unclosed"))
    with pytest.raises(UsageError, match="dangerous watch until"):
        validate_start("t", "x", None, WatchSpec(until="(a+)+"))
    with pytest.raises(UsageError, match="untilAction"):
        validate_start("t", "x", None, WatchSpec(until="x", until_action="bogus"))  # type: ignore[arg-type]
    with pytest.raises(CommandStateError, match="watch is meaningless after exit"):
        s = started()
        decide_watch(
            apply(s, decide_exit(s, exit_code=0, signal=None, now=NOW, output=FACTS)), WatchSpec(filter="x")
        )


@pytest.mark.parametrize("source", ["(a+)+", "(.*.*)", r"(\w+\s*)+"])
def test_dangerous_regexes_rejected(source: str) -> None:
    assert is_dangerous_regex(source)
    with pytest.raises(
        UsageError,
        match=r"^Potentially dangerous regex pattern rejected: '.*'\. Please use a safer pattern\.$",
    ):
        compile_read_pattern(source)


def test_safe_and_invalid_regexes() -> None:
    assert not is_dangerous_regex("(foo|bar)+")
    compile_watch_regex("filter", "(foo|bar)+")
    with pytest.raises(UsageError, match=r"^Invalid regex pattern '\(':"):
        compile_read_pattern("(")


def test_a_shell_command_gets_its_words_back_exactly() -> None:
    """The supervisor's ``/bin/sh -c`` script is ``shlex.join``: the shell hands every word over unchanged."""
    words = ["hi there", "a|b", "it's", "$HOME", "*", "", "tab\there"]
    script = shlex.join(["printf", "[%s]", *words])
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == "".join(f"[{w}]" for w in words)


def test_deadline_and_signal_events() -> None:
    s = started(timeout_seconds=2, deadline_at=NOW + timedelta(seconds=2))
    assert decide_signal(s, "SIGINT", "interrupt") == [
        SignalSent(command_id=s.id, signal="SIGINT", reason="interrupt")
    ]
    done = apply(s, decide_exit(s, exit_code=0, signal=None, now=NOW, output=FACTS))
    with pytest.raises(CommandStateError, match="^Command is exited; nothing to interrupt.$"):
        decide_signal(done, "SIGINT", "interrupt")


@given(st.lists(st.sampled_from(["int", "term", "kill", "exit", "await", "timeout"]), max_size=12))
@settings(max_examples=scaled(100))
def test_exactly_one_terminal_event_whatever_the_order(ops: list[str]) -> None:
    s = started(watch=WatchSpec(until="R"))
    terminal = 0
    for op in ops:
        if op == "await":
            events, _ = decide_await(
                s, goal_id=f"g{len(s.awaits)}", until=None, ignore_case=False, output=FACTS
            )
        elif op == "exit":
            events = decide_exit(s, exit_code=0, signal=None, now=NOW, output=FACTS)
        elif not s.running:
            continue
        else:
            sig, reason = {
                "int": ("SIGINT", "interrupt"),
                "term": ("SIGTERM", "terminate"),
                "kill": ("SIGKILL", "kill"),
                "timeout": ("SIGTERM", "timeout"),
            }[op]
            events = decide_signal(s, sig, reason)  # type: ignore[arg-type]
        terminal += sum(isinstance(e, CommandExited) for e in events)
        s = apply(s, events)
    assert terminal == (0 if s.running else 1)
    if "timeout" in ops and not s.running and ops.index("timeout") < ops.index("exit"):
        assert s.end_reason == "timeout"


def test_every_event_round_trips() -> None:
    for cls in COMMAND_EVENT_TYPES:
        assert cls.event_type.startswith("command.")
    ev = CommandStarted(
        command_id="c",
        title="t",
        command="x",
        cwd="/",
        env_keys=["SECRET_TOKEN"],
        watch=WatchSpec(filter="E"),
        started_at=NOW,
    )
    assert decode_data(ev.event_type, msgspec.json.encode(ev), 1) == ev


@pytest.mark.parametrize("claim", ["timeout", "until"])
def test_the_fold_keeps_a_timeout_or_until_claim_as_the_end_reason(claim: SignalReason) -> None:
    """#10.6: an exit recorded without seeing the claim (another writer, an import) does not overwrite it."""
    s = apply(
        started(timeout_seconds=2), [SignalSent(command_id="c0ffee00-1111", signal="SIGTERM", reason=claim)]
    )
    assert s.claim == claim and s.end_reason is None  # nothing ended yet: end_reason is empty while running
    plain = CommandExited(
        command_id=s.id,
        status="terminated",
        end_reason="terminate",
        exit_code=143,
        signal="SIGTERM",
        ended_at=parse_rfc3339("2026-12-02T12:00:03.000000Z"),
    )
    done = apply(s, [plain])
    assert done.status == "terminated" and done.end_reason == claim


def test_a_later_kill_claim_does_not_replace_a_timeout_claim() -> None:
    s = apply(
        started(timeout_seconds=2),
        [
            SignalSent(command_id="c0ffee00-1111", signal="SIGTERM", reason="timeout"),
            SignalSent(command_id="c0ffee00-1111", signal="SIGKILL", reason="kill"),
        ],
    )
    assert s.claim == "timeout" and s.signal == "SIGKILL"
    [exited, *_] = decide_exit(s, exit_code=None, signal="SIGKILL", now=NOW, output=FACTS)
    assert isinstance(exited, CommandExited) and exited.end_reason == "timeout"
    assert apply(s, [exited]).end_reason == "timeout"


def test_the_command_domain_is_split_by_job() -> None:
    """#17.3: state/fold, checks and decisions are separate modules, each well under 600 lines."""
    from pathlib import Path

    import loopd_es.domain.command as decisions
    import loopd_es.domain.command_checks as checks
    import loopd_es.domain.command_state as state

    for module in (decisions, checks, state):
        assert len(Path(module.__file__ or "").read_text().splitlines()) < 600
    assert decisions.evolve is state.evolve and decisions.validate_start is checks.validate_start
