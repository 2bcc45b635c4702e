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
from tools.snapshot import OPTIONAL_PROBES, Snapshot, collect
from tools.transport import BaseTransport

from . import conclusion as concl
from . import verdicts as vd
from .discovery import discover as find_host_server
from .discovery import narrate, run_input, state_of
from .experiments import ConnectionLost, ExperimentError, Lab, LabSetup, Measure
from .facts import build_facts
from .journal import Journal
from .playbook import Playbook, evaluate
from .preflight import check_benchmark
from .stats import fresh_reference_runs, reproduce, share_interval
from .symptom import Symptom
from .transcript import Transcript

RECURSION_LIMIT = 200
REPRODUCE_RUNS = 8      # the most; the reproduce step stops at 3 when the answer is clear
REPRODUCE_FIRST = 3


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


def _gathering(probes: set[str]) -> str:
    """What the probe step says it collects: every probe, or those the playbook's checks name."""
    left_out = [t for t in OPTIONAL_PROBES if t not in probes]
    if not left_out:
        return ("Gathering the cheap read-only evidence in one concurrent pass: GPU state (read while the benchmark "
                "runs, since idle GPUs show low clocks and PCIe gen 1), driver, GPU tenants, packages with hashes of "
                "their compiled files, and git state.")
    return (f"Gathering the read-only evidence the playbook's checks name in one concurrent pass "
            f"({', '.join(sorted(probes))}); left out, since no hypothesis checks them: {', '.join(left_out)}.")


def probe(ctx: Ctx, s: State) -> State:
    d = s["discovered"]
    r = ctx.runner(None)
    facts = HostFacts.model_validate(d["host_facts"]) if d.get("host_facts") else None
    server = ServerInfo.model_validate(d["server"]) if d.get("server") else None
    probes = ctx.playbook.probes()
    ctx.say(_gathering(probes))
    snap = collect(r, bench=_bench(ctx, d), python=d.get("python"), repo=d.get("repo"), known=(facts, server),
                   metric=d.get("metric"), probes=probes)
    regression, runs = (_reproduce(ctx, d) if _bench(ctx, d) else ({}, 0))
    return {"snapshot": snap.model_dump(mode="json"), "regression": regression, "bench_runs": runs}


def _baseline_for(ctx: Ctx, unit: str | None) -> tuple[float | None, list[float], str]:
    if ctx.baseline is not None:
        return ctx.baseline.in_unit(unit or ctx.baseline.unit), [], ctx.baseline.text
    bs = ctx.baseline_snapshot.bench.get("samples") if ctx.baseline_snapshot else None
    if bs:
        return statistics.fmean(bs), list(bs), f"the baseline snapshot's {len(bs)} runs"
    return None, [], ""


def _reproduce(ctx: Ctx, d: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Sequential: 3 runs, then one more while undecided, up to --reproduce-runs."""
    r = ctx.runner(None)
    most = max(2, int(ctx.overrides.get("reproduce_runs") or REPRODUCE_RUNS))
    ctx.say(f"Reproducing first: {min(REPRODUCE_FIRST, most)} runs of the benchmark as the host is now, more while "
            f"the answer is not clear (at most {most}).")
    vals: list[float] = []
    unit, runs, rep = None, 0, None
    while runs < most:
        o = r.call("bench", {"cmd": _bench(ctx, d), "metric": d["metric"], "cwd": d.get("repo"),
                             "regex": ctx.overrides.get("bench_regex")}, why=f"reproduce, run {runs + 1}")
        runs += 1
        if o.ok:
            vals.append(o.output.value)
            unit = o.output.unit or unit
        base, base_samples, source = _baseline_for(ctx, unit)
        if base is None or len(vals) < min(REPRODUCE_FIRST, most):
            continue
        claimed = ctx.symptom.worse(ctx.symptom.in_unit(unit or ctx.symptom.unit), base)
        rep = reproduce(vals, base, ctx.symptom.direction == "lower", claimed, baseline_samples=base_samples,
                        final=runs >= most)
        if rep.outcome != "more":
            break
    if not vals:
        ctx.say("The benchmark failed every time; experiments cannot be measured.")
        return {"measured": False, "real": True, "why": "the benchmark failed"}, runs
    if rep is None:
        ctx.say(f"Measured {statistics.fmean(vals):.4g} over {len(vals)} runs; no baseline number to compare with, "
                "so the user's report is taken as the regression and no share can be measured.")
        return {"measured": False, "samples": vals, "mean": statistics.fmean(vals), "real": True,
                "why": "no baseline number to compare with"}, runs
    real = rep.outcome == "regression"
    reg = {"measured": True, "samples": vals, "mean": rep.mean, "baseline": base, "baseline_source": source,
           "real": real, "delta": rep.delta, "delta_se": rep.delta_se, "sd": rep.sd, "why": rep.text,
           "outcome": rep.outcome, "runs_needed": rep.runs_needed}
    lead = {"regression": "The regression is real: ", "none": "No reproducible regression: ",
            "better": "Better than the baseline, not worse (swapped?): ",
            "more": f"Undecided after {len(vals)} runs (run with --reproduce-runs {rep.runs_needed}): "}[rep.outcome]
    ctx.say(lead + rep.text + ".")
    return reg, runs


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
                    knowledge=ctx.playbook.knowledge, symptom=ctx.symptom.model_dump(), group=ctx.playbook.group)
    f["_bench_cwd"] = s["discovered"].get("repo")
    server = f.get("server") or {}
    pk = f.get("packages") or {}
    top = (server.get("entry") or "").split(".")[0]
    f["server_editable"] = any(p.get("editable") and top in (p.get("modules") or [p["name"]]) for p in pk.values())
    f["server_package"] = next((f"{p['name']} {p['version']}" for p in pk.values() if top and top in (p.get("modules") or [])), top)
    f["not_judged"] = vd.not_judged(f.get("server"), ctx.playbook.knowledge).model_dump()
    f["install_times_distinct"] = len({p.get("installed_at") for p in pk.values()
                                       if p.get("installed_at") and not p.get("editable")})
    return f


def evaluate_node(ctx: Ctx, s: State) -> State:
    """Apply an experiment's result, or (first time) every hypothesis' rules; the logic is in ``verdicts``."""
    hyps = {k: vd.Hyp.model_validate(v) for k, v in s["hyps"].items()}
    cur = s.get("current")
    if cur and cur.get("result") is not None:
        hid, spec, res = cur["hyp"], cur["spec"], cur["result"]
        h = vd.apply_result(hyps[hid], spec, res)
        h.experiments += vd.split_group(hid, spec, res)
        hyps[hid] = h
        _emit_verdict(ctx, hid, h, h.because[-1])
        return {"hyps": _dump(hyps), "current": None, "done": s["done"] + [exp_key(hid, spec)]}
    facts = _facts(ctx, s)
    steps = ctx.playbook.knowledge.get("next_steps") or {}
    for hid in ctx.playbook.order():
        hp = ctx.playbook.get(hid)
        hyps[hid] = vd.from_findings(evaluate(hp, facts, ctx.playbook.source), steps.get(hid))
        ctx.transcript.emit("hypothesis_opened", hypothesis=hid, title=hp.title, checks=list(hp.checks))
        _emit_verdict(ctx, hid, hyps[hid], "; ".join(hyps[hid].because))
    return {"hyps": _dump(hyps), "facts": _jsonable(facts)}


def _emit_verdict(ctx: Ctx, hid: str, h: vd.Hyp, because: str) -> None:
    ctx.transcript.emit("verdict", hypothesis=hid, status=h.status, how=h.how, because=because, share=h.share,
                        share_ci=list(h.share_ci) if h.share_ci else None, next=h.next)
    ctx.on_status("verdict", {"hypothesis": hid, "status": h.status})


def _dump(hyps: dict[str, vd.Hyp]) -> dict[str, dict[str, Any]]:
    return {k: h.model_dump(mode="json") for k, h in hyps.items()}


def exp_key(hid: str, spec: dict[str, Any]) -> str:
    """One experiment's identity: a hypothesis can hold several of the same kind (one per flag)."""
    return f"{hid}:{spec['kind']}:{spec.get('title', '')}"


def plan(ctx: Ctx, s: State) -> State:
    """The next experiment by expected value (``verdicts.order_experiments``); not-judged values in groups last."""
    hyps = {k: vd.Hyp.model_validate(v) for k, v in s["hyps"].items()}
    reg = s.get("regression") or {}
    notes, done = list(s.get("notes") or []), list(s["done"])
    if not s["discovered"].get("bench") or not reg.get("samples"):
        return {"current": None}
    cands = _candidates(ctx, s, hyps)
    if vd.explains_enough(hyps):
        cands = [c for c in cands if c[1].get("group")]   # a group that recovered is still split to name its culprit
        if not cands:
            total, ci = vd.explained(hyps)
            ctx.say(f"The confirmed causes explain {total:.0%} of the regression"
                    + (f" (95% CI {ci[0]:.0%} to {ci[1]:.0%})" if ci else "") + "; no further experiment is needed.")
            return {"current": None}
    elif not cands and _add_groups(ctx, s, hyps):
        cands = _candidates(ctx, s, hyps)
    if ctx.advisor is not None and len(cands) > 1:
        cands = ctx.advisor.order(cands, s.get("facts") or {}, _dump(hyps), ctx.transcript)
    for hid, spec in cands:
        title = spec.get("title") or spec["kind"]
        if ctx.allow_mutations or (ctx.confirm is not None and ctx.confirm(f"{title} (to test {hid}; undone afterwards)")):
            ctx.say(f"Next: {title}, to test {hid} ({hyps[hid].because[0]}).", hid)
            return {"current": {"hyp": hid, "spec": spec, "result": None}, "hyps": _dump(hyps), "done": done, "notes": notes}
        note = f"{hid}: experiment \"{title}\" not run (it changes the host: give --allow-mutations or answer yes)"
        ctx.say(note, hid)
        notes.append(note)
        hyps[hid].experiments = [e for e in hyps[hid].experiments if e != spec]
        hyps[hid].next = hyps[hid].next or f"run \"{title}\" (give --allow-mutations)"
        done.append(exp_key(hid, spec))
    return {"current": None, "hyps": _dump(hyps), "done": done, "notes": notes}


def _candidates(ctx: Ctx, s: State, hyps: dict[str, vd.Hyp]) -> list[tuple[str, dict[str, Any]]]:
    order = ctx.playbook.order()
    cands = [(hid, e) for hid in order for e in hyps[hid].experiments
             if hyps[hid].status in ("suspect", "confirmed", "inconclusive") and exp_key(hid, e) not in s["done"]
             and not (hyps[hid].status == "confirmed" and hyps[hid].how == "experiment" and not e.get("group"))]
    base_head = ctx.baseline_snapshot.repo.head if ctx.baseline_snapshot and ctx.baseline_snapshot.repo else None
    return vd.order_experiments(cands, order, {h.id: h.cost for h in ctx.playbook.hypotheses}, base_head)


def _add_groups(ctx: Ctx, s: State, hyps: dict[str, vd.Hyp]) -> bool:
    """The known suspects do not explain the regression: test the not-judged flags and variables, in groups."""
    nj = vd.NotJudged.model_validate((s.get("facts") or {}).get("not_judged") or {})
    added = False
    for hid, items in (("serving_config", nj.flags), ("env_var", nj.env)):
        if items and hid in hyps and not hyps[hid].groups_tried and ctx.baseline_snapshot is None:
            hyps[hid].groups_tried = True
            hyps[hid].experiments.append(vd.group_experiment(hid, items))
            ctx.say(f"The known suspects do not explain the regression; testing what no knowledge list judges, as a "
                    f"group: {', '.join(items)} (split like a bisection if it recovers).", hid)
            added = True
    return added


def experiment(ctx: Ctx, s: State) -> State:
    cur = dict(s["current"] or {})
    hid, spec = cur["hyp"], cur["spec"]
    reg = s["regression"]
    facts = s.get("facts") or _facts(ctx, s)
    d = s["discovered"]
    regression = reg["delta"] if reg.get("measured") and (reg.get("delta") or 0) > 0 else None
    max_runs = int(ctx.overrides.get("max_runs") or 0)
    # re-measure the reference just before the change (a benchmark run in a worktree also re-measures it between its runs)
    fresh = fresh_reference_runs(reg)  # also for a code revert that restarts the server: the reference is gone then
    fresh = min(fresh, max_runs - 2) if max_runs else fresh
    lab = Lab(ctx.runner, lambda ev, **kw: ctx.transcript.emit(ev, hypothesis=hid, **kw), ctx.undo,
              Measure(bench=_bench(ctx, d), metric=d["metric"], cwd=d.get("repo"), regex=ctx.overrides.get("bench_regex"),
                      ready_timeout_s=float(ctx.overrides.get("ready_timeout_s") or 600),
                      max_runs=max(2, max_runs - fresh) if max_runs else 0),
              ctx.run_id, ctx.symptom.direction == "lower",
              LabSetup.from_inputs(ctx.overrides, (d.get("host_facts") or {}).get("profile")))
    lab.discovery = run_input(ctx.overrides, d["metric"], d.get("server"))
    reference = list(reg["samples"])
    for _ in range(fresh):
        v = lab.bench(ctx.runner(hid), d.get("repo"), "the reference state, re-measured before the change")
        reference += [v] if v is not None else []
    lab.fresh_runs = len(reference) - len(reg["samples"])
    ctx.transcript.emit("experiment", hypothesis=hid, phase="start", text=spec.get("title") or spec["kind"], spec=spec)
    retried = cur.get("retried", 0)
    while True:
        try:
            result = lab.run(hid, spec, facts, reference, regression)
            result.update(_decision_fields(lab, reg, regression))
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


def _decision_fields(lab: Lab, reg: dict[str, Any], regression: float | None) -> dict[str, Any]:
    """The three-way outcome and the share's interval (with the regression's own uncertainty)."""
    d = getattr(lab, "last_decision", None)
    if d is None:
        return {}
    out: dict[str, Any] = {"outcome": d.outcome, "improvement": d.improvement, "share_ci": None, "share_se": None}
    if regression:
        share, lo, hi = share_interval(d.improvement, d.improvement_se, d.df, regression, reg.get("delta_se") or 0.0)
        out.update(share=round(share, 3), share_ci=[round(lo, 3), round(hi, 3)], share_se=(hi - share) / 1.96)
    return out


def conclude(ctx: Ctx, s: State) -> State:
    """The verdicts as a conclusion (``conclusion.conclude``), with the run's counts."""
    hyps = {k: vd.Hyp.model_validate(v) for k, v in s["hyps"].items()}
    reg = s.get("regression") or {}
    order = ctx.playbook.order()
    c = concl.conclude(hyps, order, reg, baseline_snapshot=ctx.baseline_snapshot is not None,
                       next_steps=ctx.playbook.knowledge.get("next_steps") or {},
                       not_judged=vd.NotJudged.model_validate((s.get("facts") or {}).get("not_judged") or {}))
    table = [{"id": h, "status": hyps[h].status, "how": hyps[h].how, "because": hyps[h].because,
              "share": hyps[h].share, "share_ci": hyps[h].share_ci, "next": hyps[h].next} for h in order]
    conclusion = {**c.to_json(), "commands": ctx.commands, "bench_runs": s.get("bench_runs", 0),
                  "regression": {k: v for k, v in reg.items() if k != "samples"}, "notes": s.get("notes") or [],
                  "table": _jsonable(table)}
    ctx.transcript.emit("conclusion", **conclusion)
    return {"conclusion": conclusion}


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
