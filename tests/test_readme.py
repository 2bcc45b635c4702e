"""The README shows what the code renders now: its transcript excerpt and the report screenshot."""

from __future__ import annotations

import re
from pathlib import Path

from agent.markdown import excerpt, render
from agent.transcript import read_events

ROOT = Path(__file__).resolve().parents[1]


def test_readme_excerpt_matches_the_current_rendering():
    """The excerpt between the README's markers is what transcript.md of the kept quick-start run renders to now
    (after a change: scripts/readme-assets)."""
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- transcript-excerpt:start -->\n````markdown\n(.*?)````\n<!-- transcript-excerpt:end -->", readme, re.S)
    assert m, "README.md lost its transcript-excerpt markers"
    md = render(read_events(ROOT / "transcripts" / "eagle3-flashinfer-rebuilt" / "events.jsonl"))
    assert m.group(1) == excerpt(md, ["code_change", "compiled_dependency"]), "run scripts/readme-assets"


def test_readme_shows_the_report_screenshot():
    """The README links docs/report.png, a PNG that scripts/readme-assets draws with headless Chromium."""
    assert "](docs/report.png)" in (ROOT / "README.md").read_text()
    png = (ROOT / "docs" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
