"""The pure core of scheduled loops: ``/loop`` tasks folded from ``loop.*`` events and the deciders on them.

:mod:`.model` (state and ``evolve``), :mod:`.decide` (create, manage, claim, close, sweep), :mod:`.jitter`
(the reference's jitter, random fallback and clamp), :mod:`.grammar` and :mod:`.texts` (the ``/loop`` command
and its words), :mod:`.due` (the due-time index). No I/O: the clock, the random draw and ``loop.md`` are
arguments. :mod:`loopd_es.sched` runs them against the log and the host.
"""
