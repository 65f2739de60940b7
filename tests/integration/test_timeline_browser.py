"""``history --html``: the page rendered by headless Chromium, checked through the browser.

The page's script writes what it drew (lanes, marks, final status, the selected event) into ``#facts`` and fills
the details panel; ``--dump-dom`` returns the DOM *after* the script ran, so these assertions fail if the script
breaks, the data does not parse, or the page needs the network. The screenshot is decoded (stdlib zlib) and must
show a real picture, not a blank page.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main

from ..components import require
from ..unit.test_postmortem_history import GOAL, make_log

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    require(CHROMIUM, "chromium", "apt-get install chromium")


def _chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,900", *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def page(tmp_path: Path) -> Path:
    url = anyio.run(make_log, tmp_path)
    html = tmp_path / "timeline.html"
    assert main("--store", url, "history", GOAL[:6], "--html", str(html)) == 0
    return html


def test_the_browser_draws_lanes_marks_and_the_status_event(page: Path, tmp_path: Path) -> None:
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    dom = _chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    facts = re.search(r'<div id="facts"[^>]*>', dom)
    assert facts is not None, dom[:500]
    got = dict(re.findall(r'data-([a-z]+)="([^"]*)"', facts.group(0)))
    assert got["ready"] == "1"
    assert got["lanes"] == "5"  # status, identity, runs, goal events, sagas and commands
    assert got["marks"] == "14"  # one per event of the goal's timeline
    assert got["status"] == "blocked" and got["selected"] == "goal.blocked"
    assert int(got["errors"]) == 5  # run.failed, the 429, the host's refusal, switch_failed, blocked
    details = dom[dom.index('id="details"') :]
    assert "#15 goal.blocked" in details and "status: active → blocked" in details
    assert "#10 identity.switch_requested" in details  # the "caused by" link, resolved by the script
    assert dom.count('class="row') == 14 and "Why blocked" in dom


def _pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG into rows of raw pixel bytes (filters undone)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = depth = kind = 0
    while pos < len(png):
        length, tag = struct.unpack(">I4s", png[pos : pos + 8])
        body = png[pos + 8 : pos + 8 + length]
        if tag == b"IHDR":
            width, height, depth, kind = struct.unpack(">IIBB", body[:10])
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and kind in (2, 6)
    bpp = 3 if kind == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = bytearray(stride)
    for y in range(height):
        line = raw[y * (stride + 1) : (y + 1) * (stride + 1)]
        f, cur = line[0], bytearray(line[1:])
        for x in range(stride):
            a = cur[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                cur[x] = (cur[x] + a) & 255
            elif f == 2:
                cur[x] = (cur[x] + b) & 255
            elif f == 3:
                cur[x] = (cur[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(cur))
        prev = cur
    return width, height, rows


def test_the_screenshot_is_a_real_picture(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, "--virtual-time-budget=3000", f"--screenshot={shot}", page.as_uri())
    width, height, rows = _pixels(shot.read_bytes())
    assert (width, height) == (1400, 900)
    bpp = len(rows[0]) // width
    sample = {row[x : x + 3] for row in rows[::6] for x in range(0, len(row), bpp * 6)}
    assert len(sample) > 40, "the page looks blank"
    header = rows[30][600 * bpp : 600 * bpp + 3]
    assert header[2] > header[0] and sum(header) < 300  # the dark blue header was painted
    red = sum(
        1 for row in rows[250:560] for x in range(0, len(row), bpp) if row[x] > 180 and row[x + 1] < 110
    )
    assert red > 800  # the blocked status segment and the error marks


def test_an_imported_goal_is_drawn_over_its_day_with_synthesised_events_marked(tmp_path: Path) -> None:
    """busy_day's storage goal: the axis spans the source's 09:05-15:45, not the import's milliseconds."""
    project = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects" / "busy_day"
    url = f"sqlite:{tmp_path / 'log.db'}"
    assert main("--store", url, "import-loopd", str(project)) == 0
    html = tmp_path / "imported.html"
    assert main("--store", url, "history", "5e1f0a3c-7b2d-4c8e-9f10-0000000000b2", "--html", str(html)) == 0
    dom = _chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", html.as_uri())
    facts = re.search(r'<div id="facts"[^>]*>', dom)
    assert facts is not None, dom[:500]
    got = dict(re.findall(r'data-([a-z]+)="([^"]*)"', facts.group(0)))
    assert got["ready"] == "1" and got["status"] == "budget_limited"
    assert got["span"] == "09:05:10.000-15:45:10.000"  # from state.json's createdAt
    # from state.json: the worker, usage and runtime records, and 3 control requests (cmd_start, pause,
    # resume: requested + completed each); every ledger line is drawn solid
    assert int(got["synthesised"]) == 3 + 3 * 2
    assert "09:05:10.000 → 15:45:10.000 UTC" in dom
    details = dom[dom.index('id="details"') :]
    assert "2026-11-24T15:45:10.000Z" in details and "imported from ledger line 58" in details
    assert "import.started on import-" in details  # its cause: the import, where the source's causes end
    assert dom.count('class="pill k-synth"') == int(got["synthesised"])  # and one row label each
    assert "cost $2.0731 ≥ $2.0000" in dom
