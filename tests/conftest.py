"""Shared fixtures: anyio on asyncio only (aiosqlite is asyncio-bound), and the hypothesis profiles."""

from __future__ import annotations

import pytest

from tests import _profiles

_profiles.load()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
