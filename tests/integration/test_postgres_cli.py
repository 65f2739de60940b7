"""`loopd-es` against a real PostgreSQL server, as separate processes: URLs, exit codes, moving whole logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waits import wait_for_output, wait_until

from ..postgres_server import pg_url

__all__ = ["pg_url"]


def run(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def test_append_read_and_verify_through_a_postgres_url(pg_url: str) -> None:
    batch = "\n".join(json.dumps({"type": "goal.nudged", "data": {"goal_id": "g1"}}) for _ in range(3))
    appended = run("--store", pg_url, "append", "--stream", "goal-g1", stdin=batch)
    assert appended.returncode == 0, appended.stderr
    read = run("read", "--json", env={"LOOPD_ES_STORE": pg_url})
    assert read.returncode == 0, read.stderr
    assert [json.loads(line)["position"] for line in read.stdout.splitlines()] == [1, 2, 3]
    verified = run("--store", pg_url, "verify")
    assert verified.returncode == 0 and "clean" in verified.stdout, verified


def test_an_unreachable_server_is_exit_4_in_one_line() -> None:
    result = run("--store", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", "read")
    assert result.returncode == 4, result
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "cannot connect" in result.stderr


def test_export_and_import_move_a_whole_log_between_every_backend(pg_url: str, tmp_path: Path) -> None:
    source = f"sqlite:{tmp_path / 'a.db'}"
    lines = "\n".join(json.dumps({"type": "goal.nudged", "data": {"goal_id": f"g{i}"}}) for i in range(50))
    for stream in ("goal-a", "goal-b"):
        assert run("--store", source, "append", "--stream", stream, stdin=lines).returncode == 0
    assert run("--store", source, "export", "--to", pg_url).returncode == 0
    back = f"ndjson:{tmp_path / 'b.ndjson'}"
    imported = run("--store", back, "import", "--from", pg_url)
    assert imported.returncode == 0, imported.stderr
    original = run("--store", source, "read", "--json").stdout
    assert original and run("--store", pg_url, "read", "--json").stdout == original
    assert run("--store", back, "read", "--json").stdout == original
    again = run("--store", source, "export", "--to", pg_url)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_a_server_log_with_a_missing_row_is_named_and_no_file_is_made(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    lines = "\n".join(json.dumps({"type": "goal.nudged", "data": {"goal_id": f"g{i}"}}) for i in range(50))
    assert run("--store", pg_url, "append", "--stream", "goal-a", stdin=lines).returncode == 0
    base, schema = pg_url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {schema}.events WHERE position = 30")
    for target in (f"ndjson:{tmp_path / 'out.ndjson'}", f"sqlite:{tmp_path / 'out.db'}"):
        result = run("--store", pg_url, "export", "--to", target)
        assert result.returncode == 4 and "expected position 30, got 31" in result.stderr, result
        assert schema in result.stderr and "out." not in result.stderr, result
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("schema", ["bad-name", "x;drop"])
def test_an_invalid_schema_is_a_usage_error(schema: str) -> None:
    result = run("--store", f"postgresql://nobody@127.0.0.1:1/none?schema={schema}", "read")
    assert result.returncode == 2 and "invalid schema" in result.stderr, result


def test_commands_and_the_engine_work_on_a_server_log(pg_url: str, tmp_path: Path) -> None:
    """A command's files live on this machine (``$XDG_STATE_HOME``), whatever directory runs it; the engine,
    which reads them for owner notices, starts on a server log as on a file."""
    import signal

    env = {"LOOPD_ES_STORE": pg_url, "XDG_STATE_HOME": str(tmp_path / "state")}
    started = run("cmd", "start", "--title", "hello", "--", "sh", "-c", "echo hello-from-pg", env=env)
    assert started.returncode == 0, started.stderr
    command_id = started.stdout.split()[0]
    wait_until(
        "the command to finish", lambda: run("cmd", "list", env=env).stdout, done=lambda out: "exited" in out
    )
    read = run("cmd", "read", command_id, env=env)
    assert read.returncode == 0 and "hello-from-pg" in read.stdout, read
    assert list((tmp_path / "state" / "loopd-es").glob("commands-*/*.log"))
    (tmp_path / "host.json").write_text("{}")
    for shared in ([], ["--shared"]):
        err_file = tmp_path / f"engine{len(shared)}.err"
        with err_file.open("w") as err_out:
            engine = subprocess.Popen(
                [sys.executable, "-m", "loopd_es.cli", "run", *shared, "--host", f"sim:{tmp_path / 'host.json'}"],
                env={**os.environ, **env}, cwd=tmp_path, stderr=err_out, text=True,
            )  # fmt: skip
        try:
            wait_for_output(err_file, "engine running", process=engine)
        finally:
            engine.send_signal(signal.SIGTERM)
            engine.wait(timeout=30)
        err = err_file.read_text()
        assert engine.returncode == 0 and "internal error" not in err, err
