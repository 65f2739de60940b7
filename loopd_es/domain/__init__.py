"""The pure core: goal state, ``evolve`` (fold) and ``decide`` (rules); no I/O, no anyio, no log.

Reading a log and the snapshot files to fold it is :mod:`loopd_es.replay`'s job; the folds it feeds live here
(:mod:`.evolve`, :mod:`.reducers`).
"""

from __future__ import annotations

from .decide import decide as decide
from .evolve import evolve as evolve
from .evolve import fold as fold
from .evolve import initial as initial
from .state import REDUCER_VERSION as REDUCER_VERSION
from .state import GoalState as GoalState
