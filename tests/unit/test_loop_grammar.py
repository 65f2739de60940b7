"""The ``/loop`` grammar and its messages, verbatim (docs/reference/loop-plugin.md#s2; scenarios 2-10)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopd_es.domain.loop import texts
from loopd_es.domain.loop.grammar import Adaptive, Fail, Fixed, Maintenance, Sub, parse
from tests._profiles import scaled


def fixed(args: str) -> Fixed:
    p = parse(args)
    assert isinstance(p, Fixed), p
    return p


def adaptive(args: str) -> str:
    p = parse(args)
    assert isinstance(p, Adaptive), p
    return p.prompt


def fail(args: str, **kw: bool) -> str:
    p = parse(args, **kw)
    assert isinstance(p, Fail), p
    return p.message


def test_scenario_2_trailing_every() -> None:
    assert (fixed("check the deploy every 20m").interval_ms, fixed("check the deploy every 20m").prompt) == (
        1_200_000, "check the deploy",
    )  # fmt: skip
    assert fixed("check CI every 5 minutes").interval_ms == 300_000
    assert fixed("check CI every 5 minutes").prompt == "check CI"
    assert fixed("ping every 1.5h").interval_ms == 5_400_000
    assert (fixed("CHECK EVERY 10M").interval_ms, fixed("CHECK EVERY 10M").prompt) == (600_000, "CHECK")
    assert fixed("daily report every 1 day").interval_ms == 86_400_000
    lead = fixed("5m check the deploy every 2m")
    assert (lead.interval_ms, lead.prompt) == (300_000, "check the deploy every 2m")
    for text in ("check every PR", "review every merge request", "every 20m ago check", "check every 2m worth of logs",
                 "check CI every 5 mins", "check every 2 hrs"):  # fmt: skip
        assert adaptive(text) == text


def test_scenario_3_missing_prompt() -> None:
    msg = '❌ Missing prompt after interval "5m". Usage: /loop <interval> <prompt> — see `/loop help`.'
    assert fail("5m") == msg
    assert fail("5m --once") == msg
    assert fail("5m --") == msg
    assert fail("every 5m") == msg.replace('"5m"', '"every"')


@pytest.mark.parametrize("token", ["0s", "999x", "5", "5min", "1e3s", "0.5s"])
def test_scenario_4_invalid_interval(token: str) -> None:
    assert fail(f"{token} test") == (
        f'❌ Invalid interval "{token}". Use <number>s/m/h/d (min 1s), e.g. 30s, 5m, 2h, 1d — see `/loop help`.'
    )


def test_an_interval_too_large_for_a_float_is_invalid_not_a_crash() -> None:
    """``float("9" * 400)`` is infinite: the slash command used to raise OverflowError (exit 1, an event kept).
    The tools' rule, "a finite number >= 1000", holds for ``/loop`` too; a huge but finite interval stays valid."""
    huge = "9" * 400
    assert fail(f"{huge}s y").startswith(f'❌ Invalid interval "{huge}s".')
    assert fail("1" + "0" * 305 + "d y").startswith("❌ Invalid interval")  # finite, but not once in ms
    assert adaptive(f"x every {huge}s") == f"x every {huge}s"
    assert fixed("1" + "0" * 300 + "s y").interval_ms == int(
        1e300 * 1000
    )  # the float, as JavaScript holds it


def test_scenario_4_single_dash_is_text_and_half_minute_is_valid() -> None:
    assert adaptive("-5m check") == "-5m check"
    assert fixed("0.5m x").interval_ms == 30_000
    assert fixed("365d x").interval_ms == 365 * 86_400_000


def test_scenario_5_cron_refused() -> None:
    assert fail("*/5 * * * * check build") == (
        "❌ Cron expressions are not supported. Use an interval like `5m` instead, e.g. `/loop 5m check build`."
    )
    assert fail("0 9 * * 1-5").endswith("e.g. `/loop 5m check the build`.")
    assert fail("1 2 3 4 5 numbers").endswith("e.g. `/loop 5m numbers`.")


def test_scenario_6_unknown_flags() -> None:
    assert fail("--bogus do something") == '❌ Unknown flag "--bogus". Run `/loop help` to see usage.'
    assert fail("--all check the weather") == '❌ Unknown flag "--all". Run `/loop help` to see usage.'
    assert fixed("5m --all check deploy").prompt == "--all check deploy"
    assert adaptive("--ONCE x") == "--ONCE x"
    assert fixed("5m --Jitter=false x").prompt == "--Jitter=false x"


def test_scenario_7_flag_prefix() -> None:
    p = fixed("30s --once remind --once me")
    assert (p.once, p.prompt) == (True, "remind --once me")
    p = fixed("30s remind --once me")
    assert (p.once, p.prompt) == (False, "remind --once me")
    p = fixed("1m --once --once --jitter=true --jitter=false go")
    assert (p.once, p.jitter, p.prompt) == (True, False, "go")
    assert fixed("2m --jitter=true check version").jitter is True
    p = fixed("2m check deploy --jitter=false")
    assert (p.jitter, p.prompt) == (None, "check deploy --jitter=false")
    assert fixed("2m --jitter=maybe keep this text").prompt == "--jitter=maybe keep this text"


def test_scenario_8_terminator_and_fidelity() -> None:
    p = fixed("1m --once -- run tests --jitter=true --all")
    assert (p.once, p.jitter, p.prompt) == (True, None, "run tests --jitter=true --all")
    assert adaptive("-- check --once things") == "check --once things"
    assert fixed("1m line one\nline  two   spaced").prompt == "line one\nline  two   spaced"
    assert fixed('"5m check deploy"').prompt == "check deploy"
    assert fixed("'5m check deploy'").prompt == "check deploy"


def test_scenario_9_once_only_for_fixed() -> None:
    assert fail("--once check things") == (
        "❌ --once is only supported for fixed-interval tasks, e.g. `/loop 30s --once <prompt>`."
    )
    p = fixed("--once check every 30s")
    assert (p.interval_ms, p.prompt, p.once) == (30_000, "check", True)


def test_scenario_10_help_flags_and_session() -> None:
    for h in ("help", "--help", "-h", "HELP"):
        assert parse(h) == Sub(action="help")
    assert "--all" not in texts.HELP and texts.HELP.startswith("/loop — run prompts on a schedule")
    assert texts.HELP.rstrip().endswith("/loop cancel a1b2c3d4")
    assert parse("--list") == Sub(action="list")
    assert parse("--cancel abc") == Sub(action="cancel", task_id="abc")
    assert parse("--STOP") == Sub(action="stop-all")
    assert parse("stop abc") == Sub(action="cancel", task_id="abc")
    assert parse("cancel abc --all") == Sub(action="cancel", task_id="abc")
    assert parse("stop --all") == Sub(action="cancel", task_id="--all")
    assert fail("cancel") == "❌ Usage: /loop cancel <taskId>"
    assert fail("pause") == "❌ Usage: /loop pause <taskId>"
    assert fail("resume") == "❌ Usage: /loop resume <taskId>"
    assert fail("5m test", has_session=False) == "❌ /loop requires an active session context"
    assert parse("list", has_session=False) == Sub(action="list")
    assert parse("") == Maintenance()
    assert fail("--") == "❌ Empty loop command — see `/loop help`."


def test_display_interval() -> None:
    assert [texts.display_interval(ms) for ms in (90_000, 5_400_000, 129_600_000, 30_000, 300_000)] == [
        "2m", "2h", "2d", "30s", "5m",
    ]  # fmt: skip


def test_scenario_11_run_mode_interception() -> None:
    from loopd_es.domain.loop.grammar import intercept

    assert intercept([("/loop 5m", False)]) == "5m"
    assert intercept([('"/loop 5m"', False)]) == "5m"
    assert intercept([("'/loop 5m'", False)]) == "5m"
    assert intercept([("preface", False), ("/loop 5m", False)]) == "5m"
    assert intercept([("/proactive 1m ping via alias", False)]) == "1m ping via alias"
    assert intercept([("/loop 1m line one\nline two", False)]) == "1m line one\nline two"
    assert intercept([("/loop", False)]) == ""
    for text in ("please explain what /loop 5m does", "/loops are great", "/loopx not a command"):
        assert intercept([(text, False)]) is None
    assert intercept([("/loop 5m x", True)]) is None  # already consumed by the command hook


def test_intercept_uses_javascript_whitespace() -> None:
    from loopd_es.domain.loop.grammar import intercept

    assert intercept([("/loop\u00a05m x\u3000", False)]) == "5m x"
    assert intercept([("\ufeff/loop 5m x\ufeff", False)]) == "5m x"
    assert intercept([("/loop\u00855m x", False)]) is None
    assert intercept([("/loop\x1f5m x", False)]) is None


def test_javascript_classes() -> None:
    from loopd_es.domain.loop import jsclass

    assert jsclass.trim("\ufeff\u00a0\u2028 x \u3000\t") == "x"
    assert jsclass.trim("\x85x\x1f") == "\x85x\x1f"
    assert jsclass.split("a\u00a0b\x85c\u200bd\x1ce") == ["a", "b\x85c\u200bd\x1ce"]
    assert jsclass.split("") == []
    assert [jsclass.is_ascii_digit(c) for c in "5５٥"] == [True, False, False]
    assert jsclass.utf16_len("a🎉") == 3
    assert jsclass.utf16_head("ab🎉c", 3) == "ab" and jsclass.utf16_head("ab🎉c", 4) == "ab🎉"
    assert texts.cut("a" * 49 + "🎉b", 50) == "a" * 49 + "..."
    assert texts.cut("🎉" * 25, 50) == "🎉" * 25


def test_help_is_the_references_word_for_word() -> None:
    assert texts.HELP.splitlines()[3] == (
        "  /loop <prompt>                    Adaptive: runs now, the model picks the next check (fallback 1m–1h)"
    )
    assert "  /loop every two minutes check CI" in texts.HELP.splitlines()
    assert len(texts.HELP.splitlines()) == 31


_JS_WS = "\t\n\x0b\x0c\r \u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_TEXT = st.text(_JS_WS + "\x85\x1c\x1f\u200b" + "05.５٥smhdSMHDevryinutsEVERY-*,/x检é\"'", max_size=24)


@given(text=_TEXT, left=st.text(_JS_WS, max_size=3), right=st.text(_JS_WS, max_size=3))
@settings(max_examples=scaled(300))
@example(text="5m\x85check", left="", right="")
@example(text="检查every 5m", left="\ufeff", right="\ufeff")
def test_parse_follows_javascript_whitespace(text: str, left: str, right: str) -> None:
    """Surrounding JavaScript whitespace changes nothing; text without it is one token, so never a fixed task;
    every prompt is trimmed by JavaScript's rules and non-empty."""
    from loopd_es.domain.loop import jsclass

    p = parse(text)
    assert parse(left + text + right) == p
    if not any(ch in _JS_WS for ch in text) and text[:1] not in "\"'":
        assert not isinstance(p, Fixed)
    if isinstance(p, Fixed | Adaptive):
        assert p.prompt and jsclass.trim(p.prompt) == p.prompt
