"""Numbers on the command line are bounded where they are read: a value past what a position, a count or a
date can hold is a usage error naming the option (exit 2), never an ``OverflowError`` (exit 1), and nothing is
written."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.errors import EXIT_USAGE

TOO_BIG = str(1 << 63)


@pytest.mark.parametrize(
    "args",
    [
        ("replay", "--stream", "goal-7", "--until", TOO_BIG),
        ("history", "7", "--until", TOO_BIG),
        ("read", "--limit", TOO_BIG),
        ("loop", "--session", "s", "--now", "99999999999999999999", "add", "5m", "x"),
        ("loop", "--session", "s", "--now", "253402300800000", "list"),  # past the year 9999
        ("loop", "--session", "s", "--now", "-1", "list"),  # before 1970
    ],
)
def test_a_number_out_of_range_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    assert (
        main(
            "--store",
            url,
            "append",
            "--stream",
            "goal-7",
            "--type",
            "goal.nudged",
            "--data",
            '{"goal_id":"7"}',
        )
        == 0
    )
    before = (tmp_path / "log.db").read_bytes()
    capsys.readouterr()
    assert main("--store", url, *args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "must be between" in err and "internal error" not in err, err
    assert (tmp_path / "log.db").read_bytes() == before
