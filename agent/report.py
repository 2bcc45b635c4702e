"""``report.html``: one self-contained page per run (inline CSS and SVG, nothing fetched).

The hypothesis tree with verdicts, each experiment's benchmark runs before and after as an
SVG strip plot, the timeline of changes, the conclusion and the fix. Rendered from the
events, like transcript.md, through the Jinja2 template ``agent/templates/report.html.j2``
with autoescape on: every value from the run is escaped by the template, after ``shown`` has escaped its control
characters and bidi controls.
"""

from __future__ import annotations

import statistics
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from debugagent.tools.escape import html_text
from debugagent.tools.probes.text import clip_words, when
from debugagent.tools.units import plain
from jinja2 import Environment, Template, select_autoescape
from markupsafe import Markup
from pydantic import BaseModel, Field

from .answer import cause_what, together
from .events import Cause, Event
from .fixes import fixes_for
from .markdown import STATUS_WORD, fmt, sort_key
from .runfacts import RunFacts, gather, pct, runs_text

TEMPLATES = "templates"


class PlotRow(BaseModel):
    name: str
    y: int
    colour: str
    xs: list[float] = Field(default_factory=list)
    mean_x: float | None = None


class Plot(BaseModel):
    """An inline SVG strip plot's geometry: the runs before (the regression) and after (the experiment) on one
    axis, with the baseline; the template draws it."""

    w: int = 560
    h: int = 118
    left: int = 96
    right: int = 16
    unit: str = ""
    ticks: list[tuple[float, str]] = Field(default_factory=list)
    baseline: float | None = None
    baseline_x: float = 0.0
    rows: list[PlotRow] = Field(default_factory=list)


def strip_plot(before: list[float], after: list[float], baseline: float | None, unit: str, label_after: str) -> Plot | None:
    vals = before + after + ([baseline] if baseline is not None else [])
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    p = Plot(unit=unit, baseline=baseline)

    def x(v: float) -> float:
        return p.left + (v - lo) / (hi - lo) * (p.w - p.left - p.right)

    p.ticks = [(x(v), f"{plain(v, 4)}") for v in (lo + (hi - lo) * i / 4 for i in range(5))]
    if baseline is not None:
        p.baseline_x = x(baseline)
    for row, (name, data, colour) in enumerate([("before", before, "#e03131"), (label_after, after, "#1c7ed6")]):
        p.rows.append(PlotRow(name=name, y=34 + row * 30, colour=colour, xs=[x(v) for v in data],
                              mean_x=x(statistics.fmean(data)) if data else None))
    return p


@cache
def environment() -> Environment:
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True), keep_trailing_newline=True,
                      trim_blocks=False, lstrip_blocks=False, finalize=shown)
    env.globals.update(status_word=lambda st: STATUS_WORD.get(st, st), clip=clip_words, explains=explains,
                       cause_what=cause_what, together=together)
    return env


@lru_cache(maxsize=4)
def _page(text: str) -> Template:
    """The page's template, compiled once per process (most of a page's cost)."""
    return environment().from_string(text)


def shown(value: Any) -> Any:
    """Every value the template prints, before autoescape: a control character or a bidi control from the host
    shown escaped (``\\u202e`` cannot reverse a command on the page); the template's own markup left as it is."""
    return html_text(value) if isinstance(value, str) and not isinstance(value, Markup) else value


def template_text(name: str) -> str:
    return resources.files("debugagent.agent").joinpath(TEMPLATES, name).read_text(encoding="utf-8")


def explains(rc: Cause) -> str:
    return f"explains {pct(rc.explains)}" if rc.explains is not None else "share not measured"


def regression_text(f: RunFacts) -> str:
    """The reproduce step's runs, against the baseline and by how much: the numbers every output prints."""
    reg = f.regression
    text = f.reproduce_text
    if reg.baseline is not None:
        text += f" against a baseline of {fmt(reg.baseline)} {f.unit}".rstrip()
    if reg.delta is not None:
        text += f" (worse by {plain(reg.delta)} {f.unit})".replace("  ", " ").replace(" )", ")")
    if f.bench_source:
        text += f"; {f.bench_source}"
    return text


def context(f: RunFacts) -> dict[str, Any]:
    """What the template shows, worked out from the run's facts (runfacts) and nothing else."""
    hyps = []
    for hid in f.order:
        h = f.hyps[hid]
        last = h.verdicts[-1] if h.verdicts else None
        exps = []
        for x in h.experiments:
            share = x.measured_share
            exps.append({"title": x.title, "before": runs_text(f.reproduce, f.unit), "after": runs_text(x.samples, f.unit),
                         "share": pct(share) if share is not None else "",
                         # a plot only where the experiment measured something
                         "plot": strip_plot(f.reproduce, x.samples, f.regression.baseline, f.unit, "after") if x.samples else None})
        hyps.append({"id": hid, "title": h.title, "status": h.status, "how": last.how if last else None,
                     "because": clip_words(last.because if last else "not reached", 400), "experiments": exps,
                     "to_decide": h.to_decide})
    return {"f": f, "c": f.conclusion, "css": Markup(template_text("report.css")), "fixes": fixes_for(f), "hyps": hyps,
            "regression_word": "real" if f.regression.real is not False else "not reproduced",
            "regression_text": regression_text(f),
            "timeline": [(when(t), what) for t, what, _ in sorted(f.timeline, key=lambda r: sort_key(r[0]))]}


def render_html(events: list[Event]) -> str:
    from . import changes
    body, _ = changes.rows(events)
    page = _page(template_text("report.html.j2")).render(
        **context(gather(events)), changes_title=changes.SECTION, changes_summary=changes.summary(events),
        changes=body)
    return page.rstrip("\n") + "\n"


def write_report(folder: Path) -> Path:
    from debugagent.tools.redact import write_private

    from .transcript import read_events
    return write_private(folder / "report.html", render_html(read_events(folder / "events.jsonl")))  # redacted, 0600
