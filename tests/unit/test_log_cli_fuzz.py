"""Fuzz the log commands: whatever the arguments, bytes on stdin or store URL, the CLI answers cleanly.

Each example runs one command in-process against a fresh directory holding an SQLite log, an NDJSON log,
another application's SQLite database, a text file and an empty directory. The promise checked (#9 item 13):
a documented exit code, one line on stderr for an error, no traceback, and nothing changed unless an
``append`` or ``import`` succeeded.
"""

from __future__ import annotations

import io
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loopd_es.cli.main import main
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store
from tests._profiles import scaled

LOGS = ("sqlite:log.db", "ndjson:log.ndjson")
FOREIGN = ("other-app.db", "notes.txt")


def _setup(root: Path) -> None:
    async def seed() -> None:
        for url in LOGS:
            scheme, name = url.split(":")
            async with await open_store(f"{scheme}:{root / name}") as s:
                await s.append("goal-1", [NewEvent(type="goal.paused", data={"goal_id": "g1"})])
                await s.append("goal-2", [NewEvent(type="goal.paused", data={"goal_id": "g2"})])

    anyio.run(seed)
    con = sqlite3.connect(root / "other-app.db")
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    (root / "notes.txt").write_text("my notes\n")
    (root / "dir").mkdir()


def _snapshot(root: Path) -> dict[str, Any]:
    """What must not change: each log's events, and the foreign files' bytes."""

    async def events(url: str) -> list[Any]:
        async with await open_store(url, create=False) as s:
            return [e async for e in s.read_all()]

    state: dict[str, Any] = {name: (root / name).read_bytes() for name in FOREIGN}
    for url in LOGS:
        scheme, name = url.split(":")
        state[url] = anyio.run(events, f"{scheme}:{root / name}")
    state["files"] = sorted(p.name for p in root.iterdir() if not p.name.startswith("log."))
    return state


numbers = st.sampled_from(
    [
        "0",
        "1",
        "-1",
        "2",
        "99999999999999999999",
        "9223372036854775808",
        "\u00b2",
        "\u0664",
        "1e3",
        "0x10",
        " 3",
        "",
    ]
)
texts = st.text(
    st.characters(codec="utf-8") | st.sampled_from(["\udcff", "\n", "\x00", "{", '"']), max_size=12
)
json_ish = st.sampled_from(
    ['{"goal_id":"g"}', "{}", "[]", "{not json", '{"goal_id": 5}', "null", '{"a":"\udcff"}']
)
values = numbers | texts | json_ish | st.sampled_from(["no_stream", "exists", "any", "goal-1", "goal.paused"])
stores = (
    st.sampled_from(
        [
            *LOGS,
            "sqlite:other-app.db",
            "ndjson:other-app.db",
            "sqlite:notes.txt",
            "sqlite:dir",
            "ndjson:dir",
            "sqlite:missing.db",
            "ndjson:missing.ndjson",
            "postgres://127.0.0.1:9/y",
            "mysql://x/y",
            "sqlite:",
            "log.db?synchronous=SOMETIMES",
            "ndjson:log.ndjson?durability=maybe",
            "bogus:x",
        ]
    )
    | texts
)
FLAGS = {
    "append": [
        "--stream",
        "--type",
        "--data",
        "--expected-version",
        "--event-id",
        "--causation-id",
        "--correlation-id",
    ],
    "read": ["--stream", "--from", "--limit", "--type", "--last"],
    "streams": [],
    "verify": [],
    "export": ["--to"],
    "import": ["--from"],
}
SWITCHES = {"read": ["--json", "--backwards"], "verify": ["--repair"]}


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], bytes]:
    command = draw(st.sampled_from([*FLAGS, "frobnicate"]))
    args = ["--store", draw(stores), command]
    for flag in draw(st.lists(st.sampled_from(FLAGS.get(command) or ["--x"]), max_size=4)):
        value = (
            draw(stores) if flag in ("--to",) or (command == "import" and flag == "--from") else draw(values)
        )
        args += [flag, value]
    args += draw(st.lists(st.sampled_from(SWITCHES.get(command, ["--verbose"])), max_size=2, unique=True))
    if draw(st.booleans()):
        args.append(draw(texts))  # a stray positional
    stdin = draw(
        st.binary(max_size=64)
        | st.sampled_from([b'{"type":"goal.paused","data":{"goal_id":"g"}}\n', b"\xff\xfe{}\n", b"{}\n{}\n"])
    )
    return args, stdin


@pytest.mark.timeout(600)
@settings(
    max_examples=scaled(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=command_lines())
@example(
    case=(
        [
            "--store",
            "sqlite:log.db",
            "append",
            "--stream",
            "goal-1",
            "--type",
            "goal.paused",
            "--expected-version",
            "\u00b2",
        ],
        b"",
    )
)
@example(case=(["--store", "sqlite:log.db", "read", "--from", "99999999999999999999"], b""))
@example(
    case=(
        [
            "--store",
            "sqlite:log.db",
            "append",
            "--stream",
            "s",
            "--type",
            "goal.paused",
            "--data",
            '{"goal_id":"g"}',
            "--causation-id",
            "\udcff",
        ],
        b"",
    )
)
@example(case=(["--store", "sqlite:dir", "read"], b""))
@example(case=(["--store", "\x00", "import", "--from", "sqlite:log.db"], b""))
@example(case=(["--store", "sqlite:log.db", "streams", "--x", "\n"], b""))
@example(case=(["--store", "sqlite:log.db", "streams", "--x", "\udcff"], b""))
@example(case=(["--store", "sqlite:other-app.db", "verify"], b""))
@example(
    case=(
        [
            "--store",
            "sqlite:notes.txt",
            "append",
            "--stream",
            "s",
            "--type",
            "goal.paused",
            "--data",
            '{"goal_id":"g"}',
        ],
        b"",
    )
)
def test_any_command_line_answers_cleanly(
    case: tuple[list[str], bytes], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args, stdin = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _setup(root)
        before = _snapshot(root)
        monkeypatch.chdir(root)
        monkeypatch.delenv("LOOPD_ES_STORE", raising=False)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        capsys.readouterr()
        code = main(*args)
        err = capsys.readouterr().err
        assert code in (0, 2, 3, 4), (code, err)
        assert "Traceback" not in err
        if code:
            assert err.strip() and "\n" not in err.strip(), err
        after = _snapshot(root)
        if code == 0 and args[2] in ("append", "import", "export"):
            for name in FOREIGN:
                assert after[name] == before[name]
        else:
            assert after == before, (code, err)
