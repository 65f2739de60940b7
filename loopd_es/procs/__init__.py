"""Command sessions: long-running processes in real PTYs, every lifecycle transition an event.

Only this package imports ptyprocess (in :mod:`.pty`). :mod:`.service` is the entry point for the CLI and
for other layers (start, reconcile, awaits, remove, requests to the owner); :mod:`.supervisor` is the
per-command owner process; :mod:`.watch`, :mod:`.text` and :mod:`.outlog` are its pure and file parts.
"""

from __future__ import annotations
