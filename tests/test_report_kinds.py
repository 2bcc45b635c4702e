"""report.html of each kind of answer (a confirmed cause, a top suspect only, no regression), as headless Chromium
reads it: the headline, the "Changed on the host and undone" section with each change, and the fix, each taken from
the recording's own events (agent/answer.py, agent/changes.py, agent/fixes.py), never written here."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from debugagent.agent import changes
from debugagent.agent.fixes import fixes_for
from debugagent.agent.report import render_html
from debugagent.agent.runfacts import gather
from debugagent.agent.transcript import read_events

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"confirmed": "power-capped", "suspect": "eagle3-flashinfer-rebuilt", "no-regression": "no-regression"}


def text_of(dom: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (run-tests installs it)")
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_report_shows_the_answer_the_changes_and_the_fix(kind, tmp_path):
    events = read_events(ROOT / "transcripts" / KINDS[kind] / "events.jsonl")
    page = tmp_path / "report.html"
    page.write_text(render_html(events))
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1400,1300"]
    dom = subprocess.run([*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180).stdout
    text = text_of(dom)
    conclusion = next(e for e in events if e.event == "conclusion")
    causes = conclusion.root_causes
    # the answer first, said once
    if causes:
        assert f"Root cause: {causes[0].hypothesis}" in text
    else:
        lead = "No confirmed root cause." if conclusion.summary.startswith("No confirmed") else "No root cause confirmed."
        assert "No root cause confirmed. No confirmed root cause" not in text, text[:600]   # said once
        assert text.count(lead) == 1 and conclusion.summary.split(". ", 1)[1][:60] in text, text[:600]
    # what was changed and undone: the section, its summary, and each change with its undo
    assert changes.SECTION in text and changes.summary(events) in text
    rows, _ = changes.rows(events)
    for row in rows:
        assert all(" ".join(html.unescape(cell).split())[:50] in text for cell in row[1:3]), row
    assert bool(rows) == (kind != "no-regression")
    # the fix: each command under "What to do now"
    fixes = fixes_for(gather(events))
    if kind == "confirmed":
        assert "What to do now" in text and fixes
        for fx in fixes:
            for cmd in fx.commands:
                assert " ".join(cmd.split()) in text, cmd
    else:
        assert not causes
