"""Whether we run under CI, and what that changes: a real component a test needs (Chromium, ...) that is missing on
a developer's machine skips the test, under CI it fails it.

CI installs everything (``.ci/run``) and sets ``CI=true``; a skip there would be a test silently not run.
:func:`under_ci` is the one place that reads ``CI`` (``tests/unit/test_ci.py`` keeps it so).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """True under CI (``CI`` set to true, 1 or yes, as CI services and ``.ci/run`` set it)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it under CI, where every test must run."""
    if under_ci():
        pytest.fail(f"{reason}: CI must run this test, not skip it", pytrace=False)
    pytest.skip(reason)


def require(found: object, what: str, install: str) -> None:
    """Skip (fail under CI) unless ``found``: ``what`` is missing, ``install`` says how to get it."""
    if not found:
        skip_or_fail(f"{what} is not installed ({install})")
