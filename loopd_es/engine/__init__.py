"""The engine behind ``loopd-es run``: lease, clock, turn loop, maintenance, notification outbox, await wakes."""
