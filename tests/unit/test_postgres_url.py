"""A PostgreSQL store URL as loopd-es reads and shows it: libpq gets the rest as written, messages no password."""

from __future__ import annotations

import pytest

from loopd_es.errors import UsageError
from loopd_es.log.postgres_url import public_url, split_postgres_url
from loopd_es.projector.paths import default_read_db


@pytest.mark.parametrize(
    ("url", "conninfo", "schema"),
    [
        # a space written %20 reached libpq as "+" (urlencode), which libpq does not decode
        ("postgresql://u@h:5/db?options=-c%20statement_timeout%3D1&schema=s1",
         "postgresql://u@h:5/db?options=-c%20statement_timeout%3D1", "s1"),
        # an empty host lost its "//" and libpq read the rest as one option
        ("postgresql:///db?host=127.0.0.1&port=5&schema=s1", "postgresql:///db?host=127.0.0.1&port=5", "s1"),
        ("postgresql://h/db", "postgresql://h/db", "public"),
        ("postgresql://h/db?schema=Team", "postgresql://h/db", "Team"),
    ],
)  # fmt: skip
def test_libpq_gets_the_url_as_written_less_the_schema(url: str, conninfo: str, schema: str) -> None:
    assert split_postgres_url(url) == (conninfo, schema)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://u@[::1/db", "invalid store URL"),  # was an internal error (ValueError)
        ("postgresql://h/db?schema=", "invalid schema ''"),  # was the public schema, silently
        ("postgresql://h/db?schema=a&schema=b", "names a schema 2 times"),  # was b, silently
        ("postgresql://h/db?schema=pg_catalog", "reserved by PostgreSQL"),  # was exit 4 from the server
        ("postgresql://h/db?schema=a;drop", "invalid schema"),
    ],
)
def test_a_url_that_cannot_name_a_log_is_a_usage_error(url: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        split_postgres_url(url)


def test_messages_never_show_a_password() -> None:
    """``?password=`` (libpq's own form) was shown in every message and in ``projections status``."""
    for url in ("postgresql://u:s3cr3t@h/db?schema=a", "postgresql://u@h/db?password=s3cr3t&schema=a",
                "postgresql://u@h/db?sslmode=disable&PASSWORD=s3cr3t", "postgresql://u@h/db?sslpassword=s3cr3t"):  # fmt: skip
        shown = public_url(url)
        assert "s3cr3t" not in shown and shown.startswith("postgresql://u@h/db"), shown


def test_two_databases_in_one_directory_keep_their_own_read_models() -> None:
    """The read database was named by the schema alone, so a second database's log was refused there."""
    a = default_read_db("postgresql://u:pw@127.0.0.1:5432/one?schema=loopd")
    assert a == default_read_db("postgresql://other@127.0.0.1:5432/one?schema=loopd")  # not by who connects
    assert a != default_read_db("postgresql://u@127.0.0.1:5432/two?schema=loopd")
    assert a.name.startswith("read-loopd-") and a.parent.name == ".loopd"
