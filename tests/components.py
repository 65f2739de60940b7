"""Real components a test needs (Chromium, ...): missing on a developer's machine it skips, under CI it fails.

CI installs everything (``.ci/run``) and sets ``CI=true``; a skip there would be a test silently not run.
"""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(found: object, what: str, install: str) -> None:
    """Skip (fail under CI) unless ``found``: ``what`` is missing, ``install`` says how to get it."""
    if found:
        return
    message = f"{what} is not installed ({install})"
    if under_ci():
        pytest.fail(f"{message}: CI must run this test, not skip it", pytrace=False)
    pytest.skip(message)
