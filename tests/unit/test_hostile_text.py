"""No name, objective, error or output can drive the terminal: every text view goes through one sanitiser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.text_safe import display_width, fit, json_safe, term_block, term_line, term_lines

EVIL_NAME = "\x1b]0;pwned\x07\x1b[2Jevil\u202egnp.exe\x9b31m"
EVIL_OBJECTIVE = "do it\x1b]52;c;cm0gLXJmIH4=\x07\nnext line\r\x1b[1A"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def _clean(text: str) -> bool:
    return not any(ch in text for ch in RAW)


def test_term_line_escapes_every_non_printable_character() -> None:
    assert term_line("plain é ✓") == "plain é ✓"
    out = term_line(EVIL_NAME)
    assert _clean(out) and "\n" not in out
    assert out == "\\x1b]0;pwned\\x07\\x1b[2Jevil\\u202egnp.exe\\x9b31m"
    assert term_line("a\nb\tc\x00") == "a\\nb\\tc\\x00"


def test_term_block_keeps_lines_drops_colours_and_escapes_the_rest() -> None:
    assert term_block("\x1b[31mred\x1b[0m\r\nnext\tcol\n") == "red\nnext\tcol\n"
    out = term_block("a\x1b]52;c;Zm9v\x07b\x1bc\x9b2J\u202e")
    assert _clean(out) and out == "ab\\x1bc\\x9b2J\\u202e"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default store and simulated host, in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPD_ES_STORE", raising=False)
    monkeypatch.delenv("LOOPD_ES_HOST", raising=False)
    return tmp_path


def test_views_render_hostile_names_through_the_sanitiser(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported hole: ``goals`` printed a goal name's escape sequences raw."""
    assert main("goal", "create", EVIL_NAME, "--objective", EVIL_OBJECTIVE) == 0
    created = capsys.readouterr().out
    assert _clean(created), created
    gid = created.splitlines()[0].strip()
    for argv in (
        ("goals",),
        ("goal", "show", gid),
        ("history", gid),
        ("explain", gid),
        ("read",),
        ("replay",),
    ):
        code = main(*argv)
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
        assert _clean(out) and _clean(err), (argv, out)
        assert "evil" in out or argv[0] in ("explain", "read", "replay"), argv


def test_errors_quoting_user_text_are_one_clean_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:{tmp_path / 'ev.db'}"
    code = main("--store", url, "cmd", "start", "--watch-filter", "(\x1b[2J\n", "--", "true")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and _clean(err), err


def test_html_title_does_not_pull_in_the_page_data(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main("goal", "create", "{{DATA}}</title><script>x</script>", "--objective", "o") == 0
    gid = capsys.readouterr().out.splitlines()[0].strip()
    page = here / "t.html"
    assert main("history", gid, "--html", str(page)) == 0
    html = page.read_text()
    title = html.split("<title>", 1)[1].split("</title>", 1)[0]
    assert title.startswith("{{DATA}}&lt;/title&gt;&lt;script&gt;"), title
    assert html.count('<script type="application/json" id="data">') == 1 and "<script>x" not in html


def test_notifications_and_worker_answers_show_hostile_names_inert(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #22: ``loopd-es notifications`` printed a goal name's escape sequences raw."""
    assert main("goal", "create", EVIL_NAME, "--objective", EVIL_OBJECTIVE) == 0
    gid = capsys.readouterr().out.splitlines()[0].strip()
    assert main("goal", "show", gid, "--json") == 0
    session = json.loads(capsys.readouterr().out)["goal"]["worker_session_id"]
    assert main("worker", "block", "--session", session, "stuck\x1b[2J", "help\x07") == 0
    blocked = capsys.readouterr().out
    assert _clean(blocked) and "evil" in blocked, blocked
    assert main("notifications") == 0
    out = capsys.readouterr().out
    assert _clean(out) and "evil" in out and "blocked" in out, out


def test_term_lines_keeps_lines_and_shows_escapes() -> None:
    assert term_lines("a\x1b[2Jb\nc\x07\u202e") == "a\\x1b[2Jb\nc\\x07\\u202e"
    assert term_lines("📋 2 loop task(s):\n  [x] é") == "📋 2 loop task(s):\n  [x] é"


def test_json_safe_escapes_what_the_encoder_leaves_raw() -> None:
    value = {"p": "x\x1b[2J\x9b\u202e\x7f\U000e0001 é 日 🎉"}
    doc = json_safe(json.dumps(value, ensure_ascii=False))
    assert _clean(doc) and doc.isprintable() and json.loads(doc) == value
    assert "é 日 🎉" in doc and "\\u009b" in doc and "\\udb40\\udc01" in doc


def test_loop_commands_print_escapes_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #23: prompts, ids and tokens reached the terminal raw from every /loop view."""
    monkeypatch.setenv("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'ev.db'}")
    monkeypatch.chdir(tmp_path)
    tid = task_id_for("m1")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main("loop", "--session", "s1", *argv)
        out, err = capsys.readouterr()
        assert _clean(out) and _clean(err), (argv, out, err)
        return code, out, err

    code, out, _ = run("--message-id", "m1", "add", "5m", EVIL_NAME)
    assert code == 0 and f'prompt "{term_line(EVIL_NAME)}" [id={tid}] [s=s1]' in out
    code, out, _ = run("list")
    assert out.splitlines()[1] == f"  [{tid}] ▶ active • every 300s • {term_line(EVIL_NAME)}"
    assert run("status")[1] == out
    code, _, err = run("cancel", "x\x1b[2Jy")
    assert (code, err) == (2, "❌ No task x\\x1b[2Jy in this session\n")
    code, _, err = run("add", "5m\x07")
    assert code == 2 and err.startswith('❌ Invalid interval "5m\\x07".')
    code, _, err = run("add", "--bogus\x1b]0;t\x07")
    assert code == 2 and err.startswith('❌ Unknown flag "--bogus\\x1b]0;t\\x07".')
    code, out, _ = run("--json", "--message-id", "m2", "add", EVIL_OBJECTIVE)
    assert code == 0 and EVIL_OBJECTIVE in json.loads(out)["model_prompt"]
    code, out, _ = run("history", tid)
    assert out.splitlines()[0] == f"task {tid} (fixed, active) in session s1: {term_line(EVIL_NAME)}"
    assert EVIL_NAME in json.loads(run("history", tid, "--json")[1])["task"]["prompt"]
    assert run("tool", '{"tool": "loop_status"}')[0] == 0
    code = main("loops")
    out = capsys.readouterr().out
    assert code == 0 and _clean(out) and tid in out
    code = main("loops", "--json")
    out = capsys.readouterr().out
    assert _clean(out) and {r["prompt"] for r in json.loads(out)["loops"]} == {
        EVIL_NAME,
        EVIL_OBJECTIVE.strip(),
    }


def test_tables_line_up_names_in_wide_characters() -> None:
    """Column widths counted characters, so a name in CJK or with an emoji pushed the next columns right."""
    from loopd_es.cli.query_cmds import table

    lines = table(("ID", "NAME", "STATUS"), [("a1", "日本語 🎉", "active"), ("b2", "plain", "paused"),
                                             ("c3", "e\u0301te\u0301", "x"), ("d4", "字" * 30, "y")])  # fmt: skip
    starts = {display_width(line[: line.index(status)]) for line, status in
              zip(lines, ("STATUS", "active", "paused", "x", "y"), strict=True)}  # fmt: skip
    assert len(starts) == 1, lines  # every STATUS cell starts in the same terminal column
    assert display_width(fit("字" * 30, 40)) in (39, 40) and fit("字" * 30, 40).endswith("…")  # no half a 字
