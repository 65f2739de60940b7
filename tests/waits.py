"""The one way tests wait: poll a readiness signal until it holds, or fail saying what was awaited and last seen.

A test waits on something the code exposes (a ready line, an event in the log, a socket that accepts, a status file),
never on elapsed time: elapsed time is a guess about the machine's speed, and a loaded machine proves it wrong.
:func:`wait_until` / :func:`await_until` poll with a growing interval (cheap when the answer is quick, light on a
loaded machine when it is slow), and every deadline goes through :func:`scaled_timeout`, the one place that stretches
timeouts (``LOOPD_ES_TEST_TIMEOUT_SCALE``; raise pytest's ``--timeout`` with it). A deadline only bounds a failure,
so a generous one costs nothing when the test passes.

The only sleeps a test may call are :func:`let_time_pass` / :func:`alet_time_pass`, for when the code under test must
see time go by (a lease must expire, nothing may happen twice within a span); each names why.
``tests/unit/test_ci.py`` checks that no other test code sleeps, polls by itself or decides CI by itself.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar, cast, overload

import anyio

T = TypeVar("T")

FIRST_INTERVAL: Final = 0.005
"""The first pause between probes: a condition that holds almost at once is seen almost at once."""
LAST_INTERVAL: Final = 0.2
"""The longest pause between probes: the interval doubles up to this, so a slow wait costs little CPU."""


class WaitTimeout(AssertionError):
    """Raised when a waited-for condition did not hold within its (scaled) time; says what and the last value."""

    def __init__(self, what: str, within: float, last: object) -> None:
        super().__init__(f"waited {within:.1f} s for {what}; last seen: {_shown(last)}")
        self.what = what
        self.last = last


def timeout_scale() -> float:
    """How much every test deadline is stretched: ``LOOPD_ES_TEST_TIMEOUT_SCALE`` (default 1).

    Not stretched under CI by itself: the defaults already sit well inside pytest's per-test timeout (60 s), and a
    wait killed by that timeout would lose its message (what it waited for, what it saw).
    """
    raw = os.environ.get("LOOPD_ES_TEST_TIMEOUT_SCALE", "1")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"LOOPD_ES_TEST_TIMEOUT_SCALE must be a number, not {raw!r}") from None


def scaled_timeout(seconds: float) -> float:
    """``seconds`` as a deadline on this machine (see :func:`timeout_scale`); use it for every fixed timeout."""
    return seconds * timeout_scale()


def _shown(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"...{text[-limit:]}"


def _held(value: object, done: Callable[[T], bool] | None) -> bool:
    return bool(value) if done is None else done(cast(T, value))


def wait_until(
    what: str,
    probe: Callable[[], T],
    *,
    done: Callable[[T], bool] | None = None,
    within: float = 30.0,
    ignoring: tuple[type[BaseException], ...] = (),
    max_interval: float = LAST_INTERVAL,
) -> T:
    """Call ``probe`` until its value is truthy (or ``done(value)``); return that value.

    :param what: what is awaited, in words; the failure message starts with it.
    :param within: seconds before :class:`WaitTimeout`, stretched by :func:`scaled_timeout`.
    :param ignoring: exceptions a probe may raise while the thing is not there yet (a file not yet written); the
        last one is reported as the last value seen.
    :param max_interval: the longest pause between probes; lower it only where a late look changes the test
        (processes that must start together).
    :raises WaitTimeout: the condition did not hold in time.
    """
    limit = scaled_timeout(within)
    deadline = time.monotonic() + limit
    interval = min(FIRST_INTERVAL, max_interval)
    while True:
        try:
            value: object = probe()
        except ignoring as e:
            value = e
        else:
            if _held(value, done):
                return cast(T, value)
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(what, limit, value)
        time.sleep(min(interval, deadline - now))
        interval = min(interval * 2, max_interval)


@overload
async def await_until(
    what: str,
    probe: Callable[[], Awaitable[T]],
    *,
    done: Callable[[T], bool] | None = None,
    within: float = 30.0,
    ignoring: tuple[type[BaseException], ...] = (),
    max_interval: float = LAST_INTERVAL,
) -> T: ...


@overload
async def await_until(
    what: str,
    probe: Callable[[], T],
    *,
    done: Callable[[T], bool] | None = None,
    within: float = 30.0,
    ignoring: tuple[type[BaseException], ...] = (),
    max_interval: float = LAST_INTERVAL,
) -> T: ...


async def await_until(
    what: str,
    probe: Callable[[], object],
    *,
    done: Callable[[T], bool] | None = None,
    within: float = 30.0,
    ignoring: tuple[type[BaseException], ...] = (),
    max_interval: float = LAST_INTERVAL,
) -> T:
    """The async form of :func:`wait_until`: ``probe`` may be a plain or an async function."""
    limit = scaled_timeout(within)
    deadline = time.monotonic() + limit
    interval = min(FIRST_INTERVAL, max_interval)
    while True:
        try:
            got = probe()
            value: object = await got if inspect.isawaitable(got) else got
        except ignoring as e:
            value = e
        else:
            if _held(value, done):
                return cast(T, value)
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(what, limit, value)
        await anyio.sleep(min(interval, deadline - now))
        interval = min(interval * 2, max_interval)


def wait_for_output(
    path: Path, text: str, *, process: subprocess.Popen[Any] | None = None, within: float = 30.0
) -> str:
    """Wait until the file a process writes its output to contains ``text`` (its ready line); return the output.

    With ``process``, fail at once, with the output, if it exits first: a dead process prints nothing more.
    """

    def probe() -> str:
        out = path.read_text(errors="replace") if path.exists() else ""
        if process is not None and text not in out and process.poll() is not None:
            raise AssertionError(f"exited {process.returncode} before printing {text!r}: {out[-3000:]}")
        return out

    return wait_until(f"{text!r} in {path.name}", probe, done=lambda out: text in out, within=within)


def let_time_pass(seconds: float, why: str) -> None:
    """Let ``seconds`` go by on purpose, because the code under test must see time pass (``why`` says what for).

    Not a way to wait for something to happen: for that, :func:`wait_until` the signal that says it happened.
    """
    assert why, "say why time must pass"
    time.sleep(seconds)


async def alet_time_pass(seconds: float, why: str) -> None:
    """The async form of :func:`let_time_pass`."""
    assert why, "say why time must pass"
    await anyio.sleep(seconds)
