"""What ``loopd-es run`` says during an outage: once when it starts, once when it ends (issue #21, item 2).

On a full disk or a locked SQLite file reads go through while writes fail: a read must not end the outage a
failing lease renewal started, or the engine says "waiting" and "answer again" at every retry (what the
full-disk test in ``tests/integration/test_engine_outages.py`` saw before this rule).
"""

from __future__ import annotations

from loopd_es.engine.daemon import Outage
from loopd_es.errors import StorageError


def test_a_read_does_not_end_an_outage_a_failing_renewal_started() -> None:
    said: list[str] = []
    outage = Outage(said.append)
    for _ in range(5):  # a renewal fails, the serving loop's reads go through, again and again
        outage.failed(StorageError("disk I/O error"), lease=True)
        outage.ok()
    assert [line.split(":")[0] for line in said] == ["waiting for the store or host"]
    outage.ok(lease=True)  # a renewal goes through
    assert len(said) == 2 and said[1].startswith("the store and host answer again after")
    outage.ok()
    assert len(said) == 2


def test_standing_by_the_next_lease_call_ends_it() -> None:
    said: list[str] = []
    outage = Outage(said.append)
    outage.failed(StorageError("locked"), lease=True)
    outage.not_serving()  # the lease ran out: the standby's own lease call decides now
    outage.failed(StorageError("locked"))
    outage.ok()
    assert len(said) == 2 and "answer again" in said[1]


def test_backoff_grows_to_its_cap() -> None:
    outage = Outage(lambda line: None)
    delays = []
    for _ in range(8):
        outage.failed(OSError("no space left on device"))
        delays.append(outage.backoff())
    assert delays[0] == 0.25 and delays == sorted(delays) and delays[-1] == 5.0


def test_taking_the_lease_again_does_not_end_a_host_outage() -> None:
    """A host that stays away: each retry takes the lease again (the store answers) and fails on the host. That
    ended the outage at every retry ("answer again after 0.3 s"), so the backoff never grew past its first step
    and the engine retried three times a second; only serving (the host answering) ends it now."""
    from loopd_es.host.errors import HostError

    said: list[str] = []
    outage = Outage(said.append)
    delays = []
    for _ in range(6):
        outage.failed(HostError("simulated host state: cannot write"))
        delays.append(outage.backoff())
        outage.ok(store_only=True)  # the standby took the lease again
    assert [line.split(":")[0] for line in said] == ["waiting for the store or host"]
    assert delays == sorted(delays) and delays[-1] == 5.0
    outage.ok()  # the engine served: the host answered
    assert len(said) == 2 and "answer again" in said[1]
    outage.failed(StorageError("locked"))
    outage.ok(store_only=True)  # a store outage ends with the store's answer
    assert len(said) == 4 and "answer again" in said[3]
