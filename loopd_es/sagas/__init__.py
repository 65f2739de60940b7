"""Process managers: the identity-switch saga (with compensation), provider-limit fallback, crash recovery.

Each saga run keeps its progress on a stream of its own (``switch-<switch_id>``): intent before every host call,
outcome after it, a finish event once the goal stream has the result. :func:`.recovery.recover` closes every
saga a crashed process left open by reading the host's live session identity.
"""
