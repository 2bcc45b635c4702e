"""The run's outputs, by name: each one a pure function from the typed events to a file's text.

``write_outputs`` writes every registered format into the run folder at the end of a run
(``agent/graph.py``'s report node). A new output format is one module with its render
function and one ``register`` line below (and its test): the events, their models and the
numbers (``agent/runfacts.py``) are already there for it to read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .events import Event

Render = Callable[[list[Event]], str]


@dataclass(frozen=True)
class Output:
    name: str
    file: str          # the file it writes in the run folder
    render: Render


FORMATS: dict[str, Output] = {}


def register(name: str, file: str, render: Render) -> Output:
    """Add an output format (``name`` -> its file and its render function); a name is registered once."""
    if name in FORMATS:
        raise ValueError(f"output format `{name}` is registered already (writes {FORMATS[name].file})")
    FORMATS[name] = out = Output(name, file, render)
    return out


def _markdown(events: list[Event]) -> str:
    from .markdown import render
    return render(events)


def _html(events: list[Event]) -> str:
    from .report import render_html
    return render_html(events)


register("markdown", "transcript.md", _markdown)
register("html", "report.html", _html)


def render_all(events: list[Event], names: list[str] | None = None) -> dict[str, str]:
    """Each format's text from the same events (name -> text)."""
    return {n: FORMATS[n].render(events) for n in (names or list(FORMATS))}


def missing(folder: Path) -> list[str]:
    """The registered formats whose file the folder does not hold yet (``debugagent report`` writes those)."""
    return [n for n, o in FORMATS.items() if not (folder / o.file).is_file()]


# the texts last rendered, with the digest of the events they were rendered from: a run writes its outputs at its
# report step and again as it closes (after the final undo, which usually adds no event); each render is a pure
# function of the events, so the same events give the same texts (written again: the redactor may know more now)
_rendered: dict[str, tuple[bytes, dict[str, str]]] = {}


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


def write_outputs(folder: Path, names: list[str] | None = None) -> list[Path]:
    """Every registered format (or the named ones) written from the folder's ``events.jsonl`` (redacted, 0600)."""
    from debugagent.tools.redact import write_private

    from .transcript import read_events
    path = folder / "events.jsonl"
    key = str(Path(folder).resolve())
    digest = _digest(path)
    last = _rendered.get(key)
    texts = dict(last[1]) if last is not None and digest is not None and last[0] == digest else {}
    events: list[Event] | None = None
    written = []
    for n in names or list(FORMATS):
        if n not in texts:
            if events is None:
                events = read_events(path)
            texts[n] = FORMATS[n].render(events)
        written.append(write_private(folder / FORMATS[n].file, texts[n]))
    _rendered.clear()   # the latest run folder's only
    if digest is not None and _digest(path) == digest:   # kept only where the file did not change while rendering
        _rendered[key] = (digest, texts)
    return written
