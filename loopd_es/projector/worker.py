"""The worker process of a parallel rebuild (:mod:`.parallel`): ``python -c "...worker import main; main()"``.

Reads the pickled request (the parent's ``sys.path``, the log URL, the projections, the read db path) on
stdin, rebuilds those projections there, and writes the pickled (checkpoints, events applied) on stdout.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import anyio

from .runner import rebuild_part


def main() -> None:
    stream = sys.stdin.buffer
    sys.path[:] = pickle.load(stream)  # first, so the projections' modules import as in the parent
    request: Any = pickle.load(stream)
    url, projections, path = request
    result = anyio.run(rebuild_part, url, projections, Path(path))
    sys.stdout.buffer.write(pickle.dumps(result))
