"""What a run changed on the host and how each change was undone, from the typed events alone.

Every change an experiment makes is preceded by its journalled undo step (an ``experiment`` event of phase
``undo_recorded``) and put back by that step (phase ``undo``, the same text). So the changes of a run are its
experiments that recorded an undo step, each with when it started, what it did (the ``start`` event's text), and
each undo step with when it ran, or that it did not (an ``error`` of kind ``undo`` says what is left).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from debugagent.tools.probes.text import clip_words, plural
from pydantic import BaseModel, Field

from .events import Error, Event, Experiment, RunStarted

SECTION = "Changed on the host and undone"


class UndoStep(BaseModel):
    text: str
    undone_at: float | None = None     # seconds into the run; None: not undone (yet)


class Change(BaseModel):
    hypothesis: str
    what: str
    at: float                          # seconds into the run
    steps: list[UndoStep] = Field(default_factory=list)

    @property
    def undone(self) -> bool:
        return all(s.undone_at is not None for s in self.steps)


def changes_made(events: list[Event]) -> tuple[list[Change], str | None, list[str]]:
    """The run's changes in the order made, its start (ISO UTC, to turn seconds into clock times) and what an
    undo left (the ``error`` events of kind ``undo``)."""
    started: str | None = None
    changes: list[Change] = []
    current: dict[str, Change] = {}
    left: list[str] = []
    for ev in events:
        if isinstance(ev, RunStarted):
            started = ev.started_at
        elif isinstance(ev, Experiment) and ev.hypothesis:
            hid = ev.hypothesis
            if ev.phase == "start":
                current[hid] = Change(hypothesis=hid, what=ev.text, at=float(ev.t or 0))
            elif ev.phase == "undo_recorded":
                ch = current.get(hid)
                if ch is None:
                    ch = current[hid] = Change(hypothesis=hid, what="(an earlier experiment)", at=float(ev.t or 0))
                if ch not in changes:
                    changes.append(ch)
                ch.steps.append(UndoStep(text=ev.text))
            elif ev.phase == "undo":
                ch = current.get(hid)
                step = next((s for s in (ch.steps if ch else []) if s.text == ev.text and s.undone_at is None), None)
                if step is not None:
                    step.undone_at = float(ev.t or 0)
        elif isinstance(ev, Error) and ev.kind == "undo":
            left.append(ev.message)
    return changes, started, left


def clock(started: str | None, t: float) -> str:
    """``09:00:56 UTC`` from the run's start and seconds into it; ``+3.2 s`` without a start."""
    try:
        at = datetime.fromisoformat(str(started)) + timedelta(seconds=t)
    except ValueError:
        return f"+{t:.1f} s"
    return at.strftime("%H:%M:%S UTC")


def rows(events: list[Event]) -> tuple[list[list[str]], list[str]]:
    """The section's table (when, experiment, what changed, how it was undone) and what is left to undo."""
    changes, started, left = changes_made(events)
    out: list[list[str]] = []
    for ch in changes:
        undo = "; ".join(f"{clip_words(s.text, 110)} ({'at ' + clock(started, s.undone_at) if s.undone_at is not None else 'NOT undone'})"
                         for s in ch.steps)
        out.append([clock(started, ch.at), ch.hypothesis, ch.what, undo])
    return out, left


def summary(events: list[Event]) -> str:
    """One sentence above the table, or the whole section when nothing changed."""
    changes, _, left = changes_made(events)
    if not changes:
        return "Nothing on the host was changed."
    done = sum(1 for c in changes if c.undone)
    return (f"{plural(len(changes), 'change')}, each journalled before it acted; {done} undone"
            + (f"; left to undo: {'; '.join(left)}" if left or done < len(changes) else "") + "." + why_allowed(events))


def why_allowed(events: list[Event]) -> str:
    """Why a run changed the host without --allow-mutations: its host was simulated (run.json keeps the flag as
    given, false); on a real host the same experiments need the flag or a yes at the prompt."""
    start = next((e for e in events if isinstance(e, RunStarted)), None)
    if start is None or getattr(start.inputs, "allow_mutations", False) or not start.host.startswith("sim:"):
        return ""
    return (" They ran without --allow-mutations because the host is simulated (its changes end with its sandbox); "
            "on a real host each needs --allow-mutations (--yes) or a yes at the prompt.")


def as_json(events: list[Event]) -> list[dict[str, Any]]:
    changes, started, _ = changes_made(events)
    return [{"hypothesis": c.hypothesis, "what": c.what, "at": clock(started, c.at),
             "undo": [{"text": s.text, "at": clock(started, s.undone_at) if s.undone_at is not None else None}
                      for s in c.steps]} for c in changes]
