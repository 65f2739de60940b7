"""`loopd-es append | read | streams | verify | export | import`, run in-process through ``main(*argv)``.

Payloads use real catalogue types (``goal.paused``, ``goal.retried``, ``goal.progress``), because ``append``
validates against the catalogue. The log is inspected through the store API, not through the CLI under test.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.events.envelope import ENVELOPE_ENCODER, Envelope, NewEvent
from loopd_es.log import open_store

KEYS = [
    "position",
    "stream",
    "version",
    "event_id",
    "type",
    "schema_version",
    "recorded_at",
    "causation_id",
    "correlation_id",
    "data",
]
RFC3339_MICROS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out!r}, err={self.err!r})"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``cli(*args, stdin=None) -> Result``; cwd is ``tmp_path`` and ``$LOOPD_ES_STORE`` is unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPD_ES_STORE", raising=False)

    def run(*args: str, stdin: str | None = None) -> Result:
        assert args, "main() with no arguments would read sys.argv"
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"))
        capsys.readouterr()
        code = main(*args)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(params=["ndjson", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        f"ndjson:{tmp_path / 'log.ndjson'}" if request.param == "ndjson" else f"sqlite:{tmp_path / 'log.db'}"
    )


def contents(url: str) -> list[Envelope]:
    async def go() -> list[Envelope]:
        async with await open_store(url) as s:
            return [e async for e in s.read_all()]

    return anyio.run(go)


def seed(url: str, stream: str, *events: NewEvent) -> list[Envelope]:
    async def go() -> list[Envelope]:
        async with await open_store(url) as s:
            return await s.append(stream, list(events))

    return anyio.run(go)


def paused(goal: str = "g1", **kw: Any) -> NewEvent:
    return NewEvent(type="goal.paused", data={"goal_id": goal}, **kw)


def as_json(env: Envelope) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(ENVELOPE_ENCODER.encode(env))
    return value


def assert_one_line_error(r: Result, code: int) -> None:
    assert r.code == code, r
    assert r.out == "", r
    assert r.err.strip() and "\n" not in r.err.strip(), r
    assert "Traceback" not in r.err


# -- append ---------------------------------------------------------------------------------------


def test_append_prints_the_recorded_envelope(cli: Any, url: str) -> None:
    r = cli(
        "--store", url, "append", "--stream", "goal-1", "--type", "goal.paused", "--data", '{"goal_id":"g1"}'
    )
    assert r.code == 0, r
    assert len(r.out.splitlines()) == 1
    line = json.loads(r.out)
    assert list(line) == KEYS
    assert line["position"] == 1 and line["stream"] == "goal-1" and line["version"] == 1
    assert line["type"] == "goal.paused" and line["schema_version"] == 1
    assert line["data"]["goal_id"] == "g1"
    assert RFC3339_MICROS.match(line["recorded_at"])
    assert line["causation_id"] is None and line["correlation_id"] is None
    uuid.UUID(line["event_id"])
    assert [as_json(e) for e in contents(url)] == [line]


def test_append_with_ids_and_expected_version_and_retry(cli: Any, url: str) -> None:
    eid, cause, corr = (str(uuid.uuid4()) for _ in range(3))
    args = (
        "--store",
        url,
        "append",
        "--stream",
        "goal-1",
        "--type",
        "goal.retried",
        "--data",
        '{"goal_id":"g1"}',
        "--expected-version",
        "no_stream",
        "--event-id",
        eid,
        "--causation-id",
        cause,
        "--correlation-id",
        corr,
    )
    first = cli(*args)
    assert first.code == 0, first
    line = json.loads(first.out)
    assert (line["event_id"], line["causation_id"], line["correlation_id"]) == (eid, cause, corr)
    again = cli(*args)  # an exact retry: same envelope back, nothing new, although the stream now exists
    assert again.code == 0, again
    assert json.loads(again.out) == line
    assert len(contents(url)) == 1
    nxt = cli(
        "--store",
        url,
        "append",
        "--stream",
        "goal-1",
        "--type",
        "goal.retried",
        "--data",
        '{"goal_id":"g1"}',
        "--expected-version",
        "1",
    )
    assert nxt.code == 0, nxt
    assert json.loads(nxt.out)["version"] == 2


def test_append_from_a_data_file(cli: Any, url: str, tmp_path: Path) -> None:
    (tmp_path / "payload.json").write_text('{"goal_id": "g9", "summary": "half way", "next": "tests"}\n')
    r = cli(
        "--store",
        url,
        "append",
        "--stream",
        "goal-9",
        "--type",
        "goal.progress",
        "--data-file",
        str(tmp_path / "payload.json"),
    )
    assert r.code == 0, r
    data = json.loads(r.out)["data"]
    assert (data["goal_id"], data["summary"], data["next"]) == ("g9", "half way", "tests")
    assert contents(url)[0].data_dict()["summary"] == "half way"


def test_batch_append_from_stdin_is_atomic(cli: Any, url: str) -> None:
    eid = str(uuid.uuid4())
    batch = "\n".join(
        [
            json.dumps({"type": "goal.paused", "data": {"goal_id": "g1"}}),
            json.dumps({"type": "goal.resumed", "data": {"goal_id": "g1"}, "event_id": eid}),
            json.dumps({"type": "goal.retried", "data": {"goal_id": "g1"}}),
        ]
    )
    r = cli("--store", url, "append", "--stream", "goal-1", stdin=batch + "\n")
    assert r.code == 0, r
    lines = r.lines()
    assert [(x["position"], x["version"], x["type"]) for x in lines] == [
        (1, 1, "goal.paused"),
        (2, 2, "goal.resumed"),
        (3, 3, "goal.retried"),
    ]
    assert lines[1]["event_id"] == eid
    assert all(list(x) == KEYS for x in lines)
    assert [as_json(e) for e in contents(url)] == lines

    before = contents(url)
    fresh = "\n".join(json.dumps({"type": "goal.paused", "data": {"goal_id": f"g{i}"}}) for i in range(3))
    for stdin, code in (
        (fresh + "\n" + '{"type": "goal.paused", "data": ', 2),  # invalid JSON on the last line
        (fresh + "\n" + json.dumps({"type": "goal.paused", "data": {"goal_id": 5}}), 2),  # invalid payload
        (fresh + "\n" + json.dumps({"type": "no.such_type", "data": {}}), 2),  # unknown type
        (fresh + "\n" + json.dumps({"data": {"goal_id": "g"}}), 2),  # no type
        (batch, 3),  # recorded ids mixed with new ones
    ):
        r = cli("--store", url, "append", "--stream", "goal-1", stdin=stdin)
        assert_one_line_error(r, code)
        assert contents(url) == before
    r = cli("--store", url, "append", "--stream", "goal-1", "--expected-version", "1", stdin=fresh)
    assert_one_line_error(r, 3)
    assert contents(url) == before


# -- read -----------------------------------------------------------------------------------------


def _seed_two_streams(url: str) -> list[Envelope]:
    for i in range(3):
        seed(url, "goal-a", paused("a", causation_id=str(uuid.uuid4())))
        seed(url, "goal-b", NewEvent(type="goal.retried", data={"goal_id": f"b{i}"}))
    return contents(url)


def test_read_json_prints_exact_envelopes(cli: Any, url: str) -> None:
    envs = _seed_two_streams(url)
    r = cli("--store", url, "read", "--json")
    assert r.code == 0, r
    assert r.lines() == [as_json(e) for e in envs]
    assert all(list(x) == KEYS for x in r.lines())

    def positions(*args: str) -> list[int]:
        res = cli("--store", url, "read", "--json", *args)
        assert res.code == 0, res
        return [x["position"] for x in res.lines()]

    assert positions("--from", "3") == [3, 4, 5, 6]
    assert positions("--limit", "2") == [1, 2]
    assert positions("--from", "2", "--limit", "3") == [2, 3, 4]
    assert positions("--from", "7") == []
    assert positions("--stream", "goal-b") == [2, 4, 6]
    assert positions("--stream", "goal-b", "--limit", "1") == [2]
    assert positions("--stream", "goal-a", "--from", "2") == [3, 5]  # --from is a version within a stream


def test_read_without_json_is_a_table(cli: Any, url: str) -> None:
    envs = _seed_two_streams(url)
    r = cli("--store", url, "read")
    assert r.code == 0, r
    lines = [line for line in r.out.splitlines() if line.strip()]
    assert len(lines) >= len(envs)
    for line in lines:
        with pytest.raises(ValueError):
            json.loads(line)
    for e in envs:
        assert any(e.stream in line and e.type in line for line in lines), e
    r = cli("--store", url, "read", "--stream", "goal-a")
    assert "goal-b" not in r.out and "goal-a" in r.out


def test_read_of_a_missing_stream_is_a_usage_error(cli: Any, url: str) -> None:
    _seed_two_streams(url)
    assert_one_line_error(cli("--store", url, "read", "--stream", "goal-z"), 2)


def test_streams_lists_every_stream_sorted(cli: Any, url: str) -> None:
    for name in ("zulu", "alpha", "mike"):
        seed(url, name, paused())
    r = cli("--store", url, "streams")
    assert r.code == 0, r
    where = [r.out.index(name) for name in ("alpha", "mike", "zulu")]
    assert where == sorted(where)


# -- verify ---------------------------------------------------------------------------------------


def test_verify_clean_log(cli: Any, url: str) -> None:
    _seed_two_streams(url)
    for args in (("verify",), ("verify", "--repair")):
        r = cli("--store", url, *args)
        assert r.code == 0, r
        assert (r.out + r.err).strip(), "verify prints a summary"
    assert len(contents(url)) == 6


def test_verify_reports_a_corrupt_ndjson_line(cli: Any, tmp_path: Path) -> None:
    url = f"ndjson:{tmp_path / 'log.ndjson'}"
    _seed_two_streams(url)
    path = tmp_path / "log.ndjson"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"position": 3, "this is not json\n'
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    for args in (("verify",), ("verify", "--repair")):
        r = cli("--store", url, *args)
        assert r.code == 4, r
        assert "3" in r.out + r.err
    assert path.read_bytes() == before
    assert_one_line_error(cli("--store", url, "read", "--json"), 4)
    r = cli(
        "--store", url, "append", "--stream", "goal-a", "--type", "goal.paused", "--data", '{"goal_id":"a"}'
    )
    if r.code == 0:  # a writer may append after the bad line, but never cut or skip it
        assert path.read_bytes().startswith(before)
        assert_one_line_error(cli("--store", url, "read", "--json"), 4)
    else:
        assert_one_line_error(r, 4)
        assert path.read_bytes() == before


# -- export / import ------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["ndjson->sqlite", "sqlite->ndjson"])
@pytest.mark.parametrize("verb", ["export", "import"])
def test_copy_between_backends(cli: Any, tmp_path: Path, direction: str, verb: str) -> None:
    nd, sq = f"ndjson:{tmp_path / 'log.ndjson'}", f"sqlite:{tmp_path / 'log.db'}"
    src, dst = (nd, sq) if direction == "ndjson->sqlite" else (sq, nd)
    envs = _seed_two_streams(src)
    seed(
        src,
        "goal-c",
        NewEvent(
            type="goal.progress", data={"goal_id": "c", "summary": "ü ✓"}, correlation_id=str(uuid.uuid4())
        ),
    )
    envs = contents(src)
    r = (
        cli("--store", src, "export", "--to", dst)
        if verb == "export"
        else cli("--store", dst, "import", "--from", src)
    )
    assert r.code == 0, r
    copied = contents(dst)
    assert [as_json(e) for e in copied] == [as_json(e) for e in envs]
    assert contents(src) == envs

    # the target is no longer empty: a second copy is refused and changes nothing
    r = (
        cli("--store", src, "export", "--to", dst)
        if verb == "export"
        else cli("--store", dst, "import", "--from", src)
    )
    assert_one_line_error(r, 2)
    assert contents(dst) == copied
    assert contents(src) == envs

    # and the copy is a working log: appends continue its positions and versions
    more = seed(dst, "goal-a", paused("a"))
    assert (more[0].position, more[0].version) == (len(envs) + 1, 4)


# -- store selection ------------------------------------------------------------------------------


def test_store_flag_beats_environment_beats_default(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = ("append", "--stream", "s", "--type", "goal.paused", "--data", '{"goal_id":"g"}')
    assert cli(*append).code == 0
    default = f"sqlite:{tmp_path / '.loopd' / 'events.db'}"
    assert (tmp_path / ".loopd" / "events.db").exists()
    assert len(contents(default)) == 1

    env_url = f"ndjson:{tmp_path / 'env.ndjson'}"
    monkeypatch.setenv("LOOPD_ES_STORE", env_url)
    assert cli(*append).code == 0
    assert len(contents(env_url)) == 1
    assert len(contents(default)) == 1

    flag_url = f"ndjson:{tmp_path / 'flag.ndjson'}"
    assert cli("--store", flag_url, *append).code == 0
    assert len(contents(flag_url)) == 1
    assert len(contents(env_url)) == 1
    r = cli("--store", flag_url, "read", "--json")
    assert len(r.lines()) == 1


# -- errors ---------------------------------------------------------------------------------------


APPEND_G1 = ("append", "--stream", "goal-1", "--type", "goal.paused", "--data", '{"goal_id":"g"}')


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("append", "--stream", "goal-1", "--type", "goal.paused", "--data", "{not json"), 2),
        (("append", "--stream", "goal-1", "--type", "goal.paused", "--data", "[1, 2]"), 2),
        (("append", "--stream", "goal-1", "--type", "goal.paused", "--data", '{"goal_id": 5}'), 2),
        (("append", "--stream", "goal-1", "--type", "no.such_type", "--data", "{}"), 2),
        ((*APPEND_G1, "--colour"), 2),
        (("append", "--type", "goal.paused", "--data", '{"goal_id":"g"}'), 2),
        ((*APPEND_G1, "--expected-version", "sometimes"), 2),
        ((*APPEND_G1, "--expected-version", "-1"), 2),
        ((*APPEND_G1[:5], "--data-file", "/nonexistent/payload.json"), 2),
        (("read", "--from", "zero"), 2),
        (("read", "--stream", "goal-404"), 2),
        (("frobnicate",), 2),
        ((*APPEND_G1, "--expected-version", "no_stream"), 3),
        ((*APPEND_G1, "--expected-version", "0"), 3),
        ((*APPEND_G1, "--expected-version", "5"), 3),
        (("append", "--stream", "goal-2", *APPEND_G1[3:], "--expected-version", "exists"), 3),
    ],
)
def test_errors_are_one_line_with_their_exit_code_and_change_nothing(
    cli: Any, url: str, args: tuple[str, ...], code: int
) -> None:
    seed(url, "goal-1", paused())
    before = contents(url)
    r = cli("--store", url, *args)
    assert_one_line_error(r, code)
    assert contents(url) == before


def test_reused_event_id_with_other_content_is_a_conflict(cli: Any, url: str) -> None:
    eid = str(uuid.uuid4())
    seed(url, "goal-1", paused(event_id=eid))
    before = contents(url)
    r = cli(
        "--store",
        url,
        "append",
        "--stream",
        "goal-1",
        "--type",
        "goal.paused",
        "--data",
        '{"goal_id":"other"}',
        "--event-id",
        eid,
    )
    assert_one_line_error(r, 3)
    assert contents(url) == before


def test_conflict_message_names_stream_expected_and_actual(cli: Any, url: str) -> None:
    seed(url, "goal-1", paused(), paused())
    r = cli(
        "--store",
        url,
        "append",
        "--stream",
        "goal-1",
        "--type",
        "goal.paused",
        "--data",
        '{"goal_id":"g"}',
        "--expected-version",
        "1",
    )
    assert_one_line_error(r, 3)
    assert "goal-1" in r.err and "1" in r.err and "2" in r.err


@pytest.mark.parametrize("scheme", ["ndjson", "sqlite"])
def test_unwritable_store_is_a_storage_error(cli: Any, tmp_path: Path, scheme: str) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    target = tmp_path / "a-file" / ("log.ndjson" if scheme == "ndjson" else "log.db")
    r = cli(
        "--store",
        f"{scheme}:{target}",
        "append",
        "--stream",
        "s",
        "--type",
        "goal.paused",
        "--data",
        '{"goal_id":"g"}',
    )
    assert_one_line_error(r, 4)
    assert (tmp_path / "a-file").read_text() == "not a directory"


def test_unknown_store_scheme_is_a_usage_error(cli: Any) -> None:
    assert_one_line_error(cli("--store", "mysql://nowhere/db", "read"), 2)


def test_an_unreachable_postgres_server_is_a_storage_error(cli: Any) -> None:
    r = cli("--store", "postgres://nowhere.invalid/db", "read")
    assert_one_line_error(r, 4)
    assert "cannot connect" in r.err


def test_read_notes_a_torn_tail_it_skips(cli: Any, tmp_path: Path) -> None:
    url = f"ndjson:{tmp_path / 'torn.ndjson'}"
    seed(url, "s", paused())
    size = (tmp_path / "torn.ndjson").stat().st_size
    with (tmp_path / "torn.ndjson").open("ab") as f:
        f.write(b'{"position":2,"stre')
    r = cli("--store", url, "read", "--json")
    assert r.code == 0 and len(r.lines()) == 1
    assert f"incomplete write (19 bytes at byte offset {size})" in r.err and "verify --repair" in r.err
    assert (tmp_path / "torn.ndjson").stat().st_size == size + 19, "reading repairs nothing"


# -- clean errors for odd input (#9 item 13) --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ((*APPEND_G1, "--expected-version", "\u00b2"), 2),
        ((*APPEND_G1, "--expected-version", "99999999999999999999"), 2),
        (("read", "--from", "99999999999999999999"), 2),
        (("read", "--stream", "goal-1", "--from", "99999999999999999999"), 2),
        (("read", "--limit", "\u0664"), 2),
        (("append", "--stream", "goal-1", "--type", "goal.paused", "--data", '{"goal_id": "\udcff"}'), 2),
        ((*APPEND_G1, "--causation-id", "\udcff"), 2),
        (("read", "--stream", "goal-\udcff"), 2),
        (("read", "--last", "2", "--from", "1"), 2),
    ],
)
def test_odd_arguments_are_usage_errors(cli: Any, url: str, args: tuple[str, ...], code: int) -> None:
    seed(url, "goal-1", paused())
    before = contents(url)
    assert_one_line_error(cli("--store", url, *args), code)
    assert contents(url) == before


def test_read_from_zero_says_what_it_accepts(cli: Any, url: str) -> None:
    seed(url, "goal-1", paused())
    r = cli("--store", url, "read", "--from", "0")
    assert_one_line_error(r, 2)
    assert "between 1 and" in r.err and ">= 0" not in r.err


def test_a_directory_as_sqlite_store_is_one_storage_error(tmp_path: Path) -> None:
    """In a real process: no traceback from a background thread after the error line."""
    r = subprocess.run(
        [sys.executable, "-m", "loopd_es.cli", "--store", f"sqlite:{tmp_path}", "read"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 4, r
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_a_repair_is_reported_once(tmp_path: Path) -> None:
    url = f"ndjson:{tmp_path / 'torn.ndjson'}"
    seed(url, "s", paused())
    with (tmp_path / "torn.ndjson").open("ab") as f:
        f.write(b'{"position":2,"stre')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopd_es.cli",
            "--store",
            url,
            *APPEND_G1[:1],
            "--stream",
            "s",
            *APPEND_G1[3:],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r
    assert r.stderr.count("repaired") == 1 and r.stderr.count("\n") == 1, r.stderr


# -- read filters, backwards, last N (#9 item 15) -------------------------------------------------------


def test_read_by_type_backwards_and_last(cli: Any, url: str) -> None:
    recorded = []
    for k in range(6):
        recorded += seed(
            url,
            f"goal-{k % 2}",
            paused(f"g{k}") if k % 3 else NewEvent(type="goal.resumed", data={"goal_id": f"g{k}"}),
        )

    def positions(*args: str) -> list[int]:
        r = cli("--store", url, "read", "--json", *args)
        assert r.code == 0, r
        return [line["position"] for line in r.lines()]

    assert positions("--type", "goal.resumed") == [1, 4]
    assert positions("--type", "goal.resumed", "--type", "goal.paused", "--limit", "3") == [1, 2, 3]
    assert positions("--backwards") == [6, 5, 4, 3, 2, 1]
    assert positions("--backwards", "--from", "4", "--limit", "2") == [4, 3]
    assert positions("--last", "2") == [5, 6]
    assert positions("--last", "2", "--backwards") == [6, 5]
    assert positions("--stream", "goal-0", "--last", "2") == [3, 5]
    assert positions("--stream", "goal-1", "--backwards", "--type", "goal.paused") == [6, 2]
    assert positions("--stream", "goal-0", "--type", "goal.resumed") == [1]
    assert positions("--last", "0") == []


def test_verify_exits_4_on_a_silent_sqlite_edit(cli: Any, tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:{tmp_path / 'log.db'}"
    seed(url, "goal-1", paused("g1"), paused("g2"))
    con = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
    con.execute("""UPDATE events SET data = '{"goal_id":"g9"}' WHERE position = 1""")
    con.close()
    r = cli("--store", url, "verify")
    assert r.code == 4 and "checksum mismatch" in r.out, r


def test_the_help_overview_matches_the_command_modules_without_importing_them() -> None:
    """`loopd-es --help` lists every command with the help its module registers, from a table in main."""
    import argparse

    from loopd_es.cli.main import COMMAND_HELP, COMMAND_MODULES, build_parser

    assert COMMAND_HELP.keys() == COMMAND_MODULES.keys(), "add the new command's one-liner to COMMAND_HELP"
    registered: dict[str, str] = {}
    for name in set(COMMAND_MODULES.values()):
        for action in build_parser(next(c for c, m in COMMAND_MODULES.items() if m == name))._actions:
            if isinstance(action, argparse._SubParsersAction):
                registered.update(
                    {
                        a.dest: str(a.help)
                        for a in action._choices_actions
                        if COMMAND_MODULES.get(a.dest) == name
                    }
                )
    assert registered == COMMAND_HELP
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "loopd_es.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert all(name in r.stdout for name in COMMAND_HELP)
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert not {f"loopd_es.cli.{m}" for m in COMMAND_MODULES.values()} & imported


@pytest.mark.parametrize("command", [("read",), ("verify",), ("streams",), APPEND_G1])
def test_another_applications_database_is_refused_untouched(
    cli: Any, tmp_path: Path, command: tuple[str, ...]
) -> None:
    import sqlite3

    path = tmp_path / "other-app.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    before = path.read_bytes()
    r = cli("--store", f"sqlite:{path}", *command)
    assert_one_line_error(r, 4)
    assert "not a loopd-es log" in r.err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["other-app.db"]
