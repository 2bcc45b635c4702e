"""What a recorded run holds, gathered from its events once, for the Markdown, the HTML report
and the fix: the regression, each hypothesis with its verdicts and experiments, the host's
changes over time. Pure: a list of events in, a ``RunFacts`` out.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from debugagent.tools.probes import stands_for
from debugagent.tools.units import plain, whole_pct
from pydantic import BaseModel, Field

from .events import (
    Conclusion,
    Error,
    Event,
    Experiment,
    HypothesisOpened,
    Interrupted,
    LlmCall,
    Reasoning,
    RegressionFacts,
    Resumed,
    RunInputs,
    RunStarted,
    ToolCall,
    ToolResult,
    Verdict,
)
from .results import undecided_next

Pair = tuple[ToolCall, ToolResult]
STANDS_FOR = stands_for()
ACCEPT = re.compile(r"accept(?:ed)?[_ -]?len(?:gth)?\s*[=:]\s*([0-9]+(?:\.[0-9]+)?)", re.I)


# ---------------------------------------------------------------- the numbers, formatted once for every output
pct = whole_pct   # a share as a whole percent, half up (the engine's own sentences round the same way)


def runs_text(values: list[float], unit: str = "") -> str:
    """``30.13 ± 0.25 ms over 3 runs``: a step's benchmark runs as every output prints them."""
    if not values:
        return "no runs"
    return (f"{statistics.fmean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")
            + (f" {unit}" if unit else "") + f" over {len(values)} run{'s' if len(values) != 1 else ''}")


def live_share(bad: float | None, baseline: float | None, values: list[float]) -> float | None:
    """The share of the regression recovered so far by an experiment's runs (before its result says it)."""
    if bad is None or baseline is None or not values or bad == baseline:
        return None
    return (bad - statistics.fmean(values)) / (bad - baseline)


def is_check(call: ToolCall, reproduce: list[float]) -> bool:
    """The check that the benchmark prints the metric: the run's first benchmark run, a probe outside every
    hypothesis, whose reading the reproduce step takes as its first run."""
    return call.tool == "bench" and call.purpose == "probe" and call.hypothesis is None and not reproduce


def bench_values(pairs: list[Pair], purpose: str | None = None) -> list[float]:
    return [v for c, r in pairs if (purpose is None or c.purpose == purpose) and (v := r.value) is not None]


class ExperimentView(BaseModel):
    title: str
    spec: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    undo_recorded: list[str] = Field(default_factory=list)
    reference: list[Pair] = Field(default_factory=list)   # calls before it starts (the reference state re-measured)
    calls: list[Pair] = Field(default_factory=list)
    result: str = ""
    share: float | None = None
    significant: bool | None = None
    verdict: Verdict | None = None    # the verdict that followed its result

    @property
    def samples(self) -> list[float]:
        """The benchmark runs of the changed state (not the warm-up, not the control)."""
        return bench_values(self.calls, "experiment")

    @property
    def measured_share(self) -> float | None:
        """The share recovered, when the experiment measured anything (one that failed before measuring has none)."""
        return self.share if self.samples else None


class HypothesisView(BaseModel):
    id: str
    title: str = ""
    checks: list[str] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)
    experiments: list[ExperimentView] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def status(self) -> str:
        return self.verdicts[-1].status if self.verdicts else "pending"

    @property
    def to_decide(self) -> str | None:
        """What would decide it, where it is inconclusive because its experiment stayed undecided (at its budget, or
        against the control): the runs its verdict names (``verdicts.more_runs_next``); None otherwise."""
        last = self.verdicts[-1] if self.verdicts else None
        return last.next if last is not None and last.status == "inconclusive" and undecided_next(last.next) else None


class RunFacts(BaseModel):
    run_id: str = ""
    host: str = ""
    hostname: str | None = None
    target: str | None = None
    symptom: str = ""
    baseline: str | None = None
    playbook: str = ""
    playbook_digest: str = ""
    version: str = ""
    started_at: str | None = None
    inputs: RunInputs = Field(default_factory=RunInputs)
    metric: str = ""
    unit: str = ""
    direction: str = "lower"
    regression: RegressionFacts = Field(default_factory=RegressionFacts)
    reproduce: list[float] = Field(default_factory=list)
    tokens_per_step: float | None = None
    order: list[str] = Field(default_factory=list)
    hyps: dict[str, HypothesisView] = Field(default_factory=dict)
    calls_by_tool: dict[str, list[int]] = Field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = Field(default_factory=dict)   # tool -> parsed output (first, outside experiments)
    prelude: list[tuple] = Field(default_factory=list)
    epilogue: list[tuple] = Field(default_factory=list)
    timeline: list[tuple] = Field(default_factory=list)   # (time, what, call id or None)
    conclusion: Conclusion | None = None
    baseline_snapshot: dict[str, Any] | None = None
    wall_s: float | None = None

    @property
    def bench_format(self) -> str | None:
        """The format the benchmark's metric was read from (a key of ``benchfmt.FORMAT_WORDS``: ``sglang``,
        ``pairs`` …), as the check's run read it; None for a recording made before the bench tool said it."""
        fmt = (self.outputs.get("bench") or {}).get("format")
        return str(fmt) if fmt else None

    @property
    def bench_source(self) -> str:
        """``output_throughput`` read from SGLang bench_serving's result (JSONL): where every output says the
        numbers came from; "" where the recording does not say."""
        from debugagent.tools.benchfmt import FORMAT_WORDS
        fmt = self.bench_format
        return f"{self.metric} read from {FORMAT_WORDS.get(fmt, fmt)}" if fmt else ""

    @property
    def reproduce_text(self) -> str:
        """The reproduce step's runs (the check's run first), as every output prints them."""
        return runs_text(self.reproduce, self.unit)


def ssh_target(display: str) -> str | None:
    m = re.match(r"ssh ((?:-p \d+ )?\S+) ", display or "")
    return m.group(1) if m else None


def unit_and_direction(symptom: str) -> tuple[str, str, str]:
    from .symptom import parse_symptom
    try:
        s = parse_symptom(symptom)
    except Exception:  # noqa: BLE001 - a recording from elsewhere: show what it says
        return symptom.split()[0] if symptom else "", "", "lower"
    return s.metric, s.unit, s.direction


def baseline_value(baseline: str | None, unit: str) -> float | None:
    """The ``--baseline`` text as a number in the symptom's unit; None for a baseline snapshot."""
    if not baseline:
        return None
    from .symptom import parse_symptom
    try:
        b = parse_symptom(baseline)
        return b.in_unit(unit or b.unit)
    except Exception:  # noqa: BLE001 - a baseline snapshot: no number here
        return None


def gather(events: list[Event]) -> RunFacts:
    start = events[0]
    assert isinstance(start, RunStarted), start
    f = RunFacts(run_id=start.run_id, host=start.host, symptom=start.symptom,
                 baseline=start.baseline or (f"the snapshot {start.baseline_snapshot}" if start.baseline_snapshot else None),
                 playbook=start.playbook, playbook_digest=start.playbook_digest, inputs=start.inputs,
                 version=start.debugagent_version, started_at=start.started_at,
                 baseline_snapshot=start.baseline_snapshot_data)
    f.metric, f.unit, f.direction = unit_and_direction(f.symptom)
    results: dict[int, ToolResult] = {ev.call_id: ev for ev in events if isinstance(ev, ToolResult)}
    open_exp: dict[str, ExperimentView] = {}
    judged: dict[str, ExperimentView] = {}   # an experiment whose result awaits its verdict
    pending_reason: dict[str, str] = {}
    opened = False
    pending: list[Pair] = []   # consecutive calls outside hypotheses, flushed into prelude/epilogue
    before: dict[str, list[Pair]] = {}   # a hypothesis's calls before its experiment starts

    def sink() -> list[tuple]:
        return f.epilogue if opened else f.prelude

    def flush() -> None:
        nonlocal pending
        if pending:
            sink().append(("calls", pending))
            pending = []

    def hyp(hid: str) -> HypothesisView:
        if hid not in f.hyps:
            f.hyps[hid] = HypothesisView(id=hid)
            f.order.append(hid)
        return f.hyps[hid]

    for ev in events[1:]:
        hid = getattr(ev, "hypothesis", None)
        if isinstance(ev, ToolCall):
            res = results.get(ev.call_id) or ToolResult(call_id=ev.call_id, tool=ev.tool, error="no result recorded")
            pair = (ev, res)
            if not f.target:
                f.target = ssh_target(ev.display)
            if hid in open_exp:
                open_exp[hid].calls.append(pair)
                continue
            if hid is not None and hid in f.hyps:
                before.setdefault(hid, []).append(pair)   # e.g. the reference re-measured: part of the next experiment
                continue
            f.calls_by_tool.setdefault(ev.tool, []).append(ev.call_id)
            if ev.tool in STANDS_FOR:   # sent in place of another tool: a check of that one cites it
                f.calls_by_tool.setdefault(STANDS_FOR[ev.tool], []).append(ev.call_id)
            if res.output and ev.tool not in f.outputs:
                f.outputs[ev.tool] = res.output
            if res.value is not None and (ev.purpose == "reproduce" or is_check(ev, f.reproduce)):
                f.reproduce.append(res.value)
            m = ACCEPT.search(res.stdout) if ev.tool == "bench" else None
            if m and f.tokens_per_step is None:
                f.tokens_per_step = float(m.group(1))
            pending.append(pair)
        elif isinstance(ev, ToolResult):
            continue
        elif isinstance(ev, Reasoning):
            if ev.kind == "not_run" and hid:
                hyp(hid).notes.append(ev.text)
            elif hid:   # every word said of it before its next experiment starts (why it is tested, then "Next")
                pending_reason[hid] = f"{pending_reason[hid]} {ev.text}" if hid in pending_reason else ev.text
            else:
                flush()
                sink().append(("say", ev.text))
        elif isinstance(ev, HypothesisOpened):
            flush()
            opened = True
            h = hyp(ev.hypothesis)
            h.title = ev.title or h.title
            h.checks = ev.checks or h.checks
        elif isinstance(ev, Verdict):
            hyp(ev.hypothesis).verdicts.append(ev)
            x = judged.pop(ev.hypothesis, None)
            if x is not None:
                x.verdict = ev
        elif isinstance(ev, Experiment):
            if ev.phase == "start" and hid is not None:
                x = ExperimentView(title=ev.text, spec=ev.spec or {}, reason=pending_reason.pop(hid, ""),
                                   reference=before.pop(hid, []))
                hyp(hid).experiments.append(x)
                open_exp[hid] = x
            elif ev.phase == "undo_recorded" and hid in open_exp:
                open_exp[hid].undo_recorded.append(ev.text)
            elif ev.phase == "result" and hid in open_exp:
                x = open_exp.pop(hid)
                x.result, x.share, x.significant = ev.text, ev.share, ev.significant
                judged[hid] = x
        elif isinstance(ev, Error | Interrupted | Resumed | LlmCall):
            flush()
            tag = ("transport" if isinstance(ev, Error) and ev.kind in ("reconnected", "sessions")
                   else "llm" if isinstance(ev, LlmCall) else ev.event)
            if isinstance(ev, LlmCall):
                text = (f"asked `{ev.model}` to order the experiments; it answered {ev.answer!r} "
                        f"({'used' if ev.used else 'not used'}: {ev.note})")
            else:
                text = ev.message if isinstance(ev, Error) else ev.text
            if hid in open_exp:
                open_exp[hid].result = (open_exp[hid].result + " " if open_exp[hid].result else "") + f"[{tag}] {text}"
            else:
                sink().append(("event", text, tag))
        elif isinstance(ev, Conclusion):
            for hid_ in list(before):   # calls of a hypothesis that no experiment followed
                pending.extend(before.pop(hid_))
            flush()
            f.conclusion = ev
            f.wall_s = ev.t
    for hid_ in list(before):
        pending.extend(before.pop(hid_))
    flush()
    if f.conclusion is not None:
        for row in f.conclusion.table:
            hyp(row.id)
        f.regression = f.conclusion.regression.model_copy()
    if f.reproduce:
        if f.regression.mean is None:
            f.regression.mean = statistics.fmean(f.reproduce)
    if f.regression.baseline is None:
        f.regression.baseline = baseline_value(f.baseline, f.unit)
    f.hostname = (f.outputs.get("host_info") or {}).get("hostname")
    f.timeline = timeline(f)
    return f


def timeline(f: RunFacts) -> list[tuple]:
    """Changes on the host with a time: driver install, package installs, HEAD moves, server start."""
    rows: list[tuple] = []
    ids = f.calls_by_tool
    drv = f.outputs.get("driver_files") or {}
    if drv.get("installed_at"):
        rows.append((drv["installed_at"], f"NVIDIA driver library libcuda.so.{drv.get('library_version') or '?'} installed",
                     (ids.get("driver_files") or [None])[0]))
    pk = (f.outputs.get("python_packages") or {}).get("packages") or []
    stamps = Counter(p.get("installed_at") for p in pk if p.get("installed_at"))
    if stamps:
        env_ts, n = stamps.most_common(1)[0]
        cid = (ids.get("python_packages") or [None])[0]
        rows.append((env_ts, f"the Python environment installed ({n} of {len(pk)} packages)", cid))
        for p in pk:
            if p.get("installed_at") and p["installed_at"] != env_ts:
                build = f", compiled files hash {p['build_hash']}" if p.get("build_hash") else ""
                rows.append((p["installed_at"], f"{p['name']} {p['version']} installed{build}", cid))
    git = f.outputs.get("git_state") or {}
    cid = (ids.get("git_state") or [None])[0]
    for r in git.get("reflog") or []:
        act = r.get("action") or ""
        if act.startswith("commit"):
            continue
        rows.append((r.get("when"), f"HEAD → {r.get('sha', '')[:7]}: {act.replace(r.get('sha', ''), r.get('sha', '')[:7])}", cid))
    commits = git.get("commits") or []
    if commits:
        c = commits[0]
        rows.append((c.get("date"), f"HEAD commit {c.get('short')} \"{c.get('subject')}\" made", cid))
    srv = f.outputs.get("server_details") or {}
    if srv.get("started_at"):
        rows.append((srv["started_at"], f"the server (pid {srv.get('pid')}) started", (ids.get("server_details") or [None])[0]))
    if f.baseline_snapshot and f.baseline_snapshot.get("taken_at"):
        rows.append((f.baseline_snapshot["taken_at"], "the baseline snapshot was taken (the good state)", None))
    if f.started_at and f.reproduce:
        rows.append((f.started_at, f"this run: {f.metric} {plain(statistics.fmean(f.reproduce), 4)} {f.unit} (the regression)", None))
    return rows
