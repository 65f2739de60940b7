"""``loopd-es engines``: which engines run on this log and what each is doing.

The coordination records say who holds the engine lease (or which members share the goals) and how many goals
each member holds; the status files of this machine's engines say what each process is doing right now, even
while the store is down ("waiting for the store or host since ..."; the command then exits 4 after showing them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..errors import EXIT_OK, EXIT_STORAGE, StorageError
from ..text_safe import term_line
from .main import store_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``engines`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "engines",
        help="the engines on this log: lease holder, shared members, what each is doing",
        description="Show who holds the engine lease (or which members share the goals, and how many goals "
        "each holds) from the log's coordination records, and what each engine process of this machine is "
        "doing now (running, standing by, waiting for the store or host), read from its status file.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=_engines)


async def _engines(args: argparse.Namespace) -> int:
    from ..engine.lease import KEY
    from ..engine.shares import CLAIM_PREFIX, MEMBER_PREFIX
    from ..engine.status import read_statuses
    from ..log import open_store

    url = store_url(args)
    statuses = read_statuses(url)
    unreachable = None
    try:
        async with await open_store(url, create=False) as store:
            records = await store.coord_read("engine/")
    except StorageError as e:  # what this machine's engines are doing is still worth showing
        records, unreachable = [], str(e)
    now_us = time.time_ns() // 1000
    lease = next((r for r in records if r.key == KEY), None)
    claims: dict[str, int] = {}
    for r in records:
        if r.key.startswith(CLAIM_PREFIX) and r.holder:
            claims[r.holder] = claims.get(r.holder, 0) + 1
    members = [
        {"member": r.key[len(MEMBER_PREFIX) :], "live": r.live(now_us), "expires_in_ms": (r.expires_us - now_us) // 1000,
         "goals": claims.get(r.key[len(MEMBER_PREFIX) :], 0)}
        for r in records if r.key.startswith(MEMBER_PREFIX)
    ]  # fmt: skip
    doc: dict[str, Any] = {
        "lease": None
        if lease is None or not lease.holder
        else {
            "holder": lease.holder,
            "token": lease.token,
            "live": lease.live(now_us),
            "expires_in_ms": (lease.expires_us - now_us) // 1000,
        },  # fmt: skip
        "members": members,
        "here": statuses,
        "store_error": unreachable,
    }
    code = EXIT_OK if unreachable is None else EXIT_STORAGE
    if args.json:
        print(json.dumps(doc, indent=2))
        return code
    out = sys.stdout
    if unreachable is not None:
        out.write(f"store: cannot be reached ({term_line(unreachable)})\n")
    elif doc["lease"] is None:
        out.write("lease: nobody holds it\n")
    else:
        held = doc["lease"]
        state = "live" if held["live"] else "ran out"
        out.write(
            f"lease: {term_line(held['holder'])} (token {held['token']}, {state}, {held['expires_in_ms']} ms)\n"
        )
    for m in members:
        out.write(
            f"member: {term_line(str(m['member']))}  {'live' if m['live'] else 'gone'}  {m['goals']} goal(s)\n"
        )
    for st in statuses:
        detail = f": {st['detail']}" if st.get("detail") else ""
        out.write(f"here: pid {st['pid']} {term_line(str(st['holder']))} {st['state']} since {st['since']}"
                  f"{term_line(detail)}\n")  # fmt: skip
    if not statuses:
        out.write("here: no engine runs on this machine for this log\n")
    return code
