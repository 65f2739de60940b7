"""PostgreSQL's errors as the log's: one place turns a driver or pool error into exit 4 with its reason."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors
import psycopg_pool

from ..errors import CorruptLogError, LoopdError, StoreUnavailableError


class TranslatedConnection:
    """Wrap a pool connection context so driver errors become the log's errors (exit 4), once, here."""

    def __init__(self, inner: Any, url: str) -> None:
        self._inner = inner
        self._url = url

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await self._inner.__aenter__()  # type: ignore[no-any-return]
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            raise translate(e, self._url) from e

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        try:
            await self._inner.__aexit__(kind, error, tb)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            if error is None:
                raise translate(e, self._url) from e
        if isinstance(error, psycopg.Error):
            raise translate(error, self._url) from error
        return False


def translate(error: Exception, url: str) -> LoopdError:
    """A driver's or pool's error as the log's: corruption as :class:`CorruptLogError`, the rest unavailable."""
    if isinstance(error, psycopg.errors.DataCorrupted | psycopg.errors.IndexCorrupted):
        return CorruptLogError(url, None, f"PostgreSQL says: {error}")
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return StoreUnavailableError(
        f"PostgreSQL error on {url}: {text}; check that the server runs, the URL and permissions"
    )
