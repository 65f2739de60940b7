"""Hypothesis profiles: ``dev`` (default), ``ci`` (derandomized, loaded when ``CI=true``), ``thorough``.

``HYPOTHESIS_PROFILE=thorough python -m pytest --timeout 0 tests/unit -k properties`` runs every property test with
twenty times its usual number of examples (``--timeout 0``: a state machine's twenty-fold run outlasts the
per-test timeout, and a timeout mid-run makes hypothesis report a flaky replay, not a finding); run it before an issue that touches the domain is called resolved, and pin
what it finds as an ``@example`` (or, for a state machine, as a replayed sequence). Tests state their example
count through :func:`scaled`, so a profile scales it instead of being overridden by the decorator.
"""

from __future__ import annotations

import os
from typing import Final

from hypothesis import HealthCheck, settings

from tests.components import under_ci

BASE_EXAMPLES: Final = 100
"""The ``dev``/``ci`` count that :func:`scaled` treats as 1x."""

_COMMON: Final = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("dev", max_examples=BASE_EXAMPLES, **_COMMON)  # type: ignore[arg-type]
settings.register_profile(
    "ci",
    max_examples=BASE_EXAMPLES,
    derandomize=True,
    database=None,
    print_blob=True,
    **_COMMON,  # type: ignore[arg-type]
)
settings.register_profile("thorough", max_examples=20 * BASE_EXAMPLES, print_blob=True, **_COMMON)  # type: ignore[arg-type]


def profile_name() -> str:
    """``HYPOTHESIS_PROFILE`` if set, else ``ci`` under ``CI=true``, else ``dev``."""
    chosen = os.environ.get("HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if under_ci() else "dev"


def load() -> None:
    settings.load_profile(profile_name())


def scaled(n: int) -> int:
    """``n`` examples under ``dev``/``ci``, proportionally more under ``thorough``."""
    return max(1, n * int(settings().max_examples) // BASE_EXAMPLES)
