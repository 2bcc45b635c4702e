"""What a recorded run holds, gathered from its events once, for the Markdown, the HTML report
and the fix: the regression, each hypothesis with its verdicts and experiments, the host's
changes over time. Pure: a list of events in, a ``RunFacts`` out.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

Pair = tuple[dict[str, Any], dict[str, Any]]   # (tool_call, tool_result)
ACCEPT = re.compile(r"accept(?:ed)?[_ -]?len(?:gth)?\s*[=:]\s*([0-9]+(?:\.[0-9]+)?)", re.I)


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

    @property
    def samples(self) -> list[float]:
        return [r["output"]["value"] for c, r in self.calls
                if c.get("tool") == "bench" and r.get("exit_code") == 0 and (r.get("output") or {}).get("value") is not None]


class HypothesisView(BaseModel):
    id: str
    title: str = ""
    checks: list[str] = Field(default_factory=list)
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    experiments: list[ExperimentView] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def status(self) -> str:
        return self.verdicts[-1].get("status", "pending") if self.verdicts else "pending"


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
    metric: str = ""
    unit: str = ""
    direction: str = "lower"
    regression: dict[str, Any] = Field(default_factory=dict)
    reproduce: list[float] = Field(default_factory=list)
    tokens_per_step: float | None = None
    order: list[str] = Field(default_factory=list)
    hyps: dict[str, HypothesisView] = Field(default_factory=dict)
    calls_by_tool: dict[str, list[int]] = Field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = Field(default_factory=dict)   # tool -> parsed output (first, outside experiments)
    prelude: list[tuple] = Field(default_factory=list)
    epilogue: list[tuple] = Field(default_factory=list)
    timeline: list[tuple] = Field(default_factory=list)   # (time, what, call id or None)
    conclusion: dict[str, Any] = Field(default_factory=dict)
    baseline_snapshot: dict[str, Any] | None = None
    wall_s: float | None = None


def ssh_target(display: str) -> str | None:
    m = re.match(r"ssh ((?:-p \d+ )?\S+) ", display or "")
    return m.group(1) if m else None


def _unit_and_direction(symptom: str) -> tuple[str, str, str]:
    from .symptom import parse_symptom
    try:
        s = parse_symptom(symptom)
    except Exception:  # noqa: BLE001 - a recording from elsewhere: show what it says
        return symptom.split()[0] if symptom else "", "", "lower"
    return s.metric, s.unit, s.direction


def gather(events: list[dict[str, Any]]) -> RunFacts:
    start = events[0]
    f = RunFacts(run_id=start.get("run_id", ""), host=start.get("host", ""), symptom=start.get("symptom", ""),
                 baseline=start.get("baseline") or (f"the snapshot {start['baseline_snapshot']}"
                                                    if start.get("baseline_snapshot") else None),
                 playbook=start.get("playbook", ""), playbook_digest=start.get("playbook_digest", ""),
                 version=start.get("debugagent_version", ""), started_at=start.get("started_at"),
                 baseline_snapshot=start.get("baseline_snapshot_data"))
    f.metric, f.unit, f.direction = _unit_and_direction(f.symptom)
    calls: dict[int, dict[str, Any]] = {}
    results: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev["event"] == "tool_call":
            calls[ev["call_id"]] = ev
        elif ev["event"] == "tool_result":
            results[ev["call_id"]] = ev
    open_exp: dict[str, ExperimentView] = {}
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
        e, hid = ev["event"], ev.get("hypothesis")
        if e == "tool_call":
            res = results.get(ev["call_id"], {"exit_code": None, "error": "no result recorded", "stdout": ""})
            pair = (ev, res)
            if not f.target:
                f.target = ssh_target(ev.get("display") or "")
            tool = ev.get("tool") or ""
            if hid in open_exp:
                open_exp[hid].calls.append(pair)
                continue
            if hid is not None and hid in f.hyps:
                before.setdefault(hid, []).append(pair)   # e.g. the reference re-measured: part of the next experiment
                continue
            f.calls_by_tool.setdefault(tool, []).append(ev["call_id"])
            if res.get("output") and tool not in f.outputs:
                f.outputs[tool] = res["output"]
            if tool == "bench" and not opened and res.get("exit_code") == 0 and (res.get("output") or {}).get("value") is not None:
                f.reproduce.append(res["output"]["value"])
            m = ACCEPT.search(res.get("stdout") or "") if tool == "bench" else None
            if m and f.tokens_per_step is None:
                f.tokens_per_step = float(m.group(1))
            pending.append(pair)
        elif e == "tool_result":
            continue
        elif e == "reasoning":
            if hid:
                pending_reason[hid] = ev.get("text", "")
                if "not run" in ev.get("text", ""):
                    hyp(hid).notes.append(pending_reason.pop(hid))
            else:
                flush()
                sink().append(("say", ev.get("text", "")))
        elif e == "hypothesis_opened":
            flush()
            opened = True
            h = hyp(hid)
            h.title = ev.get("title", h.title)
            h.checks = ev.get("checks") or h.checks
        elif e == "verdict":
            hyp(hid).verdicts.append(ev)
        elif e == "experiment":
            phase = ev.get("phase")
            if phase == "start":
                x = ExperimentView(title=ev.get("text", ""), spec=ev.get("spec") or {}, reason=pending_reason.pop(hid, ""),
                                   reference=before.pop(hid, []))
                hyp(hid).experiments.append(x)
                open_exp[hid] = x
            elif phase == "undo_recorded" and hid in open_exp:
                open_exp[hid].undo_recorded.append(ev.get("text", ""))
            elif phase == "result" and hid in open_exp:
                x = open_exp.pop(hid)
                x.result, x.share, x.significant = ev.get("text", ""), ev.get("share"), ev.get("significant")
        elif e in ("error", "interrupted", "resumed", "llm_call"):
            flush()
            tag = "transport" if ev.get("kind") in ("reconnected", "sessions") else ("llm" if e == "llm_call" else e)
            text = ev.get("text") or ev.get("message") or ""
            if e == "llm_call":
                text = (f"asked `{ev.get('model')}` to order the experiments; it answered {ev.get('answer')!r} "
                        f"({'used' if ev.get('used') else 'not used'}: {ev.get('note', '')})")
            if hid in open_exp:
                open_exp[hid].result = (open_exp[hid].result + " " if open_exp[hid].result else "") + f"[{tag}] {text}"
            else:
                sink().append(("event", text, tag))
        elif e == "conclusion":
            for hid_ in list(before):   # calls of a hypothesis that no experiment followed
                pending.extend(before.pop(hid_))
            flush()
            f.conclusion = ev
            f.wall_s = ev.get("t")
    for hid_ in list(before):
        pending.extend(before.pop(hid_))
    flush()
    for h in (f.conclusion.get("table") or []):
        hyp(h["id"])
    f.regression = dict(f.conclusion.get("regression") or {})
    if f.reproduce:
        f.regression.setdefault("mean", statistics.fmean(f.reproduce))
        f.regression["samples"] = f.reproduce
    if f.regression.get("baseline") is None and f.baseline:
        from .symptom import parse_symptom
        try:
            b = parse_symptom(f.baseline)
            f.regression["baseline"] = b.in_unit(f.unit or b.unit)
        except Exception:  # noqa: BLE001 - a baseline snapshot: no number here
            pass
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
        rows.append((f.started_at, f"this run: {f.metric} {statistics.fmean(f.reproduce):.4g} {f.unit} (the regression)", None))
    return rows
