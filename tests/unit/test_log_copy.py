"""`loopd-es export` and `import` of a damaged source: refused naming the source and the damaged row, and the
new target they would have made is not left behind (nor a target that was there before removed). Real SQLite and
NDJSON logs, changed underneath with the sqlite3 module as a disk fault or a hand edit would."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(*args)
    out, err = capsys.readouterr()
    return code, out, err


def fifty(path: Path) -> str:
    """An SQLite log of 50 events on two streams."""
    url = f"sqlite:{path}"

    async def write() -> None:
        async with await open_store(url) as store:
            for stream in ("goal-a", "goal-b"):
                await store.append(
                    stream, [NewEvent(type="goal.nudged", data={"goal_id": f"g{i}"}) for i in range(25)]
                )

    anyio.run(write)
    return url


def damage(path: Path, how: str) -> str:
    """Change the log under ``path`` as ``how`` says; what the error must name."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        if how == "edit":  # still valid JSON: only the checksum knows
            con.execute("""UPDATE events SET data = '{"goal_id":"g99"}' WHERE position = 20""")
            return "position 20: checksum mismatch"
        con.execute("DELETE FROM events WHERE position = 30")
        return "expected position 30, got 31"
    finally:
        con.close()


def copy(verb: str, source: str, target: str) -> tuple[str, ...]:
    if verb == "export":
        return ("--store", source, "export", "--to", target)
    return ("--store", target, "import", "--from", source)


@pytest.mark.parametrize("how", ["edit", "delete"])
@pytest.mark.parametrize("verb", ["export", "import"])
@pytest.mark.parametrize("kind", ["sqlite", "ndjson"])
def test_a_damaged_sqlite_source_is_named_and_no_target_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, verb: str, kind: str
) -> None:
    source = fifty(tmp_path / "src.db")
    named = damage(tmp_path / "src.db", how)
    before = sorted(p.name for p in tmp_path.iterdir())
    target = f"{kind}:{tmp_path / ('new.db' if kind == 'sqlite' else 'new.ndjson')}"
    code, out, err = run(capsys, *copy(verb, source, target))
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{source}: event at {named}" in err or f"{source}: {named}" in err, err
    assert "new." not in err  # the target is not blamed
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no log, no sidecar


def test_a_target_that_was_there_before_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = fifty(tmp_path / "src.db")
    damage(tmp_path / "src.db", "delete")
    for name in ("empty.db", "empty.ndjson"):
        target = f"{'sqlite' if name.endswith('.db') else 'ndjson'}:{tmp_path / name}"

        async def make(url: str = target) -> None:
            async with await open_store(url) as store:
                assert await store.head() == 0

        anyio.run(make)
        files = sorted(p.name for p in tmp_path.iterdir())
        assert run(capsys, *copy("export", source, target))[0] == 4
        assert sorted(p.name for p in tmp_path.iterdir()) == files
        assert run(capsys, "--store", target, "verify")[0] == 0


def test_a_clean_copy_keeps_its_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = fifty(tmp_path / "src.db")
    target = f"ndjson:{tmp_path / 'out.ndjson'}"
    code, out, err = run(capsys, *copy("export", source, target))
    assert code == 0 and "copied 50 events" in out, err
    assert run(capsys, "--store", target, "verify")[0] == 0


def test_a_changed_ndjson_line_is_named_in_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"ndjson:{tmp_path / 'src.ndjson'}"
    assert run(capsys, *copy("export", fifty(tmp_path / "a.db"), source))[0] == 0
    lines = (tmp_path / "src.ndjson").read_bytes().splitlines(keepends=True)
    lines[9] = lines[9].replace(b'"g9"', b'"g8"')
    (tmp_path / "src.ndjson").write_bytes(b"".join(lines))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run(capsys, *copy("export", source, f"sqlite:{tmp_path / 'new.db'}"))
    assert code == 4 and str(tmp_path / "src.ndjson") in err and "new.db" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_copy_refusals_say_what_to_do_instead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = fifty(tmp_path / "src.db")
    other = fifty(tmp_path / "other.db")
    code, _, err = run(capsys, *copy("export", source, other))
    assert code == 2 and "export only into a new log" in err, err
    code, _, err = run(capsys, *copy("import", source, other))
    assert code == 2 and "import only into a new log" in err, err
    code, _, err = run(capsys, *copy("export", source, f"bundle:{tmp_path / 'x.bundle'}"))
    assert code == 2 and "loopd-es bundle GOAL -o FILE" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.bundle").exists()
    code, _, err = run(capsys, "--store", f"bundle:{tmp_path / 'x.bundle'}", "read")
    assert code == 2 and "append an event" not in err and "never appended to" in err, err
    assert json.loads(run(capsys, "--store", other, "read", "--json", "--last", "1")[1])["position"] == 50


@pytest.mark.parametrize("verb", ["export", "import"])
def test_a_log_written_before_checksums_still_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    # the checked copy selected a crc column such a log does not have: "no such column: crc" (exit 4)
    url = fifty(tmp_path / "old.db")
    con = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    con.execute("ALTER TABLE events DROP COLUMN crc")
    con.close()
    target = f"ndjson:{tmp_path / 'new.ndjson'}"
    code, _, err = run(capsys, *copy(verb, url, target))
    assert code == 0, err
    code, out, _ = run(capsys, "--store", target, "verify")
    assert code == 0 and "50 events in 2 streams: clean" in out
