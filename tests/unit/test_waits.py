"""tests/waits.py: the one way tests wait returns what it waited for, or says what and what it last saw."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.waits import (
    WaitTimeout,
    await_until,
    let_time_pass,
    scaled_timeout,
    timeout_scale,
    wait_for_output,
    wait_until,
)


def test_returns_the_first_value_that_holds() -> None:
    values = iter([0, 0, 3, 4])
    assert wait_until("a nonzero value", lambda: next(values)) == 3
    seen = iter([[1], [1, 2], [1, 2, 3]])
    assert wait_until("three items", lambda: next(seen), done=lambda v: len(v) == 3) == [1, 2, 3]


def test_a_timeout_says_what_was_awaited_and_the_last_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_ES_TEST_TIMEOUT_SCALE", "1")
    monkeypatch.delenv("CI", raising=False)
    counter = iter(range(1_000_000))
    with pytest.raises(
        WaitTimeout, match=r"waited 0\.1 s for the counter to pass a million; last seen: \d+"
    ) as e:
        wait_until(
            "the counter to pass a million", lambda: next(counter), done=lambda n: n > 10**6, within=0.1
        )
    assert isinstance(e.value.last, int) and e.value.what == "the counter to pass a million"


def test_ignored_errors_are_retried_and_reported_as_the_last_value() -> None:
    def absent() -> str:
        raise FileNotFoundError("no ready file yet")

    with pytest.raises(WaitTimeout, match="last seen: FileNotFoundError"):
        wait_until("the ready file", absent, within=0.05, ignoring=(FileNotFoundError,))
    with pytest.raises(ZeroDivisionError):  # an error not named is the test's failure, at once
        wait_until("a quotient", lambda: 1 / 0, within=30)


@pytest.mark.anyio
async def test_the_async_form_takes_plain_and_async_probes() -> None:
    calls: list[int] = []

    async def grows() -> int:
        calls.append(1)
        return len(calls)

    assert await await_until("three calls", grows, done=lambda n: n >= 3) == 3
    assert await await_until("a plain value", lambda: "ready") == "ready"
    with pytest.raises(WaitTimeout, match="last seen: None"):
        await await_until("nothing", lambda: None, within=0.05)


def test_timeouts_scale_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("LOOPD_ES_TEST_TIMEOUT_SCALE", "3")
    assert timeout_scale() == 3 and scaled_timeout(10) == 30
    monkeypatch.setenv("CI", "true")
    assert timeout_scale() == 3  # the same under CI: pytest's own timeout would cut a longer wait short
    monkeypatch.setenv("LOOPD_ES_TEST_TIMEOUT_SCALE", "fast")
    with pytest.raises(ValueError, match="LOOPD_ES_TEST_TIMEOUT_SCALE must be a number, not 'fast'"):
        timeout_scale()


def test_wait_for_output_sees_a_ready_line_and_a_dead_process(tmp_path: Path) -> None:
    out = tmp_path / "child.out"
    script = (
        "import sys, time\nprint('booting', flush=True)\nsys.stdin.readline()\nprint('ready', flush=True)\n"
    )
    with out.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=sink, text=True
        )
    try:
        wait_for_output(out, "booting", process=child)
        assert "ready" not in out.read_text()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert "ready" in wait_for_output(out, "ready", process=child)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(10)
    with pytest.raises(AssertionError, match=r"exited 0 before printing 'never'"):
        wait_for_output(out, "never", process=child)


def test_letting_time_pass_needs_a_reason() -> None:
    with pytest.raises(AssertionError, match="say why"):
        let_time_pass(0, "")
    let_time_pass(0, "nothing to wait for: the reason is what is checked")
