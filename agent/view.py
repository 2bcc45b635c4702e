"""The live console view of a run: a reporter fed by the transcript's events, never log lines.

On a terminal it is a ``rich`` live panel, refreshed four times a second: the phase, the
elapsed time and an estimate of what is left (the benchmark's measured duration times the
runs still planned), each measurement as it lands (mean ± sd, the share of the regression
recovered so far), the command running now, and every hypothesis with its verdict. Not on a
terminal it prints plain lines, one per phase, measurement and verdict. With ``--json``
it is silent. Fed the events already recorded, it is right after ``resume`` too.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

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

    def text(self, unit: str) -> str:
        v = self.values
        if not v:
            return f"{self.label}: waiting for the first run"
        sd = f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else ""
        return f"{self.label}: {statistics.fmean(v):.2f}{sd} {unit} over {len(v)} run{'s' if len(v) != 1 else ''}"


@dataclass
class ViewState:
    """Everything the view shows; updated from events (pure: no I/O)."""

    order: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    phase: str = "starting"
    command: str = ""
    unit: str = ""
    lower: bool = True
    baseline: float | None = None
    series: list[Series] = field(default_factory=list)
    bench_ms: list[float] = field(default_factory=list)
    reproduce_runs: int = 5
    max_runs: int = 8
    experiments_done: int = 0
    in_experiment: str | None = None
    result: str = ""
    lines: list[str] = field(default_factory=list)   # plain lines not yet printed (non-TTY mode)

    def _say(self, line: str) -> None:
        self.lines.append(line)

    def bad_mean(self) -> float | None:
        rep = next((s for s in self.series if s.label.startswith("reproduce")), None)
        return statistics.fmean(rep.values) if rep and rep.values else None

    def recovered(self, s: Series) -> float | None:
        bad = self.bad_mean()
        if bad is None or self.baseline is None or not s.values or s.label.startswith("reproduce") or bad == self.baseline:
            return None
        return (bad - statistics.fmean(s.values)) / (bad - self.baseline)

    def planned_runs(self) -> int:
        rep = next((s for s in self.series if s.label.startswith("reproduce")), None)
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

    def apply(self, event: str, d: dict[str, Any]) -> None:
        if event == "run_started":
            inp = d.get("inputs") or {}
            self.reproduce_runs = int(inp.get("reproduce_runs") or 5)
            self.max_runs = int(inp.get("max_runs") or 8)
            from .symptom import parse_symptom
            try:
                sym = parse_symptom(d.get("symptom") or "")
                self.unit, self.lower = sym.unit, sym.direction == "lower"
                if d.get("baseline"):
                    self.baseline = parse_symptom(d["baseline"]).in_unit(sym.unit)
            except Exception:  # noqa: BLE001 - a view never stops a run
                pass
            self.set_phase("discover: finding the server")
        elif event == "resumed":
            self.set_phase("resumed")
        elif event == "tool_call":
            self.command = d.get("display") or d.get("command") or ""
            tool, why, hyp = d.get("tool"), d.get("why") or "", d.get("hypothesis")
            if tool == "bench" and why.startswith("check"):
                self.series.append(Series("first run (the metric check)"))
                self.set_phase("discover: checking that the benchmark prints the metric")
            elif tool == "bench" and why.startswith("reproduce"):
                if not self.series or not self.series[-1].label.startswith("reproduce"):
                    self.series.append(Series("reproduce"))
                self.set_phase(f"reproduce: {why.replace('reproduce, ', '')}")
            elif tool in ("gpu_query", "python_packages", "git_state", "gpu_sample_under_load") and not hyp:
                self.set_phase("probe: the read-only evidence pass")
        elif event == "tool_result":
            if d.get("tool") == "bench":
                if d.get("duration_ms"):
                    self.bench_ms.append(float(d.get("wall_ms") or d["duration_ms"]))
                val = (d.get("output") or {}).get("value")
                if val is not None and self.series:
                    s = self.series[-1]
                    s.values.append(float(val))
                    rec = self.recovered(s)
                    self._say(f"[measure] {s.text(self.unit)}" + (f"; recovered {rec:.0%} so far" if rec is not None else ""))
            self.command = ""
        elif event == "hypothesis_opened":
            self.set_phase("evaluate: reading the evidence")
        elif event == "verdict":
            h, st = d.get("hypothesis"), d.get("status", "pending")
            if h:
                if h not in self.status:
                    self.order.append(h)
                if self.status.get(h) != st:
                    self._say(f"[verdict] {h}: {st.replace('_', ' ')}" + (f" (by {d['how']})" if d.get("how") else ""))
                self.status[h] = st
        elif event == "experiment":
            ph, hyp = d.get("phase"), d.get("hypothesis")
            if ph == "start":
                self.in_experiment = hyp
                self.series.append(Series(str(hyp)))
                self.set_phase(f"experiment on {hyp}: {d.get('text', '')}")
            elif ph == "undo":
                self.set_phase(f"experiment on {hyp}: undoing ({d.get('text', '')})")
            elif ph == "result":
                self.in_experiment = None
                self.experiments_done += 1
        elif event == "conclusion":
            for row in d.get("table") or []:
                if row["id"] not in self.status:
                    self.order.append(row["id"])
                self.status[row["id"]] = row["status"]
            causes = d.get("root_causes") or []
            self.result = ("Root cause: " + "; ".join(
                f"{c['hypothesis']} ({'explains ' + format(c['explains'], '.0%') if c.get('explains') is not None else 'share not measured'})"
                f": {c.get('summary', '')}" for c in causes)) if causes else (d.get("summary") or "no root cause")
            self.command = ""
            self.set_phase("done")
            self._say(f"[result] {self.result}")
        elif event in ("interrupted",):
            self.set_phase("interrupted")
            self.command = ""

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self._say(f"[phase] {phase}")


class View:
    """The reporter: ``feed(event, data)`` from any thread; a live panel on a TTY, plain lines otherwise."""

    def __init__(self, order: list[str], quiet: bool, console: Console | None = None, since: float | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
        self.state = ViewState(order=list(order), status={h: "pending" for h in order})
        self.quiet = quiet
        self.start = since if since is not None else time.monotonic()   # `since`: when the process started
        self._lock = threading.Lock()
        self.live: Live | None = None
        if self.console.is_terminal and not quiet:
            self.live = Live(self, console=self.console, refresh_per_second=4, transient=False,
                             redirect_stdout=False, redirect_stderr=False)

    # ------------------------------------------------------------ feeding
    def load(self, events: list[dict[str, Any]]) -> None:
        """Events already recorded (a resumed run): the view starts where the run stands."""
        with self._lock:
            for ev in events:
                self.state.apply(ev["event"], ev)
            self.state.lines.clear()

    def feed(self, event: str, data: dict[str, Any]) -> None:
        with self._lock:
            self.state.apply(event, data)
            lines, self.state.lines = self.state.lines, []
        if self.live is None and not self.quiet:
            for ln in lines:
                self.console.print(ln, markup=False, highlight=False)

    # ------------------------------------------------------------ rendering
    def __rich__(self) -> Group:
        with self._lock:
            return self.render()

    def render(self) -> Group:
        s = self.state
        width = max(40, self.console.width - 2)
        elapsed = time.monotonic() - self.start
        est = s.estimate_s()
        head = Text.assemble(("debugagent ", "bold"), (s.phase, "cyan"), f" · {elapsed:.0f} s elapsed")
        if est is not None and s.phase != "done":
            more = " + the experiments" if not any(v != "pending" for v in s.status.values()) else ""
            head.append(f" · about {est:.0f} s left{more} ({statistics.fmean(s.bench_ms) / 1000:.2f} s a run × "
                        f"{s.planned_runs()} planned)", style="dim")
        parts: list[Any] = [head]
        for ser in s.series[-3:]:
            rec = s.recovered(ser)
            so_far = " so far" if s.in_experiment == ser.label else ""
            parts.append(Text(clip(ser.text(s.unit) + (f"; recovered {rec:.0%}{so_far}" if rec is not None else ""), width)))
        t = Table(box=None, show_header=False, padding=(0, 1))
        for h in s.order:
            st = s.status.get(h, "pending")
            t.add_row(ICON.get(st, "?"), h, Text(st.replace("_", " "), style=STYLE.get(st, "")))
        parts.append(t)
        if s.command:
            parts.append(Text("$ " + clip(s.command, width - 2), style="dim"))
        if s.result:
            parts.append(Text(clip(s.result, width * 3), style="bold"))
        return Group(*parts)

    # ------------------------------------------------------------ lifetime
    def __enter__(self) -> View:
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        if self.live:
            self.live.refresh()
            self.live.__exit__(*a)
