"""Docstrings and comments that name a file of this repository name one that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a repository path in double backticks, such as the name of this file
_PATH = re.compile(
    r"``((?:loopd_es|projections|tools|tests|docs)/[A-Za-z0-9_./-]+\.(?:py|md|json|ndjson|txt))``"
)


def test_every_named_repository_file_exists() -> None:
    stale = [
        f"{path.relative_to(ROOT)}:{n}: {name}"
        for top in ("loopd_es", "projections", "tools", "tests")
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for name in _PATH.findall(line)
        if not (ROOT / name).exists()
    ]
    assert not stale, "docstrings name files that do not exist:\n" + "\n".join(stale)
