"""The concrete read models, one module each, and the registry the projector loads (``ALL``).

This package depends on ``loopd_es``, never the reverse: ``loopd-es project`` finds it by name
(:func:`loopd_es.projector.load_registry`). To add a read model, write a module with a class that has
``name``, ``version``, ``schema``, ``apply`` and ``reset`` (see :class:`loopd_es.projector.Projection`) and
add an instance to ``ALL``.

The query commands (``loopd-es goals``, ``goal show``, ``commands``, ``identities``) read the tables of
``goals``, ``runs``, ``identities``, ``provider_limits``, ``commands`` and ``awaits``; ``history`` and
``explain`` find a goal's streams through ``goal_links``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .awaits import Awaits
from .commands import Commands
from .goal_links import GoalLinks
from .goals import Goals
from .identities import Identities
from .provider_limits import ProviderLimits
from .runs import Runs
from .stream_stats import StreamStats

if TYPE_CHECKING:
    from loopd_es.projector import Projection

ALL: list[Projection] = [
    StreamStats(),
    Goals(),
    Runs(),
    Identities(),
    ProviderLimits(),
    Commands(),
    Awaits(),
    GoalLinks(),
]

__all__ = ("ALL", "Awaits", "Commands", "GoalLinks", "Goals", "Identities", "ProviderLimits", "Runs", "StreamStats")
