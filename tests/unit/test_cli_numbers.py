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
        ("loop", "--claim-ttl-ms", "-1", "tick"),
        ("loop", "--period-ms", "0", "run", "--duration", "1"),
        ("loop", "tick", "--ttl-ms", str(10**14)),
        ("loop", "run", "--duration", "nan"),
        ("run", "--lease-ms", "99999999999999999999"),
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
    assert "must be" in err and "internal error" not in err, err
    assert (tmp_path / "log.db").read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        (
            "append",
            "--stream",
            "s",
            "--type",
            "goal.nudged",
            "--data",
            '{"goal_id":"1"}',
            "--data",
            '{"goal_id":"2"}',
        ),
        ("read", "--limit", "1", "--limit", "2"),
        ("goal", "create", "g", "--objective", "o", "--model", "a/b", "--model", "c/d"),
        ("cmd", "start", "--timeout", "1", "--timeout", "2", "--", "true"),
    ],
)
def test_an_option_given_twice_is_refused_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """The last of two values silently won, and the first was lost; options that take several values
    (``--check``, ``--fallback-model``, ``--type``) are given once per value, as before."""
    url = f"sqlite:{tmp_path / 'log.db'}"
    assert main("--store", url, *args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "given twice; give it once" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "log.db").exists() or main("--store", url, "read", "--json") == 0
    assert capsys.readouterr().out == ""
