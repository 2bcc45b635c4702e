"""The typed events: built and checked before they are written, read back as models, older schemas migrated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from debugagent.agent.events import SCHEMA_VERSION, BadEvent, Reasoning, ToolCall, purpose_of
from debugagent.agent.markdown import render
from debugagent.agent.outputs import FORMATS, register
from debugagent.agent.transcript import Transcript, read_events
from debugagent.tools.errors import RecordingError

ROOT = Path(__file__).resolve().parents[1]
# the H200 lab's env case as recorded on 2026-12-02 (schema 1, before the server_view probe): kept as it was, since
# transcripts/h200 holds the newer recordings
OLD_ENV = ROOT / "tests" / "vectors" / "recordings" / "h200-2026-12-02" / "env" / "events.jsonl"


def test_a_bad_event_fails_loudly_and_writes_nothing(tmp_path):
    """An unknown field, a wrong type or an unknown event kind raises BadEvent; the file stays as it was."""
    t = Transcript(tmp_path, "r")
    t.emit("run_started", symptom="verify 30ms", host="h")
    for event, data in [("tool_call", {"call_id": 1, "tool": "bench", "colour": "red"}),
                        ("verdict", {"hypothesis": "x", "status": "maybe"}),
                        ("made_up", {})]:
        with pytest.raises(BadEvent):
            t.emit(event, **data)
    t.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["schema_version"] == SCHEMA_VERSION


def test_written_events_read_back_as_models(tmp_path):
    """What emit writes, read_events returns as the models, each tool call with its purpose."""
    t = Transcript(tmp_path, "r")
    seen = []
    t.listeners.append(lambda event, model: seen.append(model))
    t.emit("run_started", symptom="verify 30ms", host="h", inputs={"server_pattern": "labserve", "other": 1})
    t.emit("tool_call", call_id=1, tool="bench", why="reproduce, run 1", hypothesis=None, command="b", display="b")
    t.emit("tool_call", call_id=2, tool="restart_server", why="undo: restart the server as it was found",
           hypothesis="env_var", command="r", display="r")
    t.emit("reasoning", text="x: experiment not run", hypothesis="env_var", kind="not_run")
    t.close()
    evs = read_events(tmp_path / "events.jsonl")
    assert [type(e).__name__ for e in evs] == ["RunStarted", "ToolCall", "ToolCall", "Reasoning"]
    assert [e.purpose for e in evs if isinstance(e, ToolCall)] == ["reproduce", "undo"]
    assert evs[0].inputs.server_pattern == "labserve" and evs[0]["inputs"]["other"] == 1
    assert isinstance(evs[3], Reasoning) and evs[3].kind == "not_run"
    assert [type(m).__name__ for m in seen] == ["RunStarted", "ToolCall", "ToolCall", "Reasoning"]


def test_version_1_recordings_are_migrated_as_read():
    """A kept recording of schema 1 reads with every tool call's purpose, its file left as it is."""
    run = OLD_ENV   # the H200 lab's env case as recorded on 2026-12-02, schema 1
    assert json.loads(run.read_text().splitlines()[0])["schema_version"] == 1
    calls = [e for e in read_events(run) if isinstance(e, ToolCall)]
    purposes = {e.purpose for e in calls}
    assert {"reproduce", "probe", "experiment", "undo", "control", "warm-up"} <= purposes
    check = next(e for e in calls if e.why.startswith("check once"))
    assert check.purpose == "probe"   # the check's reading is the reproduce step's first run (runfacts)


def test_purpose_of_each_kind_of_call():
    """The purpose follows the call's step: undo, warm-up and control inside experiments, probes outside."""
    assert purpose_of("bench", None, "reproduce, run 2") == "reproduce"
    assert purpose_of("gpu_query", None, "GPU clocks") == "probe"
    assert purpose_of("bench", "env_var", "warm-up of the restarted server, not counted; then …") == "warm-up"
    assert purpose_of("bench", "env_var", "control: the server as found, restarted (run 1)") == "control"
    assert purpose_of("restart_server", "env_var", "undo: restart the server as it was found") == "undo"
    assert purpose_of("bench", "env_var", "the benchmark with X unset") == "experiment"


def test_a_newer_schema_is_refused(tmp_path):
    """A recording of a schema newer than this debugagent reads is a RecordingError naming line 1."""
    head = {"event": "run_started", "run_id": "r", "schema_version": SCHEMA_VERSION + 1, "symptom": "verify 30ms"}
    (tmp_path / "events.jsonl").write_text(json.dumps(head) + "\n")
    with pytest.raises(RecordingError) as e:
        read_events(tmp_path / "events.jsonl")
    assert e.value.line == 1


def test_an_edited_field_names_its_line(tmp_path):
    """A field of the wrong type in a recording is a RecordingError naming its line and the field."""
    lines = (ROOT / "transcripts" / "launch-blocking" / "events.jsonl").read_text().splitlines()
    n = next(i for i, ln in enumerate(lines) if '"event": "verdict"' in ln)
    ev = json.loads(lines[n])
    ev["status"] = "probably"
    lines[n] = json.dumps(ev)
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordingError) as e:
        read_events(tmp_path / "events.jsonl")
    assert e.value.line == n + 1 and "status" in str(e.value)


def test_process_table_names_the_server_the_run_found():
    """transcript.md finds the server with the run's own --server-pattern (recorded in run_started), as the run did."""
    events = read_events(OLD_ENV)
    assert events[0].inputs.server_pattern
    md = render(events)
    assert "no process whose command line looks like an inference server" not in md
    assert "the server: pid 509" in md


def test_output_formats_are_registered_by_name():
    """Each output format is a name, a file and a render function; a name is registered once."""
    assert {n: o.file for n, o in FORMATS.items()} == {"markdown": "transcript.md", "html": "report.html"}
    with pytest.raises(ValueError):
        register("markdown", "other.md", lambda events: "")


def test_a_reader_skips_the_line_a_run_is_still_writing_and_only_that(tmp_path):
    """A reader (`debugagent replay`, `report` of a live run) that opens events.jsonl while the run appends may see
    its last line cut short: while the run has the file open that line is not read yet; once the run has closed
    it, a cut line is an error naming its line, as any damaged line is (never hidden)."""
    t = Transcript(tmp_path, "r")
    t.emit("run_started", symptom="verify 30ms", host="h")
    t.emit("reasoning", text="one whole event", hypothesis=None)
    path = tmp_path / "events.jsonl"
    whole = path.read_bytes()
    with path.open("ab") as f:   # an event's first bytes: what a reader sees while a write of a long line runs
        f.write(b'{"event": "reasoning", "text": "a long ev')
    assert [type(e).__name__ for e in read_events(path)] == ["RunStarted", "Reasoning"]
    t.close()
    with pytest.raises(RecordingError) as e:
        read_events(path)
    assert e.value.line == 3
    path.write_bytes(whole)   # a finished file whose lines are whole reads as before
    assert len(read_events(path)) == 2


def test_each_event_is_one_write_of_its_whole_line(tmp_path, monkeypatch):
    """The writer appends each event with one write(2) of its whole line (no buffer that splits a long event into
    several writes, where a reader or another appender could come between them), on an O_APPEND file."""
    import os

    from debugagent.agent import transcript
    writes: list[bytes] = []
    real = os.write

    def write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(transcript.os, "write", write)
    t = Transcript(tmp_path, "r")
    t.emit("run_started", symptom="verify 30ms", host="h")
    t.emit("reasoning", text="x" * 300_000 + "\u2028 line separator inside a value", hypothesis=None)
    t.close()
    lines = (tmp_path / "events.jsonl").read_bytes().split(b"\n")
    assert writes == [lines[0] + b"\n", lines[1] + b"\n"] and lines[2] == b""
    assert len(read_events(tmp_path / "events.jsonl")) == 2


def test_an_event_holding_a_line_separator_is_one_line(tmp_path):
    """A value may hold U+2028 or U+0085 (a process table of the host: any process's command line is in it), left
    as is in the file (not escaped): a reader splits on "\\n" only. `str.splitlines` cut such a line in two, which
    made a test reading the file after a live run fail with a JSONDecodeError when another process of the machine
    had one in its command line."""
    from debugagent_testing import event_lines
    t = Transcript(tmp_path, "r")
    t.emit("run_started", symptom="verify 30ms", host="h")
    t.emit("reasoning", text="served-model-name a\u2028b\x85c", hypothesis=None)
    t.close()
    path = tmp_path / "events.jsonl"
    assert len(path.read_text().splitlines()) == 4   # the reading that failed
    assert [e["event"] for e in event_lines(path)] == ["run_started", "reasoning"] and len(read_events(path)) == 2
