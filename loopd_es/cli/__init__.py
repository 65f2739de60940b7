"""The ``loopd-es`` command line: one module per command group, each exposing ``register(subparsers)``."""
