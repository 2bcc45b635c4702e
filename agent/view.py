"""The live console view of a run: a reporter fed by the transcript's events, never log lines.

On a terminal it is a ``rich`` live panel, refreshed four times a second: the phase, the
elapsed time and an estimate of what is left (the benchmark's measured duration times the
runs still planned), each measurement as it lands (mean ± sd, the share of the regression
recovered so far), the command running now, and every hypothesis with its verdict. Not on a
terminal it prints plain lines, one per phase, measurement and verdict. With ``--json``
it is silent. Fed the events already recorded, it is right after ``resume`` too.
"""

from __future__ import annotations

import re
import shlex
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import sinks
from .answer import headline
from .config import REPRODUCE_RUNS
from .events import (
    Conclusion,
    Event,
    EventBase,
    Experiment,
    HypothesisOpened,
    Interrupted,
    Resumed,
    RunStarted,
    ToolCall,
    ToolResult,
    Verdict,
    parse_event,
)
from .runfacts import baseline_value, live_share, pct, runs_text, unit_and_direction

ICON = {"pending": "·", "suspect": "?", "confirmed": "✔", "ruled_out": "✗", "inconclusive": "~"}
STYLE = {"confirmed": "bold green", "ruled_out": "dim", "suspect": "yellow", "inconclusive": "magenta", "pending": ""}


def clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


@dataclass
class Series:
    """The benchmark runs of one step (the reproduction, or one experiment)."""

    label: str
    values: list[float] = field(default_factory=list)
    reproduce: bool = False
    share: float | None = None   # the experiment's result: the share of the regression it recovered
    done: bool = False

    def text(self, unit: str, activity: str = "") -> str:
        """Its runs so far; before the first, what the step is doing now (``activity``: a download, a restart)."""
        if not self.values:
            return f"{self.label}: " + ("no runs" if self.done else activity or "waiting for the first run")
        return f"{self.label}: {runs_text(self.values, unit)}"


def unwrapped(display: str) -> str | None:
    """The command of an ``ssh TARGET 'COMMAND'`` display line, as it runs on the host; None when it is not one."""
    m = re.match(r"ssh (?:-p \d+ )?\S+ (.+)\Z", display or "", re.S)
    if not m:
        return None
    try:
        words = shlex.split(m.group(1))
    except ValueError:
        return None
    return words[0] if len(words) == 1 else None


def typed(ev: ToolCall) -> str:
    """The command of a tool call as a person would type it on the host: the benchmark as given, the server's own
    command line for a restart, never the ssh line nor the shell script wrapped around it."""
    i = ev.input or {}
    if ev.tool == "bench" and i.get("cmd"):
        return str(i["cmd"])
    if ev.tool == "gpu_sample_under_load" and i.get("load"):
        return f"{i['load']}   (GPU clocks and PCIe read while it runs)"
    if ev.tool == "restart_server" and i.get("argv"):
        return "restart: " + shlex.join(str(a) for a in i["argv"])
    return unwrapped(ev.display) or ev.command or ev.display


@dataclass
class ViewState:
    """Everything the view shows; updated from events (pure: no I/O)."""

    order: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    phase: str = "starting"
    command: str = ""
    activity: str = ""   # what the call in flight does (its stated reason), when it is not a benchmark run
    unit: str = ""
    lower: bool = True
    baseline: float | None = None
    series: list[Series] = field(default_factory=list)
    bench_ms: list[float] = field(default_factory=list)
    reproduce_runs: int = REPRODUCE_RUNS
    max_runs: int = 8
    experiments_done: int = 0
    in_experiment: str | None = None
    in_label: str | None = None   # the series the experiment under way measures (causes reverted together: "together (…)")
    counting: bool = False   # the benchmark call in flight adds to the last series (not a warm-up, not a control)
    result: str = ""
    stopped: str | None = None   # a signal's name once one arrived: no more time is promised
    lines: list[str] = field(default_factory=list)   # plain lines not yet printed (non-TTY mode)

    def _say(self, line: str) -> None:
        self.lines.append(line)

    def reproduce(self) -> Series | None:
        return next((s for s in self.series if s.reproduce), None)

    def bad_mean(self) -> float | None:
        rep = self.reproduce()
        return statistics.fmean(rep.values) if rep and rep.values else None

    def recovered(self, s: Series) -> float | None:
        """An experiment's share: its result's once it has one, else the runs so far against the reproduction."""
        if s.reproduce:
            return None
        if s.done:
            return s.share if s.values else None
        return live_share(self.bad_mean(), self.baseline, s.values)

    def recovered_text(self, s: Series) -> str:
        rec = self.recovered(s)
        return "" if rec is None else f"; recovered {pct(rec)}" + ("" if s.done else " so far")

    def planned_runs(self) -> int:
        rep = self.reproduce()
        early = self.phase.startswith(("starting", "connecting", "discover", "probe"))
        left = max(0, self.reproduce_runs - len(rep.values if rep else [])) if rep or early else 0
        pending_exp = sum(1 for st in self.status.values() if st == "suspect") - (1 if self.in_experiment else 0)
        if self.in_experiment:
            cur = self.series[-1] if self.series else None
            left += max(0, self.max_runs - len(cur.values) if cur else self.max_runs)
        return left + max(0, pending_exp) * self.max_runs

    def estimate_s(self) -> float | None:
        if not self.bench_ms:
            return None
        return statistics.fmean(self.bench_ms) / 1000 * self.planned_runs()

    def apply(self, ev: Event) -> None:
        if isinstance(ev, RunStarted):
            self.reproduce_runs = int(ev.inputs.reproduce_runs or REPRODUCE_RUNS)
            self.max_runs = int(ev.inputs.max_runs or 8)
            _, unit, direction = unit_and_direction(ev.symptom)
            self.unit, self.lower = unit, direction == "lower"
            self.baseline = baseline_value(ev.baseline, unit) if unit else None
            self.set_phase("discover: finding the server")
        elif isinstance(ev, Resumed):
            self.set_phase("resumed")
        elif isinstance(ev, ToolCall):
            self.command = typed(ev)
            self.counting = False
            self.activity = "" if ev.tool == "bench" else ev.why
            if ev.tool != "bench":
                if ev.tool in ("gpu_query", "python_packages", "git_state", "gpu_sample_under_load") and not ev.hypothesis:
                    self.set_phase("probe: the read-only evidence pass")
                return
            rep = self.reproduce()
            if ev.hypothesis is None and ev.purpose in ("probe", "reproduce") and (rep is None or not rep.done):
                if rep is None:
                    rep = Series("reproduce", reproduce=True)
                    self.series.append(rep)
                self.counting = True
                self.set_phase("discover: checking that the benchmark prints the metric" if ev.purpose == "probe" else
                               f"reproduce: run {len(rep.values) + 1} of {self.reproduce_runs}")
            elif ev.hypothesis is not None and ev.purpose == "experiment" and self.in_experiment == ev.hypothesis:
                self.counting = True
        elif isinstance(ev, ToolResult):
            if ev.tool == "bench":
                if ev.duration_ms:
                    self.bench_ms.append(float(ev.wall_ms or ev.duration_ms))
                val = ev.value
                if val is not None and self.counting and self.series:
                    s = self.series[-1]
                    s.values.append(val)
                    self._say(f"[measure] {s.text(self.unit)}{self.recovered_text(s)}")
            self.counting = False
            self.command = self.activity = ""
        elif isinstance(ev, HypothesisOpened):
            rep = self.reproduce()
            if rep is not None:
                rep.done = True
            self.set_phase("evaluate: reading the evidence")
        elif isinstance(ev, Verdict):
            h, st = ev.hypothesis, ev.status
            if h not in self.status:
                self.order.append(h)
            if self.status.get(h) != st:
                self._say(f"[verdict] {h}: {st.replace('_', ' ')}" + (f" (by {ev.how})" if ev.how else ""))
            self.status[h] = st
        elif isinstance(ev, Experiment):
            hyp = ev.hypothesis
            if ev.phase == "start":
                rep = self.reproduce()
                if rep is not None:
                    rep.done = True
                self.in_experiment = hyp
                joint = (ev.spec or {}).get("joint")   # the confirmed causes reverted together
                self.in_label = f"together ({', '.join(joint)})" if joint else str(hyp)
                self.series.append(Series(self.in_label))
                self.set_phase(f"experiment on {hyp}: {ev.text}")
            elif ev.phase == "undo":
                self.set_phase((f"experiment on {hyp}: " if hyp else "") + f"undoing ({ev.text})")
            elif ev.phase == "result":
                label = self.in_label or str(hyp)
                cur = next((s for s in reversed(self.series) if s.label == label and not s.done), None)
                if cur is not None:
                    cur.share, cur.done = ev.share, True
                    if cur.values and ev.share is not None:
                        self._say(f"[measure] {cur.text(self.unit)}{self.recovered_text(cur)}")
                self.in_experiment = None
                self.experiments_done += 1
        elif isinstance(ev, Conclusion):
            for row in ev.table:
                if row.id not in self.status:
                    self.order.append(row.id)
                self.status[row.id] = row.status
            self.result = headline(ev.model_dump(mode="json", by_alias=True))
            self.command = ""
            self.set_phase("done")
            self._say(f"[result] {self.result}")
        elif isinstance(ev, Interrupted):
            self.set_phase("interrupted")
            self.command = self.activity = ""

    def set_phase(self, phase: str) -> None:
        if self.stopped and not phase.startswith("interrupted"):   # what is under way after a signal: the undo
            phase = f"interrupted ({self.stopped}): {phase}"
        if phase != self.phase:
            self.phase = phase
            self._say(f"[phase] {phase}")


def as_event(event: str, data: Any) -> Event | None:
    """The model of what the transcript hands over (a model), or of a dict (events fed by hand); None when it is
    not an event (a view never stops a run)."""
    if isinstance(data, EventBase):
        return data  # type: ignore[return-value]
    try:
        return parse_event({**data, "event": event})
    except ValueError:
        return None


class View:
    """The reporter: ``feed(event, data)`` from any thread; a live panel on a TTY, plain lines otherwise."""

    def __init__(self, order: list[str], quiet: bool, console: Console | None = None, since: float | None = None) -> None:
        self.console = console or sinks.console(stderr=True)
        self.state = ViewState(order=list(order), status={h: "pending" for h in order})
        self.quiet = quiet
        self.start = since if since is not None else time.monotonic()   # `since`: when the process started
        self._lock = threading.Lock()
        self.live: Live | None = None
        if self.console.is_terminal and not quiet:
            self.live = self._new_live()

    def _new_live(self) -> Live:
        return Live(self, console=self.console, refresh_per_second=4, transient=False, redirect_stdout=False,
                    redirect_stderr=False)

    # ------------------------------------------------------------ feeding
    def load(self, events: list[Any]) -> None:
        """Events already recorded (a resumed run): the view starts where the run stands."""
        with self._lock:
            for ev in events:
                model = as_event(ev["event"], ev)
                if model is not None:
                    self.state.apply(model)
            self.state.lines.clear()

    def feed(self, event: str, data: Any) -> None:
        """One event as the transcript wrote it (its model), or as a dict of its fields."""
        model = as_event(event, data)
        with self._lock:
            if model is not None:
                self.state.apply(model)
            lines, self.state.lines = self.state.lines, []
        if self.live is None and not self.quiet:
            for ln in lines:
                self.console.print(ln, markup=False, highlight=False)

    def stopping(self, signum: int, waits: bool) -> None:
        """A signal arrived (called from its handler, so no lock is taken): the header says so at once and no
        longer promises time left; what follows is the undo."""
        import signal
        name = signal.Signals(signum).name
        self.state.stopped = name
        self.state.set_phase(f"interrupted ({name}): " + ("the change under way finishes first, then every change is "
                                                          "undone" if waits else "undoing what was changed, if anything"))

    # ------------------------------------------------------------ rendering
    def __rich__(self) -> Group:
        with self._lock:
            return self.render()

    def header(self, width: int) -> Text:
        """``debugagent PHASE · N s elapsed · about M s left (…)`` in one line of ``width``: the estimate is kept,
        the rest cut first (the estimate's detail, the word "elapsed", then the phase). No estimate once
        interrupted."""
        s = self.state
        elapsed = f"{time.monotonic() - self.start:.0f} s"
        est = s.estimate_s()
        left = detail = ""
        if est is not None and s.phase != "done" and not s.stopped and not s.phase.startswith("interrupted"):
            more = " + the experiments" if not any(v != "pending" for v in s.status.values()) else ""
            left = f" · about {est:.0f} s left{more}"
            detail = f" ({statistics.fmean(s.bench_ms) / 1000:.2f} s a run × {s.planned_runs()} planned)"
        lead = "debugagent "
        tail = ""
        for tail, extra in ((f" · {elapsed} elapsed", detail), (f" · {elapsed} elapsed", ""), (f" · {elapsed}", "")):
            if len(lead) + len(s.phase) + len(tail) + len(left) + len(extra) <= width:
                return Text.assemble((lead, "bold"), (s.phase, "cyan"), tail, (left + extra, "dim"))
        room = max(8, width - len(lead) - len(tail) - len(left))
        phase = s.phase if len(s.phase) <= room else s.phase[:room - 1].rstrip() + "…"
        return Text.assemble((lead, "bold"), (phase, "cyan"), tail, (left, "dim"))

    def render(self) -> Group:
        s = self.state
        width = max(40, self.console.width - 2)
        parts: list[Any] = [self.header(width)]
        shown = s.series[-3:]
        for i, ser in enumerate(shown):
            now = s.activity if i == len(shown) - 1 and not ser.done else ""
            parts.append(Text(clip(ser.text(s.unit, now) + s.recovered_text(ser), width)))
        t = Table(box=None, show_header=False, padding=(0, 1))
        for h in s.order:
            st = s.status.get(h, "pending")
            t.add_row(ICON.get(st, "?"), h, Text(st.replace("_", " "), style=STYLE.get(st, "")))
        parts.append(t)
        if s.command:
            parts.append(Text("$ " + clip(s.command, width - 2), style="dim", no_wrap=True, overflow="ellipsis"))
        # the answer is not in the panel: the command prints it once, in full, under the panel's last frame
        return Group(*parts)

    # ------------------------------------------------------------ a question to the person watching
    def experiment_estimate(self) -> tuple[float | None, int]:
        """About how long one experiment takes (the benchmark's measured time a run × the runs an experiment may
        take, None before any run) and those runs."""
        with self._lock:
            runs = self.state.max_runs
            each = statistics.fmean(self.state.bench_ms) / 1000 if self.state.bench_ms else None
        return (each * runs if each is not None else None), runs

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No redraw while a question is on the screen (the consent prompt): the live panel is stopped, its last
        frame left in place, and started again below the answer."""
        live = self.live
        if live is None or not live.is_started:
            yield
            return
        live.refresh()
        live.stop()
        try:
            yield
        finally:   # a new panel below the answer (the stopped one would move up over the question to redraw)
            self.live = self._new_live()
            self.live.start(refresh=True)

    # ------------------------------------------------------------ lifetime
    def __enter__(self) -> View:
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        if self.live:
            self.live.refresh()
            self.live.__exit__(*a)
