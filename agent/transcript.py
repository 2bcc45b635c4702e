"""The transcript: ``events.jsonl`` (the source of truth) and ``transcript.md`` rendered from it.

Events are written through structlog: stable event names, bound context (``run_id``,
``hypothesis``), and a redaction processor that runs before anything reaches the file.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from tools.redact import redact

SCHEMA_VERSION = 1
EVENTS = ("run_started", "hypothesis_opened", "reasoning", "tool_call", "tool_result", "verdict", "experiment",
          "llm_call", "conclusion", "error", "interrupted", "resumed")


def redact_processor(logger: Any, name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: hide secrets in every value before rendering."""
    return redact(event_dict)


class Transcript:
    """Appends events to ``events.jsonl``; ``render()`` writes ``transcript.md``."""

    def __init__(self, folder: Path, run_id: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "events.jsonl"
        self.seq = 0
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):   # a run killed mid-write: its last event is torn; drop it
                with self.path.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
            self.seq = data.count(b"\n")
        self._file = self.path.open("a", buffering=1)
        self._lock = threading.Lock()
        self._start = time.monotonic()

        def stamp(logger: Any, name: str, ed: dict[str, Any]) -> dict[str, Any]:
            with self._lock:
                self.seq += 1
                ed["seq"] = self.seq
            ed["t"] = round(time.monotonic() - self._start, 3)
            return ed

        self.log = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[stamp, redact_processor, structlog.processors.JSONRenderer(sort_keys=False, ensure_ascii=False)],
            context_class=dict,
        ).bind(run_id=run_id)

    def emit(self, event: str, **data: Any) -> None:
        assert event in EVENTS, event
        self.log.msg(event, **data)

    def observer(self, hypothesis: str | None = None):
        def observe(event: str, data: dict[str, Any]) -> None:
            self.emit(event, hypothesis=hypothesis, **data)
        return observe

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    from tools.errors import RecordingError
    events = []
    if not path.is_file():
        raise RecordingError("no such recording", file=str(path), line=0, fix="give a transcript folder that holds events.jsonl")
    # JSON lines: split on "\n" only; U+2028, U+2029 and U+0085 may sit inside a value (str.splitlines splits there)
    for n, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as exc:
            raise RecordingError(f"not a JSON object ({exc.msg})", file=str(path), line=n,
                                 fix="the recording is truncated or edited; record the run again") from exc
        if not isinstance(ev, dict) or ev.get("event") not in EVENTS:
            raise RecordingError(f"not a debugagent event (event={ev.get('event') if isinstance(ev, dict) else None!r})",
                                 file=str(path), line=n, fix="the recording is edited; record the run again")
        events.append(ev)
    if not events or events[0]["event"] != "run_started":
        raise RecordingError("the first event is not run_started", file=str(path), line=1, fix="record the run again")
    from tools.replay import check_events
    check_events(events, str(path))
    return events


# ---------------------------------------------------------------- Markdown
# transport events that say the connection carried on (a reconnect, exec channels instead of sessions)
NOTICES = ("reconnected", "sessions")

STATUS_WORD = {"confirmed": "CONFIRMED", "ruled_out": "ruled out", "suspect": "suspect", "inconclusive": "inconclusive",
               "pending": "not reached"}


def _clip(text: str, n: int = 1600) -> str:
    text = text.rstrip("\n")
    if len(text) <= n:
        return text
    head = text[: n // 2]
    tail = text[-n // 2:]
    return f"{head}\n… ({len(text) - n} characters not shown) …\n{tail}"


def render_markdown(events: list[dict[str, Any]]) -> str:
    start = events[0]
    lines = [f"# debugagent: {start.get('symptom')} (baseline {start.get('baseline') or start.get('baseline_snapshot')})",
             "", f"Host `{start.get('host')}` · playbook `{start.get('playbook')}` ({start.get('playbook_digest')}) · "
             f"debugagent {start.get('debugagent_version')} · run `{start.get('run_id')}`", ""]
    msg = 0
    calls: dict[int, dict[str, Any]] = {}
    for ev in events[1:]:
        e = ev["event"]
        if e == "reasoning":
            msg += 1
            lines += [f"[msg {msg}] [assistant] {ev.get('text', '')}", ""]
        elif e == "hypothesis_opened":
            msg += 1
            lines += [f"## {ev.get('hypothesis')}: {ev.get('title', '')}", "",
                      f"[msg {msg}] [assistant] {ev.get('text', '')}", ""]
        elif e == "tool_call":
            calls[ev["call_id"]] = ev
        elif e == "tool_result":
            call = calls.get(ev["call_id"], {})
            msg += 1
            why = call.get("why")
            head = f"[msg {msg}] [assistant] [bash] {call.get('display') or ev.get('command')}"
            lines.append(head + (f"  — {why}" if why else ""))
            out = ev.get("stdout", "")
            if ev.get("stderr", "").strip():
                out = (out + ("\n" if out and not out.endswith("\n") else "") + ev["stderr"]).rstrip()
            lines += ["Output:", "```", _clip(out) if out.strip() else "(no output)", "```"]
            tail = f"exit {ev.get('exit_code')}, {ev.get('duration_ms', 0):.0f} ms"
            if ev.get("error"):
                tail += f"; {ev['error']}"
            lines += [f"<sub>{tail}</sub>", ""]
        elif e == "verdict":
            msg += 1
            how = f" (by {ev['how']})" if ev.get("how") else ""
            lines += [f"[msg {msg}] [assistant] **{ev.get('hypothesis')}: {STATUS_WORD.get(ev.get('status'), ev.get('status'))}"
                      f"{how}** — {ev.get('because', '')}", ""]
        elif e == "experiment":
            msg += 1
            lines += [f"[msg {msg}] [assistant] Experiment ({ev.get('phase')}): {ev.get('text', '')}", ""]
        elif e == "llm_call":
            msg += 1
            lines += [f"[msg {msg}] [llm] asked `{ev.get('model')}` to order the experiments; it answered "
                      f"{ev.get('answer')!r} ({'used' if ev.get('used') else 'not used'}: {ev.get('note', '')})", ""]
        elif e in ("error", "interrupted", "resumed"):
            msg += 1
            tag = "transport" if ev.get("kind") in NOTICES else e   # the connection recovered: not an error
            lines += [f"[msg {msg}] [{tag}] {ev.get('text', ev.get('message', ''))}", ""]
        elif e == "conclusion":
            lines += render_conclusion(ev)
    return "\n".join(lines).rstrip() + "\n"


def render_conclusion(ev: dict[str, Any]) -> list[str]:
    lines = ["## Conclusion", "", ev.get("summary", ""), ""]
    lines += ["| hypothesis | verdict | how | evidence |", "| --- | --- | --- | --- |"]
    for h in ev.get("table", []):
        evidence = "; ".join(h.get("because", []))[:600].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {h['id']} | {STATUS_WORD.get(h['status'], h['status'])} | {h.get('how') or ''} | {evidence} |")
    lines += ["", f"{ev.get('commands', 0)} commands, {ev.get('bench_runs', 0)} benchmark runs; exit {ev.get('exit_code')}.", ""]
    return lines


def write_markdown(folder: Path) -> Path:
    events = read_events(folder / "events.jsonl")
    p = folder / "transcript.md"
    p.write_text(render_markdown(events))
    return p
