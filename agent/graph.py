"""The LangGraph graph of one investigation.

::

    intake -> discover -> probe -> evaluate -> plan -> experiment -> evaluate -> plan -> ... -> conclude -> report
                                       \\________________________________________________/

Every node is a function of the state (plain JSON-ready dicts, so the SQLite checkpointer
can save it after each step); the transport, the transcript and the playbook are held by
``Ctx``, built once per process and passed to ``build_graph``.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from tools.errors import UsageError
from tools.host import HostFacts, ServerInfo
from tools.redact import redact
from tools.registry import Runner
from tools.snapshot import Snapshot, collect
from tools.transport import BaseTransport

from .discovery import discover as find_host_server
from .discovery import narrate, run_input, state_of
from .experiments import ConnectionLost, ExperimentError, Lab, LabSetup, Measure
from .facts import build_facts
from .journal import Journal
from .playbook import Playbook, evaluate
from .preflight import check_benchmark
from .stats import regression_is_real
from .symptom import Symptom
from .transcript import Transcript

RECURSION_LIMIT = 200
REPRODUCE_RUNS = 5
EXPLAINED_ENOUGH = 0.9


class State(TypedDict, total=False):
    inputs: dict[str, Any]
    discovered: dict[str, Any]
    snapshot: dict[str, Any]
    regression: dict[str, Any]
    facts: dict[str, Any]
    hyps: dict[str, dict[str, Any]]
    current: dict[str, Any] | None
    done: list[str]
    notes: list[str]
    bench_runs: int
    conclusion: dict[str, Any]


@dataclass
class Ctx:
    transport: BaseTransport
    transcript: Transcript
    playbook: Playbook
    run_id: str
    undo: Journal
    symptom: Symptom
    baseline: Symptom | None = None
    baseline_snapshot: Snapshot | None = None
    allow_mutations: bool = False
    confirm: Callable[[str], bool] | None = None
    advisor: Any = None
    on_status: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    overrides: dict[str, Any] = field(default_factory=dict)
    _runners: dict[str | None, Runner] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def runner(self, hypothesis: str | None = None) -> Runner:
        if hypothesis not in self._runners:
            obs = self.transcript.observer(hypothesis)

            def observe(event: str, data: dict[str, Any], _obs=obs) -> None:
                _obs(event, data)
                self.on_status(event, {**data, "hypothesis": hypothesis})
            r = Runner(self.transport, observe, ids=self._ids)
            self._runners[hypothesis] = r
        return self._runners[hypothesis]

    @property
    def commands(self) -> int:
        return sum(r.count for r in self._runners.values())

    def say(self, text: str, hypothesis: str | None = None) -> None:
        self.transcript.emit("reasoning", text=text, hypothesis=hypothesis)
        self.on_status("reasoning", {"text": text})


def build_graph(ctx: Ctx, checkpointer: Any = None):
    """The compiled graph; ``checkpointer`` (SQLite in the run folder) makes it resumable."""
    g = StateGraph(State)
    g.add_node("intake", lambda s: intake(ctx, s))
    g.add_node("discover", lambda s: discover(ctx, s))
    g.add_node("probe", lambda s: probe(ctx, s))
    g.add_node("evaluate", lambda s: evaluate_node(ctx, s))
    g.add_node("plan", lambda s: plan(ctx, s))
    g.add_node("experiment", lambda s: experiment(ctx, s))
    g.add_node("conclude", lambda s: conclude(ctx, s))
    g.add_node("report", lambda s: report(ctx, s))
    g.add_edge(START, "intake")
    g.add_edge("intake", "discover")
    g.add_edge("discover", "probe")
    g.add_edge("probe", "evaluate")
    g.add_conditional_edges("evaluate", after_evaluate, {"plan": "plan", "conclude": "conclude"})
    g.add_conditional_edges("plan", after_plan, {"experiment": "experiment", "conclude": "conclude"})
    g.add_edge("experiment", "evaluate")
    g.add_edge("conclude", "report")
    g.add_edge("report", END)
    return g.compile(checkpointer=checkpointer)


# ---------------------------------------------------------------- routers (pure)
def after_evaluate(s: State) -> str:
    reg = s.get("regression") or {}
    if reg.get("measured") and not reg.get("real"):
        return "conclude"
    return "plan"


def after_plan(s: State) -> str:
    return "experiment" if s.get("current") else "conclude"


# ---------------------------------------------------------------- nodes
def intake(ctx: Ctx, s: State) -> State:
    sym, base = ctx.symptom, ctx.baseline
    text = f"The user reports {sym.text}"
    if base:
        text += f" against a baseline of {base.text}"
    elif ctx.baseline_snapshot:
        text += f" against the baseline snapshot of {ctx.baseline_snapshot.host} ({ctx.baseline_snapshot.taken_at})"
    text += (f" ({'lower' if sym.direction == 'lower' else 'higher'} is better). The plan: find the server, reproduce the "
             f"regression, gather cheap read-only evidence in one pass, then test the suspects one at a time in the "
             f"playbook's order ({' → '.join(ctx.playbook.order())}).")
    ctx.say(text)
    return {"hyps": {h: {"status": "pending", "because": [], "how": None, "share": None, "findings": [],
                         "experiments": [], "results": []} for h in ctx.playbook.order()},
            "done": [], "notes": [], "bench_runs": 0, "current": None}


def discover(ctx: Ctx, s: State) -> State:
    d = find_host_server(ctx.runner(None), run_input(ctx.overrides, ctx.symptom.metric))
    for line in narrate(d):
        ctx.say(line)
    state = state_of(d)
    check_benchmark(ctx, state)
    return {"discovered": state}


def probe(ctx: Ctx, s: State) -> State:
    d = s["discovered"]
    r = ctx.runner(None)
    facts = HostFacts.model_validate(d["host_facts"]) if d.get("host_facts") else None
    server = ServerInfo.model_validate(d["server"]) if d.get("server") else None
    ctx.say("Gathering the cheap read-only evidence in one concurrent pass: GPU state (read while the benchmark runs, "
            "since idle GPUs show low clocks and PCIe gen 1), driver, GPU tenants, packages with hashes of their "
            "compiled files, and git state.")
    snap = collect(r, bench=_bench(ctx, d), python=d.get("python"), repo=d.get("repo"), known=(facts, server),
                   metric=d.get("metric"))
    regression: dict[str, Any] = {}
    runs = 0
    if _bench(ctx, d):
        n_runs = int(ctx.overrides.get("reproduce_runs") or REPRODUCE_RUNS)
        ctx.say(f"Reproducing first: {n_runs} runs of the benchmark as the host is now.")
        vals = []
        for i in range(n_runs):
            o = r.call("bench", {"cmd": _bench(ctx, d), "metric": d["metric"], "cwd": d.get("repo"),
                                 "regex": ctx.overrides.get("bench_regex")}, why=f"reproduce, run {i + 1} of {n_runs}")
            runs += 1
            if o.ok:
                vals.append(o.output.value)
                unit = o.output.unit
        baseline_value, source = None, ""
        if ctx.baseline is not None:
            baseline_value, source = ctx.baseline.in_unit(unit or ctx.baseline.unit) if vals else ctx.baseline.value, ctx.baseline.text
        elif ctx.baseline_snapshot and ctx.baseline_snapshot.bench.get("samples"):
            bs = ctx.baseline_snapshot.bench["samples"]
            baseline_value, source = statistics.fmean(bs), f"the baseline snapshot's {len(bs)} runs"
        if len(vals) >= 2 and baseline_value is not None:
            real, delta, why = regression_is_real(vals, baseline_value, ctx.symptom.direction == "lower")
            regression = {"measured": True, "samples": vals, "mean": statistics.fmean(vals), "baseline": baseline_value,
                          "baseline_source": source, "real": real, "delta": delta, "why": why}
            ctx.say(("The regression is real: " if real else "No reproducible regression: ") + why + ".")
        elif vals:
            regression = {"measured": False, "samples": vals, "mean": statistics.fmean(vals), "real": True,
                          "why": "no baseline number to compare with"}
            ctx.say(f"Measured {statistics.fmean(vals):.4g} over {len(vals)} runs; no baseline number to compare with, "
                    "so the user's report is taken as the regression.")
        else:
            ctx.say("The benchmark failed every time; experiments cannot be measured.")
            regression = {"measured": False, "real": True, "why": "the benchmark failed"}
    return {"snapshot": snap.model_dump(mode="json"), "regression": regression, "bench_runs": runs}


def _bench(ctx: Ctx, d: dict[str, Any]) -> str | None:
    """The benchmark command: ``--bench`` wins (a resumed run gets it again, since the saved state is redacted)."""
    bench = ctx.overrides.get("bench") or d.get("bench")
    if bench and "[REDACTED]" in bench:
        raise UsageError("the benchmark command held a secret, so the saved run does not have it",
                         fix="give it again: debugagent resume RUN --bench '…'")
    return bench


def _facts(ctx: Ctx, s: State) -> dict[str, Any]:
    # redacted as a saved baseline snapshot and the checkpointed state are, so they compare alike
    snap = Snapshot.model_validate(redact(s["snapshot"]))
    f = build_facts(snap, baseline=ctx.baseline_snapshot, regression=s.get("regression"),
                    knowledge=ctx.playbook.knowledge, symptom=ctx.symptom.model_dump())
    f["_bench_cwd"] = s["discovered"].get("repo")
    server = f.get("server") or {}
    pk = f.get("packages") or {}
    top = (server.get("entry") or "").split(".")[0]
    f["server_editable"] = any(p.get("editable") and top in (p.get("modules") or [p["name"]]) for p in pk.values())
    f["server_package"] = next((f"{p['name']} {p['version']}" for p in pk.values() if top and top in (p.get("modules") or [])), top)
    return f


def evaluate_node(ctx: Ctx, s: State) -> State:
    hyps = {k: dict(v) for k, v in s["hyps"].items()}
    cur = s.get("current")
    if cur and cur.get("result") is not None:
        h = hyps[cur["hyp"]]
        res = cur["result"]
        h["results"] = h["results"] + [res]
        h["experiments"] = [e for e in h["experiments"] if e != cur["spec"]]
        if res.get("error"):
            h["because"] = h["because"] + [f"experiment failed: {res['error']}"]
        elif res["significant"]:
            h["status"], h["how"] = "confirmed", "experiment"
            h["share"] = round((h.get("share") or 0) + res["share"], 3)
            h["because"] = h["because"] + [res["text"]]
            if res.get("culprit"):
                h["culprit"] = res["culprit"]
        else:
            h["because"] = h["because"] + [res["text"]]
            untested = [f for f in h["findings"] if f["verdict"] == "suspect" and not f.get("experiment")]
            if h["status"] == "suspect" and not h["experiments"] and not untested:
                h["status"], h["how"] = "ruled_out", "experiment"
        ctx.transcript.emit("verdict", hypothesis=cur["hyp"], status=h["status"], how=h["how"],
                            because=h["because"][-1], share=h.get("share"))
        ctx.on_status("verdict", {"hypothesis": cur["hyp"], "status": h["status"]})
        return {"hyps": hyps, "current": None, "done": s["done"] + [exp_key(cur["hyp"], cur["spec"])]}
    facts = _facts(ctx, s)
    for hid in ctx.playbook.order():
        hp = ctx.playbook.get(hid)
        findings = evaluate(hp, facts, ctx.playbook.source)
        strong = [f for f in findings if f.verdict in ("suspect", "confirmed")]
        h = hyps[hid]
        if strong:
            status = "confirmed" if any(f.verdict == "confirmed" for f in strong) else "suspect"
            h.update(status=status, how="evidence" if status == "confirmed" else None,
                     because=[f.because for f in strong], findings=[f.model_dump() for f in strong],
                     experiments=[f.experiment for f in strong if f.experiment])
        else:
            f = findings[0]
            h.update(status=f.verdict, how="evidence" if f.verdict == "ruled_out" else None, because=[f.because],
                     findings=[f.model_dump()], experiments=[])
        ctx.transcript.emit("hypothesis_opened", hypothesis=hid, title=hp.title, checks=list(hp.checks))
        ctx.transcript.emit("verdict", hypothesis=hid, status=h["status"], how=h["how"], because="; ".join(h["because"]))
        ctx.on_status("verdict", {"hypothesis": hid, "status": h["status"]})
    return {"hyps": hyps, "facts": _jsonable(facts)}


def exp_key(hid: str, spec: dict[str, Any]) -> str:
    """One experiment's identity: a hypothesis can hold several of the same kind (one per flag)."""
    return f"{hid}:{spec['kind']}:{spec.get('title', '')}"


def _explained(hyps: dict[str, dict[str, Any]]) -> float:
    return sum(h.get("share") or 0 for h in hyps.values() if h["status"] == "confirmed")


def plan(ctx: Ctx, s: State) -> State:
    hyps = s["hyps"]
    reg = s.get("regression") or {}
    notes = list(s.get("notes") or [])
    if not s["discovered"].get("bench") or not reg.get("samples"):
        return {"current": None}
    if _explained(hyps) >= EXPLAINED_ENOUGH:
        ctx.say(f"The confirmed causes explain {_explained(hyps):.0%} of the regression; no further experiment is needed.")
        return {"current": None}
    candidates = [(hid, e) for hid in ctx.playbook.order() for e in hyps[hid]["experiments"]
                  if hyps[hid]["status"] in ("suspect", "confirmed") and exp_key(hid, e) not in s["done"]
                  and not (hyps[hid]["status"] == "confirmed" and hyps[hid]["how"] == "experiment")]
    if not candidates:
        return {"current": None}
    if ctx.advisor is not None and len(candidates) > 1:
        candidates = ctx.advisor.order(candidates, s.get("facts") or {}, hyps, ctx.transcript)
    hyps = {k: dict(v) for k, v in hyps.items()}
    done = list(s["done"])
    for hid, spec in candidates:
        title = spec.get("title") or spec["kind"]
        if ctx.allow_mutations or (ctx.confirm is not None and ctx.confirm(f"{title} (to test {hid}; undone afterwards)")):
            ctx.say(f"Next: {title}, to test {hid} ({hyps[hid]['because'][0]}).", hid)
            return {"current": {"hyp": hid, "spec": spec, "result": None}, "hyps": hyps, "done": done, "notes": notes}
        note = f"{hid}: experiment \"{title}\" not run (it changes the host: give --allow-mutations or answer yes)"
        ctx.say(note, hid)
        notes.append(note)
        hyps[hid]["experiments"] = [e for e in hyps[hid]["experiments"] if e != spec]
        done.append(exp_key(hid, spec))
    return {"current": None, "hyps": hyps, "done": done, "notes": notes}


def experiment(ctx: Ctx, s: State) -> State:
    cur = dict(s["current"] or {})
    hid, spec = cur["hyp"], cur["spec"]
    reg = s["regression"]
    facts = s.get("facts") or _facts(ctx, s)
    d = s["discovered"]
    regression = abs(reg.get("delta") or 0) or abs(reg["mean"] - (reg.get("baseline") or reg["mean"])) or 1e-9
    lab = Lab(ctx.runner, lambda ev, **kw: ctx.transcript.emit(ev, hypothesis=hid, **kw), ctx.undo,
              Measure(bench=_bench(ctx, d), metric=d["metric"], cwd=d.get("repo"), regex=ctx.overrides.get("bench_regex"),
                      ready_timeout_s=float(ctx.overrides.get("ready_timeout_s") or 600),
                      max_runs=int(ctx.overrides.get("max_runs") or 8)),
              ctx.run_id, ctx.symptom.direction == "lower",
              LabSetup.from_inputs(ctx.overrides, (d.get("host_facts") or {}).get("profile")))
    lab.discovery = run_input(ctx.overrides, d["metric"], d.get("server"))
    ctx.transcript.emit("experiment", hypothesis=hid, phase="start", text=spec.get("title") or spec["kind"], spec=spec)
    retried = cur.get("retried", 0)
    while True:
        try:
            result = lab.run(hid, spec, facts, reg["samples"], regression)
        except ConnectionLost as exc:
            ctx.say(str(exc), hid)
            if retried < 2:
                retried += 1
                continue
            result = {"kind": spec["kind"], "error": str(exc), "significant": False, "share": 0.0, "text": str(exc)}
        except ExperimentError as exc:
            result = {"kind": spec["kind"], "error": str(exc), "significant": False, "share": 0.0, "text": str(exc)}
        break
    ctx.transcript.emit("experiment", hypothesis=hid, phase="result", text=result["text"],
                        share=result.get("share"), significant=result.get("significant"))
    cur["result"] = result
    return {"current": cur, "bench_runs": s.get("bench_runs", 0) + lab.bench_runs}


def conclude(ctx: Ctx, s: State) -> State:
    hyps = {k: dict(v) for k, v in s["hyps"].items()}
    reg = s.get("regression") or {}
    order = ctx.playbook.order()
    no_regression = bool(reg.get("measured") and not reg.get("real"))
    if not no_regression:
        # elimination: one untestable suspect left while everything else is ruled out or confirmed
        open_ = [h for h in order if hyps[h]["status"] in ("suspect", "inconclusive", "pending")]
        suspects = [h for h in open_ if hyps[h]["status"] == "suspect"]
        explained = _explained(hyps)
        unknown_share = any(hyps[h]["status"] == "confirmed" and hyps[h].get("share") is None for h in order)
        if len(suspects) == 1 and len(open_) == 1 and explained < EXPLAINED_ENOUGH and not unknown_share:
            h = hyps[suspects[0]]
            h["status"], h["how"] = "confirmed", "elimination"
            if reg.get("measured"):
                h["share"] = round(max(0.0, 1.0 - explained), 3)
            h["because"] = h["because"] + ["every other hypothesis was ruled out"]
            ctx.transcript.emit("verdict", hypothesis=suspects[0], status="confirmed", how="elimination",
                                because="every other hypothesis was ruled out; " + "; ".join(h["because"][:-1]))
        unshared = [h for h in order if hyps[h]["status"] == "confirmed" and hyps[h].get("share") is None]
        if unshared and reg.get("measured"):
            rest = max(0.0, 1.0 - _explained(hyps))
            for hid in unshared:
                hyps[hid]["share"] = round(rest / len(unshared), 3)
    causes = []
    if not no_regression:
        for hid in order:
            h = hyps[hid]
            if h["status"] == "confirmed":
                summary = h["because"][0] if h["how"] != "experiment" else next(
                    (b for b in h["because"] if "recovers" in b or "first bad commit" in b), h["because"][-1])
                if h.get("culprit"):
                    c = h["culprit"]
                    summary = f"commit {c['short']} \"{c['subject']}\" ({c['sha'][:12]}): " + summary
                fix = next((x["fix"] for x in h.get("results") or [] if x.get("significant") and x.get("fix")), None)
                causes.append({"hypothesis": hid, "summary": summary, "evidence": h["because"], "how": h["how"],
                               "explains": h.get("share"), **({"fix": fix} if fix else {})})
        causes.sort(key=lambda c: -(c["explains"] or 0))
    suspects = [] if no_regression else [{"hypothesis": h, "because": "; ".join(hyps[h]["because"])}
                                          for h in order if hyps[h]["status"] == "suspect"]
    ruled = [{"hypothesis": h, "because": "; ".join(hyps[h]["because"])} for h in order if hyps[h]["status"] == "ruled_out"]
    if no_regression:
        summary = f"No reproducible regression: {reg.get('why')}. Nothing is blamed."
    elif causes:
        parts = [f"{c['hypothesis']} ({'explains ' + format(c['explains'], '.0%') if c['explains'] is not None else 'share unknown'}, "
                 f"by {c['how']}): {c['summary']}" for c in causes]
        summary = "Root cause" + ("s" if len(causes) > 1 else "") + ": " + " | ".join(parts)
    else:
        undecided = [h for h in order if hyps[h]["status"] == "inconclusive"]
        summary = "The tree is exhausted without a confirmed root cause." + (
            f" Suspects: {', '.join(x['hypothesis'] for x in suspects)}." if suspects else "") + (
            " Could not decide: " + "; ".join(f"{h} ({hyps[h]['because'][0]})" for h in undecided) + "."
            if undecided else "")
    exit_code = 0 if causes else 3
    table = [{"id": h, "status": hyps[h]["status"], "how": hyps[h]["how"], "because": hyps[h]["because"],
              "share": hyps[h].get("share")} for h in order]
    commands = ctx.commands
    conclusion = {"root_cause": causes[0] if causes else None, "root_causes": causes, "suspects": suspects,
                  "ruled_out": ruled, "commands": commands, "bench_runs": s.get("bench_runs", 0), "summary": summary,
                  "exit_code": exit_code, "regression": {k: v for k, v in reg.items() if k != "samples"},
                  "notes": s.get("notes") or [], "table": table}
    ctx.transcript.emit("conclusion", **conclusion)
    return {"conclusion": conclusion, "hyps": hyps}


def report(ctx: Ctx, s: State) -> State:
    from .report import write_report
    from .transcript import write_markdown
    write_markdown(ctx.transcript.folder)
    write_report(ctx.transcript.folder)
    return {}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v
