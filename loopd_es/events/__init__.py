"""The vocabulary: every fact loopd-es records, as frozen msgspec Structs.

Schema-evolution rules (msgspec's, and ours; ``tests/unit/test_events_catalogue.py`` checks them):

1. A new field must have a default, so old events still decode.
2. A field never changes its type; add a new field and an upcaster instead. The one exception is a new
   version of the type (rule 4): text times became instants that way, and the frozen schema fixture
   records the version its field types belong to.
3. Type strings (``goal.created``) are stable and never derived from a class name.
4. A payload change that old events cannot satisfy bumps the type's schema version and registers an
   upcaster from the old version; stored events are never rewritten.
5. A time is a :data:`~loopd_es.events.times.UtcTime` (an aware UTC ``datetime``, RFC 3339 on the wire),
   never text.
"""

from __future__ import annotations

from .base import CATALOGUE as CATALOGUE
from .base import Event as Event
from .base import event as event
from .base import payload_decoder as payload_decoder
from .envelope import ANY as ANY
from .envelope import EXISTS as EXISTS
from .envelope import NO_STREAM as NO_STREAM
from .envelope import Envelope as Envelope
from .envelope import ExpectedVersion as ExpectedVersion
from .envelope import NewEvent as NewEvent
