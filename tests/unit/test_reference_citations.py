"""Every reference the code cites is in the repository: ``docs/reference/<file>.md#anchor`` names a real anchor.

The code follows the behaviour of opencode-loopd, the ``/loop`` plugin and OpenCode, and says where; those notes live
under ``docs/reference/``. A citation to a section that is not there (or an old ``§`` one to notes that are not in
the repository) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"docs/reference/([\w-]+\.md)#([\w-]+)((?:,\s*#[\w-]+|\s+to\s+#[\w-]+)*)")
FOLLOWING = re.compile(r"#([\w-]+)")
SOURCES = ("loopd_es", "tests", "tools", "projections", "docs")


def _texts() -> list[tuple[Path, str]]:
    return [
        (path, path.read_text(errors="replace"))
        for top in SOURCES
        for path in sorted((ROOT / top).rglob("*"))
        if path.suffix in (".py", ".md") and path.is_file()
    ]


def _anchors(doc: Path) -> set[str]:
    return set(re.findall(r'<a id="([\w-]+)"></a>', doc.read_text()))


def test_every_cited_section_exists() -> None:
    cited = 0
    missing = []
    for path, text in _texts():
        for match in CITATION.finditer(text):
            doc = ROOT / "docs" / "reference" / match.group(1)
            anchors = _anchors(doc) if doc.exists() else set()
            for anchor in [match.group(2), *FOLLOWING.findall(match.group(3))]:
                cited += 1
                if anchor not in anchors:
                    missing.append(f"{path.relative_to(ROOT)}: {match.group(1)}#{anchor}")
    assert cited > 100
    assert not missing, "\n".join(missing)


def test_no_citation_of_notes_outside_the_repository() -> None:
    stale = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path, text in _texts()
        if path.suffix == ".py"
        for line in text.splitlines()
        if "§" in line and path.name != "test_reference_citations.py"
    ]
    assert not stale, "\n".join(stale)


def test_reference_links_between_notes_resolve() -> None:
    """Links inside the notes (``[3.10](#s3-10)``, ``[loopd.md#s6](loopd.md#s6)``) land on an anchor."""
    reference = ROOT / "docs" / "reference"
    broken = []
    for doc in sorted(reference.glob("*.md")):
        for target, anchor in re.findall(r"\]\(((?:[\w-]+\.md)?)#([\w-]+)\)", doc.read_text()):
            if anchor not in _anchors(reference / target if target else doc):
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert not broken, "\n".join(broken)
