"""A test that needs a missing real component skips on a developer's machine and fails under CI."""

from __future__ import annotations

import pytest

from ..components import require


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_component_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed .* CI must run this test"):
        require(None, "chromium", "apt-get install chromium")


def test_a_missing_component_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        require(None, "chromium", "apt-get install chromium")
    require("/usr/bin/chromium", "chromium", "apt-get install chromium")  # present: nothing happens
