"""The run's outputs, by name: each one a pure function from the typed events to a file's text.

``write_outputs`` writes every registered format into the run folder at the end of a run
(``agent/graph.py``'s report node). A new output format is one module with its render
function and one ``register`` line below (and its test): the events, their models and the
numbers (``agent/runfacts.py``) are already there for it to read.
"""

from __future__ import annotations

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


def write_outputs(folder: Path, names: list[str] | None = None) -> list[Path]:
    """Every registered format (or the named ones) written from the folder's ``events.jsonl`` (redacted, 0600)."""
    from debugagent.tools.redact import write_private

    from .transcript import read_events
    events = read_events(folder / "events.jsonl")
    return [write_private(folder / FORMATS[n].file, FORMATS[n].render(events)) for n in (names or list(FORMATS))]
