"""The pure core: goal state, ``evolve`` (fold) and ``decide`` (rules); no I/O, no anyio, no log.

:mod:`~loopd_es.domain.replay` is the one module here that reads a store, through its protocol only.
"""

from __future__ import annotations

from .decide import decide as decide
from .evolve import evolve as evolve
from .evolve import fold as fold
from .evolve import initial as initial
from .state import REDUCER_VERSION as REDUCER_VERSION
from .state import GoalState as GoalState
