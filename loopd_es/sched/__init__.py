"""Scheduled loops: ``/loop`` tasks and goal schedules that fire exactly once per slot.

Pure parts (no I/O; deciders get outside facts as arguments): :mod:`.jitter`, :mod:`.grammar`,
:mod:`.texts`, :mod:`.model` (state folded from events), :mod:`.decide`, :mod:`.due` (the due-time index).
I/O parts: :mod:`.service` (commands: read a session stream, decide, append with its version),
:mod:`.runner` (``fire_due(now)``: claim, inject, close) and :mod:`.goals` (goal-schedule slots).
"""
