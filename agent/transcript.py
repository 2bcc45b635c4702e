"""The transcript: ``events.jsonl`` (the source of truth) and ``transcript.md`` rendered from it.

Events are written through structlog: stable event names, bound context (``run_id``,
``hypothesis``), and a redaction processor that runs before anything reaches the file.
Each event is first built as its model (``agent/events.py``): a field the model does not
know, or a value of the wrong type, raises ``BadEvent`` and nothing is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from debugagent.tools.errors import RunFolderError, write_problem
from debugagent.tools.redact import redact, write_private

from .events import EVENTS, SCHEMA_VERSION, Event, build, describe, migrate, parse_event

__all__ = ["EVENTS", "SCHEMA_VERSION", "Event", "Transcript", "read_events", "render_markdown", "write_markdown"]


def redact_processor(logger: Any, name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: hide secrets in every value before rendering."""
    return redact(event_dict)


class _Lines:
    """``events.jsonl`` open for appending: each event one ``write(2)`` of its whole line on an ``O_APPEND`` file
    (no buffer that could split it), the file locked (``flock`` LOCK_EX) while open, so a reader can tell a file
    still being written (``being_written``), whose last line may be cut short, from a finished one."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.closed = False
        self._lock = threading.Lock()
        deadline = time.monotonic() + 5.0
        while True:   # a reader holds its shared lock only while it looks
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break   # another writer holds it: written unlocked, and readers read it as finished (strictly)
                time.sleep(0.01)

    def msg(self, message: str) -> None:
        data = (message + "\n").encode("utf-8")
        with self._lock:   # events of several threads: one line at a time
            while data:   # one write; more only where the kernel took part of it (a disk filling up: the next raises)
                data = data[os.write(self.fd, data):]

    info = debug = warning = error = critical = log = msg   # as structlog's loggers: every level writes the line

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def being_written(path: Path) -> bool:
    """Whether a run still has ``path`` (an ``events.jsonl``) open for writing: its lock is held."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)   # (releases the shared lock where it was taken)
    return False


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
        self._file = _Lines(self.path)
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self.listeners: list[Any] = []   # reporters (the live view): called with (event, model) after it is written
        self.broken: str | None = None   # why the file cannot be written any more: later events are not written

        def stamp(logger: Any, name: str, ed: dict[str, Any]) -> dict[str, Any]:
            with self._lock:
                self.seq += 1
                ed["seq"] = self.seq
            ed["t"] = round(time.monotonic() - self._start, 3)
            return ed

        self.log = structlog.wrap_logger(
            self._file,
            processors=[stamp, redact_processor, structlog.processors.JSONRenderer(sort_keys=False, ensure_ascii=False)],  # pyright: ignore[reportArgumentType]  (structlog types an event dict as MutableMapping; these take dicts, as context_class makes them)
            context_class=dict,
        ).bind(run_id=run_id)

    def emit(self, event: str, **data: Any) -> None:
        """Write one event; ``BadEvent`` (nothing written) when it does not fit its model."""
        if event == "run_started":
            data["schema_version"] = SCHEMA_VERSION   # written in this version's schema, a replay's header too
        model = build(event, data)
        fields = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
        del fields["event"]
        if self.broken is None:
            try:
                self.log.msg(event, **fields)
            except OSError as exc:   # a full disk, a folder made read-only: the run stops (the host restored first)
                why = write_problem(exc)
                if why is None:
                    raise
                self.broken = why
                raise RunFolderError(self.folder, why) from None
        if self.listeners:
            shown = build(event, redact(fields))   # the live view shows what the file holds
            for listen in self.listeners:
                listen(event, shown)

    def observer(self, hypothesis: str | None = None):
        def observe(event: str, data: dict[str, Any]) -> None:
            self.emit(event, hypothesis=hypothesis, **data)
        return observe

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:   # the last line could not be flushed (a full disk)
            if write_problem(exc) is None:
                raise
            self.broken = self.broken or write_problem(exc)


def read_events(path: Path) -> list[Event]:
    """The events of a recording as models, migrated from the schema version its header names. A run still writing
    it (``being_written``) may have its last line cut short: that line is not read yet; in a finished file it is an
    error, as any damaged line is."""
    from debugagent.tools.errors import RecordingError
    from pydantic import ValidationError
    events: list[dict[str, Any]] = []
    lines: list[int] = []
    if not path.is_file():
        raise RecordingError("no such recording", file=str(path), line=0, fix="give a transcript folder that holds events.jsonl")
    data = path.read_bytes()
    if data and not data.endswith(b"\n") and being_written(path):
        data = data[:data.rfind(b"\n") + 1]   # the event being appended: read once its line is whole
    # JSON lines: split on "\n" only; U+2028, U+2029 and U+0085 may sit inside a value (str.splitlines splits there)
    for n, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordingError(f"not a JSON object ({exc.msg})", file=str(path), line=n,
                                 fix="the recording is truncated or edited; record the run again") from exc
        if not isinstance(ev, dict) or ev.get("event") not in EVENTS:
            raise RecordingError(f"not a debugagent event (event={ev.get('event') if isinstance(ev, dict) else None!r})",
                                 file=str(path), line=n, fix="the recording is edited; record the run again")
        events.append(ev)
        lines.append(n)
    if not events or events[0]["event"] != "run_started":
        raise RecordingError("the first event is not run_started", file=str(path), line=1, fix="record the run again")
    from debugagent.tools.replay import check_events
    check_events(events, str(path))
    v = events[0].get("schema_version")
    version = v if isinstance(v, int) and not isinstance(v, bool) else 1
    if version > SCHEMA_VERSION:
        raise RecordingError(f"schema version {version} is newer than this debugagent reads ({SCHEMA_VERSION})",
                             file=str(path), line=1, fix="read it with the debugagent that wrote it, or a newer one")
    out: list[Event] = []
    for n, ev in zip(lines, events, strict=True):
        try:
            out.append(parse_event(migrate(ev, version)))
        except ValidationError as exc:
            raise RecordingError(f"{ev['event']}: {describe(exc)}", file=str(path), line=n,
                                 fix="the recording is edited or damaged; record the run again") from None
    return out


# ---------------------------------------------------------------- Markdown
def render_markdown(events: list[Event]) -> str:
    """transcript.md from the events (agent/markdown.py holds the rendering)."""
    from .markdown import render
    return render(events)


def write_markdown(folder: Path) -> Path:
    events = read_events(folder / "events.jsonl")
    return write_private(folder / "transcript.md", render_markdown(events))
