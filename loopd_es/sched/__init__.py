"""Scheduled loops against the log and the host: ``/loop`` tasks and goal schedules, fired exactly once per slot.

The pure part (state, deciders, jitter, grammar, texts, the due-time index) is :mod:`loopd_es.domain.loop`.
Here: :mod:`.service` (commands: read a session stream, decide, append at the version read), :mod:`.runner`
(``Scheduler.fire_due(now)``: claim, inject, close), :mod:`.goals` (goal-schedule slots) and :mod:`.tools` (the
reference's ``loop_schedule`` / ``loop_status`` tools).
"""
