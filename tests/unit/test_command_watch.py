"""The watch state machine, line assembly and the output log, without processes or sleeps."""

from __future__ import annotations

import re
from pathlib import Path

from loopd_es.events.command import WatchMatched, WatchSpec, WatchSuspended
from loopd_es.procs.outlog import OutputLog, read_pattern, read_plain, retained_bytes, tail_text
from loopd_es.procs.text import LineAssembler, clean_line, strip_ansi
from loopd_es.procs.watch import MAX_PUSHES, Watcher


def watcher(**kw: str) -> Watcher:
    return Watcher("cid", "dev", WatchSpec(**kw))  # type: ignore[arg-type]


def test_coalesced_push_holds_matching_lines_only() -> None:
    w = watcher(filter="ERROR")
    for i, line in enumerate(["starting up", "ERROR one", "ERROR two"]):
        assert w.feed(line, 0.1 * i) == []
    assert w.due(1.0) == []
    [push] = w.due(2.2)
    assert isinstance(push, WatchMatched)
    assert push.text == '[watch "dev"]\nERROR one\nERROR two' and push.pushes == 1 and w.state == "active"


def test_push_is_bounded_to_20_lines_and_leftovers_get_the_next_window() -> None:
    w = watcher(filter="x")
    for i in range(25):
        w.feed(f"x{i}", i * 0.011)
    [first] = w.due(3.0)
    assert isinstance(first, WatchMatched) and first.lines == 20
    assert w.deadline == 5.0
    [second] = w.due(5.0)
    assert isinstance(second, WatchMatched) and second.lines == 5 and len(second.text.encode()) <= 4096


def test_budget_of_30_pushes_then_one_notice() -> None:
    w = watcher(filter="x")
    now = 0.0
    events = []
    for _ in range(MAX_PUSHES + 3):
        w.feed("x", now)
        now += 2.5
        events += w.due(now)
    pushes = [e for e in events if isinstance(e, WatchMatched)]
    notices = [e for e in events if isinstance(e, WatchSuspended)]
    assert len(pushes) == MAX_PUSHES and len(notices) == 1 and notices[0].reason == "budget"
    assert "BUDGET: push limit (30) reached" in notices[0].text and w.state == "budget-exhausted"


def test_flood_suspends_once_and_counts_drops() -> None:
    w = watcher(filter="x")
    events = []
    for i in range(150):
        events += w.feed(f"line {i}", i * 0.001)
    [notice] = events
    assert isinstance(notice, WatchSuspended) and notice.reason == "flood"
    assert "FLOOD: 100+ lines/sec" in notice.text and w.state == "flood-suspended"
    assert w.dropped >= 50


def test_until_push_and_keep() -> None:
    w = watcher(filter="o", until="READY", until_action="keep")
    w.feed("foo", 0)
    [push] = w.feed("READY now", 0.1)
    assert isinstance(push, WatchMatched) and push.until == "READY"
    assert push.text.endswith('-- until "READY" matched (action=keep)') and "foo" in push.text
    assert w.state == "until-matched" and w.feed("READY again", 0.2) == []
    w.feed("foo2", 0.3)
    [later] = w.due(5)
    assert isinstance(later, WatchMatched) and "foo2" in later.text


def test_line_assembly_crlf_progress_and_partial() -> None:
    a = LineAssembler()
    assert a.feed(b"one\r") == []
    assert a.feed(b"\ntw") == ["one"]
    assert a.feed(b"o\r\n10%\r50%\r100%\n") == ["two", "10%\r50%\r100%"]
    assert clean_line("10%\r50%\r100%") == "100%"
    assert a.feed("é".encode()[:1]) == [] and a.feed("é".encode()[1:] + b"\n") == ["é"]
    assert strip_ansi("\x1b[31mERROR\x1b[0m \x1b]0;title\x07x\x1b(B") == "ERROR x"


def test_output_log_bounds_and_reads(tmp_path: Path) -> None:
    log = OutputLog(tmp_path / "c.log")
    log.append(b"\x1b[31mERROR boom\x1b[0m\r\ninfo fine\r\n")
    assert read_pattern(log.path, re.compile("ERROR"), None, None).total_matches == 1
    assert "\x1b[31mERROR boom" in read_pattern(log.path, re.compile("ERROR"), None, None).text
    assert read_pattern(log.path, re.compile("error"), None, None).total_matches == 0
    assert read_pattern(log.path, re.compile("error", re.I), None, None).total_matches == 1
    for i in range(20):
        log.append(f"chunk-{i} ".encode() + b"y" * 50_000 + b"\n")
    log.append(b"ENDMARKER\n")
    assert len(retained_bytes(log.path)) == 512 * 1024 and log.path.stat().st_size <= 640 * 1024
    facts = log.facts()
    assert facts.truncated and facts.stream_bytes > facts.output_bytes == 512 * 1024
    tail = tail_text(log.path)
    assert len(tail.encode()) <= 4096 and "ENDMARKER" in tail and "chunk-0" not in tail
    assert read_plain(log.path, None, 10).text == "ENDMARKER\n"
    log.close()


def test_pattern_read_offset_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    path.write_bytes(b"match one\nnope\nmatch two\nmatch three\n")
    page = read_pattern(path, re.compile("match"), 1, 2)
    assert page.text == "match two\nmatch three" and page.total_matches == 3
