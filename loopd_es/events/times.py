"""The one type of an instant in an event payload: an aware ``datetime``, written as RFC 3339 UTC text.

msgspec writes a ``datetime`` as RFC 3339 text (``2026-01-01T01:02:03.456000Z`` for UTC), so the log stays
readable JSON while payloads carry real instants that compare as instants, never as strings. ``tz=True`` makes
decoding reject a time without an offset: a naive time in a log is a malformed event, not a guess at a zone.
Writers pass UTC instants (``Clock.now()``); a stored offset other than UTC still decodes to the same instant.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, TypeAlias

import msgspec

UtcTime: TypeAlias = Annotated[datetime, msgspec.Meta(tz=True)]
"""An instant in an event payload (aware; writers give UTC)."""

__all__ = ["UtcTime"]
