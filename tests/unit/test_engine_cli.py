"""The engine's commands in-process: owner, worker, sim and notifications, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.errors import EXIT_CONFLICT, EXIT_USAGE

SCRIPT = {"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}]}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'events.db'}")
    monkeypatch.setenv("LOOPD_ES_HOST", f"sim:{tmp_path / 'host.json'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _create(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main("goal", "create", "g", "--objective", "o", "--model", "p/m", "--agent", "build", *extra) == 0
    return capsys.readouterr().out.splitlines()[0]


def _session(env: Path) -> str:
    state = json.loads((env / "host.state.json").read_text())
    return str(next(iter(state["sessions"])))


def test_worker_block_notifies_the_owner_and_notifications_lists_it(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    goal_id = _create(capsys)
    session = _session(env)
    assert main("worker", "block", "--session", session, "no network", "connect me") == 0
    assert capsys.readouterr().out.strip() == 'Goal "g" blocked.'
    assert main("notifications", "--goal", goal_id[:6], "--json") == 0
    rows = json.loads(capsys.readouterr().out)["notifications"]  # one document, like every query's --json
    assert len(rows) == 1 and rows[0]["kind"] == "blocked" and rows[0]["delivered_at"] is not None
    assert rows[0]["text"] == 'Loop goal "g" blocked: no network. Needed: connect me.'
    assert main("worker", "block", "--session", session, "again", "x") == EXIT_CONFLICT
    assert capsys.readouterr().err.strip() == "loopd-es: Cannot block goal in blocked state."


def test_owner_operations_print_the_reference_messages(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    goal_id = _create(capsys)
    assert main("owner", "nudge", goal_id[:8]) == 0
    assert capsys.readouterr().out.strip() == 'Re-prompted worker for "g".'
    assert main("owner", "send", goal_id, "use pnpm") == 0
    assert capsys.readouterr().out.strip() == 'Sent to "g" as its own turn.'
    assert main("owner", "abort", goal_id) == 0
    assert capsys.readouterr().out.strip().endswith("Engine continues the same session next turn.")
    assert main("owner", "force-complete", goal_id) == 0
    assert main("owner", "force-complete", goal_id) == EXIT_CONFLICT
    assert 'Goal "g" already complete.' in capsys.readouterr().err


def test_bad_input_is_one_line_with_the_usage_exit_code(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _create(capsys)
    session = _session(env)
    assert main("sim", "fail", session, "--error", "{not json") == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("loopd-es: --error is not valid JSON") and err.count("\n") == 1
    assert main("run", "--lease-ms", "-1") == EXIT_USAGE
    assert "--lease-ms must be from 100 to 31536000000" in capsys.readouterr().err
    assert main("notifications") == 0
    assert "no notifications" in capsys.readouterr().out


def test_sim_takes_a_goal_id_for_its_worker(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    goal_id = _create(capsys)
    assert main("sim", "reply", goal_id[:8], "--input", "7") == 0
    state = json.loads((env / "host.state.json").read_text())
    answers = [m for m in state["transcripts"][_session(env)] if m["role"] == "assistant"]
    assert len(answers) == 1 and answers[0]["input"] == 7
    assert main("sim", "idle", "no-such-thing") == EXIT_USAGE
    assert "no goal matches 'no-such-thing'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("--store", "sqlite:notes.txt", "run"), 4, "notes.txt is not a loopd-es log"),
        (("--store", "bogus:x", "run"), EXIT_USAGE, "unknown store scheme"),
        (("run", "--host", "bogus:x"), EXIT_USAGE, "unknown host scheme 'bogus'"),
        (("models", "--host", "opencode:http://127.0.0.1:abc"), EXIT_USAGE, "Port could not be cast"),
        (("goal", "create", "g", "--objective", "o", "--host", "opencode:http://[::1"), EXIT_USAGE,
         "Invalid IPv6 URL"),
    ],
)  # fmt: skip
def test_a_run_that_cannot_start_says_why_in_one_line_with_its_exit_code(
    env: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, words: str
) -> None:
    """Not ``internal error: ExceptionGroup`` (exit 1): the engine's task group used to wrap the reason."""
    (env / "notes.txt").write_text("my notes\n")
    assert main(*args) == code
    err = capsys.readouterr().err
    assert words in err and "ExceptionGroup" not in err and "internal error" not in err, err
    assert err.count("\n") == 1
    assert (env / "notes.txt").read_text() == "my notes\n"
    assert not (env / "events.db").exists()  # a bad --host made no log (`run --host bogus:x` once did)


def test_first_failure_finds_our_error_however_deep_the_groups_nest() -> None:
    from loopd_es.errors import StorageError, first_failure

    ours = StorageError("the store went away")
    nested = BaseExceptionGroup("outer", [ValueError("a bug"), BaseExceptionGroup("inner", [ours])])
    assert first_failure(nested) is ours
    bug = ValueError("a bug")
    assert first_failure(BaseExceptionGroup("only", [ExceptionGroup("deeper", [bug])])) is bug


@pytest.mark.parametrize("bad", [("--cost", "nan"), ("--cost", "-1"), ("--cost", "inf"), ("--input", "-500")])
def test_sim_reply_refuses_usage_no_host_could_report(
    env: Path, capsys: pytest.CaptureFixture[str], bad: tuple[str, str]
) -> None:
    """``--cost nan`` was stored in the simulated host's state, which then failed to load for every later
    command (exit 4); negative usage gave the goal budget back. Both are refused, and the host works on."""
    goal_id = _create(capsys)
    state = (env / "host.state.json").read_text()
    assert main("sim", "reply", goal_id, *bad) == EXIT_USAGE
    assert "must be" in capsys.readouterr().err
    assert (env / "host.state.json").read_text() == state
    assert main("sim", "reply", goal_id, "--cost", "0.5") == 0


def test_an_engine_with_a_malformed_opencode_url_says_so_before_it_runs(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it once said "engine running", then "internal error: OverflowError: connect(): port must be 0-65535"
    assert main("opencode", "install", str(env)) == 0
    capsys.readouterr()
    assert main("run", "--host", "opencode:http://127.0.0.1:99999") == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Port out of range 0-65535" in err, err
    assert not (env / "events.db").exists()


def test_a_tool_socket_path_that_cannot_be_a_socket_is_one_line_and_touches_nothing(
    env: Path, capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # a path past sun_path's size was "internal error: OSError: AF_UNIX path too long"; a file there was removed
    here = tmp_path_factory.mktemp("sock")
    here.chmod(0o700)
    squatter = here / "tools-x.sock"
    squatter.write_text("mine\n")
    for socket, words in [(here / ("d" * 120) / "tools.sock", "is longer than"), (squatter, "not a socket")]:
        config = env / "engine.json"
        config.write_text(json.dumps({"socket": str(socket), "token": "t" * 32}))
        assert main("run", "--tool-api", str(config)) == 4
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and words in err and "internal error" not in err, err
    assert squatter.read_text() == "mine\n"
