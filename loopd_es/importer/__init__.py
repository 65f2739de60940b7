"""Import an ``opencode-loopd`` project (``.opencode/loopd/state.json`` + ``events.ndjson``) into the log.

``build_plan(DIR)`` reads and maps everything in memory; ``apply_plan(store, plan)`` appends it.
``mirror_pass(store, DIR)`` appends only what the log does not hold yet (the first time: exactly
``apply_plan``), and ``follow`` repeats it on every change to the project (:mod:`.mirror`). How each
piece maps is in the module docstrings: :mod:`.source` (formats, version upgrade), :mod:`.goals`,
:mod:`.commands`, :mod:`.plan` (ids, idempotency, atomicity), :mod:`.fields` (what is kept or reported
with its reason), :mod:`loopd_es.events.imported` (marking).
"""

from __future__ import annotations

from .mirror import MirrorCache as MirrorCache
from .mirror import MirrorPass as MirrorPass
from .mirror import follow as follow
from .mirror import mirror_pass as mirror_pass
from .plan import ImportConflictError as ImportConflictError
from .plan import ImportIncompleteError as ImportIncompleteError
from .plan import ImportPlan as ImportPlan
from .plan import ImportResult as ImportResult
from .plan import apply_plan as apply_plan
from .plan import build_plan as build_plan
from .plan import survey_plan as survey_plan
from .source import ImportSourceError as ImportSourceError

__all__ = (
    "ImportConflictError",
    "ImportIncompleteError",
    "ImportPlan",
    "ImportResult",
    "ImportSourceError",
    "MirrorCache",
    "MirrorPass",
    "apply_plan",
    "build_plan",
    "follow",
    "mirror_pass",
    "survey_plan",
)
