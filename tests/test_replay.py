"""Record and replay: every kept transcript replays to its conclusion with no host at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from debugagent.agent.playbook import load_playbook
from debugagent.agent.replay import replay_events, replay_run
from debugagent.agent.transcript import read_events, render_markdown
from debugagent.tools.errors import RecordingError, ReplayMiss, UnknownCommand
from debugagent.tools.replay import ReplayTransport

from tests.test_same_numbers import garbled_outputs

ROOT = Path(__file__).resolve().parents[1]
# the simulated hosts' recordings, and those `scripts/gpu-lab` made on an H200 (transcripts/h200/CASE)
KEPT = sorted(p.parent for p in [*(ROOT / "transcripts").glob("*/events.jsonl"), *(ROOT / "transcripts").glob("h200/*/events.jsonl")])


def test_enough_recordings_are_kept():
    """At least 8 recorded runs, diverse across hypothesis ids, the seeds' story among them."""
    assert len(KEPT) >= 8
    causes = set()
    for run in KEPT:
        ev = read_events(run / "events.jsonl")
        conc = next(e for e in ev if e["event"] == "conclusion")
        causes |= {c["hypothesis"] for c in conc["root_causes"]} or {"none"}
        assert (run / "transcript.md").is_file()
    assert len(causes) >= 6
    assert any("eagle3" in r.name for r in KEPT)


@pytest.mark.parametrize("run", KEPT, ids=[r.name for r in KEPT])
def test_kept_transcript_replays_to_its_conclusion(run, tmp_path):
    """Replaying a kept recording (no network, no simulated host) reaches the recorded conclusion."""
    res = replay_events(read_events(run / "events.jsonl"), playbook=None, out=tmp_path / "replay")
    assert res["same"], "\n".join(res["diff"])
    assert res["unused_results"] == 0
    # what the code writes now from this recording's host outputs reads right: no `+1.77e+03`, no "mean …", no
    # "1 commits", no ";;", one interval per share (the kept files hold what the code wrote when they were recorded)
    assert not garbled_outputs(tmp_path / "replay"), "\n".join(garbled_outputs(tmp_path / "replay"))
    md = (tmp_path / "replay" / "transcript.md").read_text()
    for m in re.finditer(r"Result: ([^\n]*?): not a cause[^\n]*Verdict: ([^\n]*)", md):
        # an experiment that is "not a cause" never reads as the one that confirmed: the earlier one did
        assert "CONFIRMED" not in m.group(2) or m.group(2).startswith("still **CONFIRMED**, by the experiment above"), m[0]


UNDECIDED = ROOT / "tests" / "vectors" / "recordings" / "h200-2026-12-04" / "package-undecided" / "events.jsonl"


def test_an_undecided_experiment_shows_what_would_decide_it_where_a_person_reads(tmp_path):
    """A real H200 run (2026-12-04, kept as a vector): the good build's start read 1450 to 2134 over 24 runs against
    the reproduce step's 2 runs of the slow build, undecided at the budget. (This code stops such an experiment after
    5 runs and measures the server as found again: tests/test_control.py reads its runs from this vector.) What
    would decide it, as recorded, is shown where a person reads: transcript.md's conclusion (above the table),
    report.html under the hypothesis, and the console answer."""
    events = read_events(UNDECIDED)
    conc = [e for e in events if e["event"] == "conclusion"][-1]
    row = next(h for h in conc["inconclusive"] if h["hypothesis"] == "compiled_dependency")
    advice = row["next"]
    assert advice.startswith('repeat "') and "could not decide it" in advice
    md = render_markdown(events)
    said = [ln for ln in md.splitlines() if ln.startswith("- inconclusive **")]
    assert len(said) == 1 and said[0].startswith("- inconclusive **compiled_dependency**, its experiment undecided")
    assert advice in said[0]
    assert md.index("- inconclusive **") < md.index("| hypothesis | verdict |") < md.index("## What to do now")
    from debugagent.agent.report import render_html
    page = render_html(events)
    assert "Its experiment stayed undecided; to decide it: " in page and "could not decide it" in page
    from debugagent.agent.answer import evidence_lines
    lines = evidence_lines(conc.model_dump(mode="json", by_alias=True))
    assert any(ln.startswith("  to decide compiled_dependency: ") and "could not decide it" in ln for ln in lines)


def test_recording_header_and_redaction():
    """The header names schema, version, playbook and its hash, and the inputs; no secret is recorded."""
    for run in KEPT:
        text = (run / "events.jsonl").read_text()
        head = json.loads(text.splitlines()[0])
        assert head["event"] == "run_started" and head["schema_version"] in (1, 2)   # 2: re-recorded since tool_call.purpose
        assert head["playbook"] == "gpu-inference-regression" and len(head["playbook_digest"]) == 16
        assert "inputs" in head and head["debugagent_version"]
        # an API key's shape, not any "sk-" (a container name such as "uid-sgqmsk-jjvkzg" holds one)
        assert "hf_live_secret" not in text and not re.search(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}", text)


def test_changed_rule_fails_replay_with_verdict_diff(tmp_path):
    """A default-playbook edit that misses a recorded cause fails the replay (exit 5) where the run takes another path."""
    run = next(r for r in KEPT if "launch-blocking" in r.name)
    text = (ROOT / "playbooks" / "gpu-inference-regression.yaml").read_text()
    edited = text.replace('- {var: CUDA_LAUNCH_BLOCKING, value: "1",', '- {var: CUDA_LAUNCH_BLOCKIN, value: "1",')
    assert edited != text
    p = tmp_path / "edited.yaml"
    p.write_text(edited)
    # the variable is no longer a known cost: it is "not judged" and tested in a group, a restart the
    # recording does not hold, so the replay stops there (exit 5) instead of running on
    with pytest.raises(ReplayMiss) as e:
        replay_events(read_events(run / "events.jsonl"), playbook=str(p), out=tmp_path / "replay")
    assert "CUDA_LAUNCH_BLOCKIN" not in str(e.value) and e.value.exit_code == 5
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "playbook", "test", str(p), "--transcript", str(run)],
                       capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 5 and "the recording does not hold" in r.stderr
    assert list(tmp.iterdir()) == []   # the replay stopped: it leaves no half-written transcript behind


def test_unrecorded_command_stops_the_replay():
    """A command the recording lacks raises ReplayMiss naming the step and what was recorded next."""
    run = KEPT[0]
    t = ReplayTransport(read_events(run / "events.jsonl"))
    with pytest.raises(ReplayMiss) as e:
        t.run("rm -rf /")
    assert e.value.step == 1 and "recorded next" in str(e.value) and e.value.exit_code == 5


@pytest.mark.parametrize("damage", ["truncate", "garble", "unknown-event", "headless"])
def test_tampered_recording_exit_2_with_line(tmp_path, damage):
    """A tampered or truncated events.jsonl gives exit 2 with the line number, never a traceback."""
    run = KEPT[0]
    lines = (run / "events.jsonl").read_text().splitlines()
    if damage == "truncate":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
    elif damage == "garble":
        lines[5] = "{not json"
    elif damage == "unknown-event":
        lines[7] = json.dumps({"event": "made_up"})
    else:
        lines = lines[1:]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordingError):
        read_events(tmp_path / "events.jsonl")
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "replay", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "events.jsonl:" in r.stderr


def test_replay_cli_same_conclusion(tmp_path):
    """`debugagent replay RUN` exits 0 and says the conclusion is the same; the replayed transcript it wrote to a
    temporary folder is gone (a changed one is kept, and named)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "replay", str(KEPT[0])], capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 0 and "same conclusion" in r.stderr
    assert list(tmp.iterdir()) == []


def test_playbook_authors_helpers(tmp_path):
    """The shipped helpers: a fake transport driven by a function, and a transcript builder."""
    from debugagent_testing import FakeTransport, TranscriptBuilder
    b = TranscriptBuilder(symptom="verify 30ms", baseline="verify 20ms")
    b.result("hostname", "box\n")
    path = b.write(tmp_path / "rec")
    ev = read_events(path / "events.jsonl")
    assert [e["event"] for e in ev] == ["run_started", "tool_call", "tool_result", "conclusion"]
    t = FakeTransport({"hostname": "box\n"})
    assert t.run("hostname").stdout == "box\n"
    with pytest.raises(UnknownCommand):
        t.run("ls")
    assert load_playbook(None).name == "gpu-inference-regression"
    assert replay_run(str(KEPT[0]), out=str(tmp_path / "r")) == 0


def test_shipped_replay_fixture(replay_recording):
    """The shipped `replay_recording` fixture (loaded through pytest_plugins) replays a kept run to its conclusion."""
    res = replay_recording(KEPT[0])
    assert res["same"], res["diff"]
    assert res["commands"] > 0 and res["unused_results"] == 0
