"""Shared fixtures: anyio on asyncio only (aiosqlite is asyncio-bound), and a fresh directory per test."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
