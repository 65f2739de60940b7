"""The owner's exit notice: the reference's ``shouldNotifyOwnerOnExit`` table and its message
(docs/reference/loopd.md#s3-17)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain.command import CommandState
from loopd_es.domain.command_notice import (
    exit_notice_text,
    owner_exit_notice,
    should_notify_owner_on_exit,
    until_stop_told,
)
from loopd_es.events.command import WatchSpec

CID = "0123456789abcdef-0000-0000-0000-000000000000"


def ended(**kw: Any) -> CommandState:
    base = CommandState(
        id=CID,
        title="dev server",
        command="npm",
        args=("run", "dev"),
        cwd="/w",
        shell=False,
        env_keys=(),
        timeout_seconds=None,
        deadline_at=None,
        cols=80,
        rows=24,
        watch=None,
        goal_id=None,
        notify_on_exit=None,
        created_at=parse_rfc3339("2026-12-02T00:00:00.000000Z"),
        owner_session_id="ses_owner",
        status="exited",
        end_reason="exit",
        exit_code=0,
        ended_at=parse_rfc3339("2026-12-02T00:00:05.000000Z"),
    )
    return msgspec.structs.replace(base, **kw)


@pytest.mark.parametrize(
    ("fields", "notify"),
    [
        ({}, True),  # a quick exit 0: notifySuccessfulExit is set by every start
        ({"exit_code": 3}, True),
        ({"exit_code": None, "signal": "SIGINT"}, True),
        ({"status": "terminated", "end_reason": "terminate", "exit_code": 143}, False),  # the owner did it
        ({"status": "terminated", "end_reason": "timeout", "exit_code": 143}, True),
        ({"status": "missing", "end_reason": "missing", "exit_code": None}, True),
        ({"status": "missing", "end_reason": "timeout", "exit_code": None}, True),
        ({"status": "terminated", "end_reason": "until"}, False),
        ({"status": "terminated", "end_reason": "until", "notify_on_exit": True}, False),  # until outranks
        ({"notify_on_exit": False, "exit_code": 1}, False),
        ({"notify_on_exit": False, "status": "missing", "end_reason": "missing"}, False),
        ({"notify_on_exit": True, "status": "terminated", "end_reason": "terminate"}, True),
        ({"status": "running", "end_reason": None, "exit_code": None, "ended_at": None}, False),
    ],
)
def test_should_notify_owner_on_exit_table(fields: dict[str, Any], notify: bool) -> None:
    assert should_notify_owner_on_exit(ended(**fields)) is notify


def test_without_successful_exit_notices_only_a_long_run_is_told() -> None:
    quick = ended()
    long = ended(ended_at=parse_rfc3339("2026-12-02T00:02:00.000000Z"))  # exactly 120 s
    assert not should_notify_owner_on_exit(quick, notify_successful_exit=False)
    assert should_notify_owner_on_exit(long, notify_successful_exit=False)
    assert should_notify_owner_on_exit(ended(exit_code=2), notify_successful_exit=False)


def test_message_format() -> None:
    s = ended(exit_code=7, signal="SIGTERM")
    assert exit_notice_text(s, "line one\nlast line") == (
        '[command "dev server" (npm run dev) exited 01234567... exitCode=7 signal=SIGTERM]\nline one\nlast line'
    )
    missing = ended(status="missing", end_reason="missing", exit_code=None)
    assert exit_notice_text(missing, "").startswith(
        '[command "dev server" (npm run dev) missing 01234567... exitCode=unknown signal=none]\n'
    )


def test_no_owner_told_already_or_until_stop_means_no_notice() -> None:
    assert owner_exit_notice(ended(), "tail") is not None
    assert owner_exit_notice(ended(owner_session_id=None), "tail") is None  # started from the CLI
    assert (
        owner_exit_notice(ended(owner_notified_at="2026-12-02T00:00:06Z"), "tail") is None
    )  # imported, told
    stop = ended(watch=WatchSpec(until="READY"), watch_state="until-matched")
    assert until_stop_told(stop) and owner_exit_notice(stop, "tail") is None  # the until push was the message
    keep = ended(watch=WatchSpec(until="READY", until_action="keep"), watch_state="until-matched")
    assert not until_stop_told(keep) and owner_exit_notice(keep, "tail") is not None
