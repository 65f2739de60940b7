"""``cmd start`` refuses an option given empty instead of dropping it: ``--watch-until ''`` started a command
with no watch, and ``--title ''`` one titled by its command line, while ``cmd await --until ''`` and a title of
spaces were refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.errors import EXIT_USAGE


@pytest.mark.parametrize("flag", ["--title", "--watch-filter", "--watch-until"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_option_is_refused_and_nothing_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    assert main("--store", url, "cmd", "start", flag, value, "--", "true") == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{flag} must not be empty" in err, err
    assert not (tmp_path / "log.db").exists()
