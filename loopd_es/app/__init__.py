"""The application layer: load a goal by folding its stream, read facts from the host, decide, append.

:mod:`.service` is the one place that turns a command into recorded events (with expected versions, retries on
a concurrent append, and causation/correlation ids on every event); :mod:`.goals` is the use-case API the CLI
calls (create, switch identity, pause, idle turn, provider errors ...), which drives the sagas.

Nothing is imported here eagerly: the sagas import :mod:`.service`, and :mod:`.goals` imports the sagas.
"""
