"""Replay: read a log and fold it, one stream, a goal with its linked streams, or everything, with snapshots.

This is the I/O half of folding (reading the store, snapshot files beside the log); the folds themselves are
pure and live in :mod:`loopd_es.domain.reducers` and :mod:`loopd_es.domain.evolve`.
"""

from __future__ import annotations

from .fold import replay_all as replay_all
from .fold import replay_goal as replay_goal
from .fold import replay_stream as replay_stream
from .snapshots import Snapshot as Snapshot
from .snapshots import SnapshotStore as SnapshotStore
