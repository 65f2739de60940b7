"""Where the PostgreSQL tests find their server, and a fresh schema per test.

The server comes from ``LOOPD_ES_TEST_POSTGRES`` (``.ci/run`` starts one with ``tools/pg_test_server.sh``).
Without it the tests skip locally with the reason, and fail under ``CI=true``: CI must test the real thing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.components import skip_or_fail

ENV: str = "LOOPD_ES_TEST_POSTGRES"


def server_url() -> str:
    """The test server's URL, or skip (fail under CI) with how to start one."""
    url = os.environ.get(ENV, "")
    if url:
        return url
    reason = (
        f'no PostgreSQL server for the tests: run eval "$(bash tools/pg_test_server.sh start)" to set {ENV}'
    )
    skip_or_fail(reason)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store URL on a schema of its own, dropped after the test."""
    import psycopg

    base = server_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield f"{base}?schema={schema}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
