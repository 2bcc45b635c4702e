"""The I/O steps the graph's nodes call: each reads the host (or changes it, in an experiment)
through ``Ctx``'s runners and returns typed values; the logic they apply is in the pure
modules (``stats``, ``verdicts``, ``conclusion``, ``facts``)."""

from __future__ import annotations

import json
import statistics
from typing import Any

from debugagent.tools.errors import UsageError
from debugagent.tools.host import HostFacts, ServerInfo
from debugagent.tools.redact import REDACTOR, redact
from debugagent.tools.registry import Runner
from debugagent.tools.snapshot import OPTIONAL_PROBES, Snapshot, collect
from debugagent.tools.units import plain
from debugagent.tools.workload import is_workload

from . import verdicts as vd
from .context import Ctx
from .discovery import run_input
from .facts import LabFacts, build_facts
from .lab import ConnectionLost, ExperimentError, Lab, LabSetup, Measure, kind_of, shadow
from .lab.lab import PeerReader
from .lab.shadow import server_bench
from .results import LEAD, ExperimentResult, Regression
from .state import Current, RunState
from .stats import Reproduction, fresh_reference_runs, more_runs_advice, pct, reproduce, share_interval

REPRODUCE_FIRST = 3
RETRIES = 2   # an experiment whose connection was lost runs again, this many times


# ---------------------------------------------------------------- words
def intro(ctx: Ctx) -> str:
    """What the user reported, and the plan."""
    sym, base = ctx.symptom, ctx.baseline
    text = f"The user reports {sym.text}"
    if base:
        text += f" against a baseline of {base.text}"
    elif ctx.baseline_snapshot:
        text += f" against the baseline snapshot of {ctx.baseline_snapshot.host} ({ctx.baseline_snapshot.taken_at})"
    return text + (f" ({'lower' if sym.direction == 'lower' else 'higher'} is better). The plan: find the server, "
                   f"reproduce the regression, gather cheap read-only evidence in one pass, then test the suspects one "
                   f"at a time in the playbook's order ({' → '.join(ctx.playbook.order())}).")


def bench_of(ctx: Ctx, d: dict[str, Any]) -> str | None:
    """The benchmark command: ``--bench`` wins (a resumed run gets it again, since the saved state is redacted)."""
    bench = ctx.overrides.bench or d.get("bench")
    if bench and "[REDACTED]" in bench:
        raise UsageError("the benchmark command held a secret, so the saved run does not have it",
                         fix="give it again: debugagent resume RUN --bench '…'")
    return server_bench(bench, d.get("server"))   # `{port}`: the server's own port


# ---------------------------------------------------------------- probe
def snapshot(ctx: Ctx, d: dict[str, Any]) -> Snapshot:
    """The cheap read-only evidence, in one concurrent pass (GPUs read while the benchmark runs)."""
    facts = HostFacts.model_validate(d["host_facts"]) if d.get("host_facts") else None
    server = ServerInfo.model_validate(d["server"]) if d.get("server") else None
    probes = ctx.playbook.probes()
    ctx.say(gathering(probes))
    return collect(ctx.runner(None), bench=bench_of(ctx, d), python=d.get("python"), repo=d.get("repo"),
                   known=(facts, server), metric=d.get("metric"), probes=probes)


def gathering(probes: set[str]) -> str:
    """What the probe step says it collects: every probe, or those the playbook's checks name."""
    left_out = [t for t in OPTIONAL_PROBES if t not in probes]
    if not left_out:
        return ("Gathering the cheap read-only evidence in one concurrent pass: GPU state (read while the benchmark "
                "runs, since idle GPUs show low clocks and PCIe gen 1), driver, GPU tenants, packages with hashes of "
                "their compiled files, and git state.")
    return (f"Gathering the read-only evidence the playbook's checks name in one concurrent pass "
            f"({', '.join(sorted(probes))}); left out, since no hypothesis checks them: {', '.join(left_out)}.")


def _baseline_for(ctx: Ctx, unit: str | None) -> tuple[float | None, list[float], str]:
    if ctx.baseline is not None:
        return ctx.baseline.in_unit(unit or ctx.baseline.unit), [], ctx.baseline.text
    bs = ctx.baseline_snapshot.bench.get("samples") if ctx.baseline_snapshot else None
    if bs:
        return statistics.fmean(bs), list(bs), f"the baseline snapshot's {len(bs)} runs"
    return None, [], ""


def reproduce_regression(ctx: Ctx, d: dict[str, Any]) -> tuple[Regression, int]:
    """Sequential: 3 runs (2 when the baseline snapshot's runs estimate the noise too), then one more while
    undecided, up to --reproduce-runs."""
    if not bench_of(ctx, d):
        if ctx.peer is not None:
            ctx.peer.close()
        return Regression(), 0
    r = ctx.runner(None)
    most = ctx.overrides.most_reproduce_runs
    first = d.get("first_run")
    if ctx.peer is not None and not ctx.peer.closed:
        try:
            return reproduce_with_peer(ctx, d, first, most)
        finally:
            ctx.peer.close()
    # the baseline snapshot's runs (two or more) are the baseline: they estimate the noise too, so one run fewer;
    # --min-reproduce-runs more (they are the reference state of every experiment that restarts the server)
    looks = min(max(REPRODUCE_FIRST - len(baseline_noise(ctx)), ctx.overrides.min_reproduce_runs or 0), most)
    ctx.say(f"Reproducing first: {looks} runs of the benchmark as the host is now"
            + (" (the check's run is the first)" if first else "") + f", more while the answer is not clear (at most {most}).")
    vals: list[float] = [first["value"]] if first else []
    unit, runs, rep = (first["unit"] if first else None), len(vals), None
    base, source = None, ""
    while True:
        base, base_samples, source = _baseline_for(ctx, unit)
        if base is not None and len(vals) >= looks:
            claimed = ctx.symptom.worse(ctx.symptom.in_unit(unit or ctx.symptom.unit), base)
            rep = reproduce(vals, base, ctx.symptom.direction == "lower", claimed, baseline_samples=base_samples,
                            final=runs >= most, most=most)
            if rep.outcome != "more":
                break
        if runs >= most:
            break
        o = r.call("bench", {"cmd": bench_of(ctx, d), "metric": d["metric"], "cwd": d.get("repo"),
                             "regex": ctx.overrides.bench_regex}, why=f"reproduce, run {runs + 1}")
        runs += 1
        if o.ok:
            vals.append(o.output.value)
            unit = o.output.unit or unit
    reg = regression_of(vals, rep, base, source)
    ctx.say(reproduce_words(reg, rep, len(vals)))
    return reg, runs


PEER_LEAST = 2   # runs of each side before the first test: the peer's runs are the baseline and its noise


def reproduce_with_peer(ctx: Ctx, d: dict[str, Any], first: dict[str, Any] | None, most: int) -> tuple[Regression, int]:
    """``--peer``: the peer's benchmark runs alternate with the host's (the check's run, then peer, host, peer,
    host, …), so a load that changes during the run shows on both sides; the peer's runs are the baseline and its
    noise. The peer is only read; its connection is closed when this returns, before any experiment."""
    assert ctx.peer is not None
    peer, r, pr = ctx.peer, ctx.runner(None), ctx.peer_runner()
    ctx.say(f"Reproducing against the peer {peer.name}, measured now: its benchmark runs alternate with the host's "
            f"(peer, host, peer, host, …{'; the check’s run is the host’s first' if first else ''}), so a load that "
            f"changes during the run shows on both; at least {PEER_LEAST} of each, more while the answer is not clear "
            f"(at most {most} of the host's). The peer is only read, and its connection is closed before any experiment.")
    vals: list[float] = [first["value"]] if first else []
    peer_vals: list[float] = []
    unit, runs, rep, order = (first["unit"] if first else None), len(vals), None, (["host"] if first else [])
    peer_failed = 0
    least = max(PEER_LEAST, ctx.overrides.min_reproduce_runs or 0)
    while True:
        if len(peer_vals) >= PEER_LEAST and len(vals) >= least:
            base = statistics.fmean(peer_vals)
            claimed = ctx.symptom.worse(ctx.symptom.in_unit(unit or ctx.symptom.unit), base)
            rep = reproduce(vals, base, ctx.symptom.direction == "lower", claimed, baseline_samples=peer_vals,
                            final=runs >= most, most=most)
            if rep.outcome != "more":
                break
        if runs >= most or peer_failed >= PEER_LEAST and not peer_vals:
            break
        p = pr.call("bench", {"cmd": peer.bench, "metric": peer.metric, "cwd": peer.cwd, "regex": peer.regex},
                    why=f"peer {peer.name}, run {len(order) - runs + 1} (interleaved with the host's)")
        order.append("peer")
        if p.ok:
            peer_vals.append(p.output.value)
        else:
            peer_failed += 1
        o = r.call("bench", {"cmd": bench_of(ctx, d), "metric": d["metric"], "cwd": d.get("repo"),
                             "regex": ctx.overrides.bench_regex}, why=f"reproduce, run {runs + 1}")
        runs += 1
        order.append("host")
        if o.ok:
            vals.append(o.output.value)
            unit = o.output.unit or unit
    source = f"the peer {peer.name}'s {len(peer_vals)} runs, interleaved with the host's"
    if len(peer_vals) < PEER_LEAST:   # the peer's benchmark failed now: its snapshot's runs, taken before, are all there is
        ctx.say(f"The peer {peer.name}'s benchmark gave {len(peer_vals)} number(s) now; its snapshot's runs (taken "
                "before the host's, not interleaved) are the baseline.")
        base, base_samples, source = _baseline_for(ctx, unit)
        if base is not None and vals:
            claimed = ctx.symptom.worse(ctx.symptom.in_unit(unit or ctx.symptom.unit), base)
            rep = reproduce(vals, base, ctx.symptom.direction == "lower", claimed, baseline_samples=base_samples,
                            final=True, most=most)
        reg = regression_of(vals, rep, base, source)
    else:
        reg = regression_of(vals, rep, statistics.fmean(peer_vals), source)
    reg = reg.model_copy(update={"peer": {"host": peer.name, "samples": peer_vals, "interleaved": True,
                                          "order": order}})
    reg.model_fields_set.add("peer")
    u = f" {unit}" if unit else ""
    ctx.say(f"Interleaved runs (peer, host alternating): the peer {peer.name} {runs_words(peer_vals)}{u}; "
            f"the host {runs_words(vals)}{u}. The peer's connection is closed; it was not changed.")
    ctx.say(reproduce_words(reg, rep, len(vals)))
    return reg, runs


def runs_words(vals: list[float]) -> str:
    if not vals:
        return "gave no number"
    return f"mean {plain(statistics.fmean(vals), 4)} over {len(vals)} runs ({', '.join(plain(v, 4) for v in vals)})"


def regression_of(vals: list[float], rep: Reproduction | None, base: float | None, source: str) -> Regression:
    """The reproduce step's answer as a ``Regression`` (only the fields it measured are set)."""
    if not vals:
        return Regression(measured=False, real=True, why="the benchmark failed")
    if rep is None:
        return Regression(measured=False, samples=vals, mean=statistics.fmean(vals), real=True,
                          why="no baseline number to compare with")
    return Regression(measured=True, samples=vals, mean=rep.mean, baseline=base, baseline_source=source,
                      real=rep.outcome == "regression", delta=rep.delta, delta_se=rep.delta_se, sd=rep.sd,
                      why=rep.text, outcome=rep.outcome, runs_needed=rep.runs_needed)


def reproduce_words(reg: Regression, rep: Reproduction | None, n: int) -> str:
    if not reg.samples:
        return "The benchmark failed every time; experiments cannot be measured."
    if rep is None:
        return (f"Measured {plain(statistics.fmean(reg.samples), 4)} over {n} runs; no baseline number to compare with, "
                "so the user's report is taken as the regression and no share can be measured.")
    lead = LEAD.get(rep.outcome) or f"Undecided after {n} runs ({more_runs_advice(rep.runs_needed)}): "
    return lead + rep.text + "."


# ---------------------------------------------------------------- facts
_last_redacted: dict[str, tuple[int, str]] = {}   # the latest snapshot's JSON -> (the redactor's generation, its redaction's)


def _redacted(snap: Snapshot) -> Snapshot:
    # redacted as a saved baseline snapshot and the checkpointed state are, so they compare alike. The rules and each
    # experiment ask for the same snapshot again: its redaction is kept while the redactor learns nothing new
    dump = snap.model_dump(mode="json")
    key = json.dumps(dump)
    generation = REDACTOR.generation
    hit = _last_redacted.get(key)
    if hit is not None and hit[0] == generation:
        return Snapshot.model_validate(json.loads(hit[1]))   # (read anew: nothing of one caller's snapshot is another's)
    out = redact(dump)
    if REDACTOR.generation == generation:   # it learned nothing on the way: the same input redacts the same
        text = json.dumps(out)
        _last_redacted.clear()
        if json.loads(text) == out:
            _last_redacted[key] = (generation, text)
    return Snapshot.model_validate(out)


def rule_facts(ctx: Ctx, s: RunState) -> dict[str, Any]:
    """The facts the playbook's rules see."""
    assert s.snapshot is not None
    return jsonable(build_facts(_redacted(s.snapshot), baseline=ctx.baseline_snapshot,
                                regression=s.regression.to_json(),
                                knowledge=ctx.playbook.knowledge, symptom=ctx.symptom.model_dump(),
                                group=ctx.playbook.group))


def lab_facts(ctx: Ctx, s: RunState) -> LabFacts:
    """What experiments read of the host as probed (the same redacted snapshot as the rules')."""
    assert s.snapshot is not None
    return LabFacts.of(_redacted(s.snapshot), ctx.baseline_snapshot)


def jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    return v


# ---------------------------------------------------------------- verdicts in the transcript
def emit_verdict(ctx: Ctx, hid: str, h: vd.Hyp, because: str) -> None:
    if h.status == "ruled_out" and h.rule and h.rule not in because:   # thin evidence never reads as proof
        because = f"{because} (decided by {h.rule})"
    ctx.transcript.emit("verdict", hypothesis=hid, status=h.status, how=h.how, because=because, share=h.share,
                        share_ci=list(h.share_ci) if h.share_ci else None, next=h.next)
    ctx.on_status("verdict", {"hypothesis": hid, "status": h.status})


def judge_all(ctx: Ctx, facts: dict[str, Any]) -> dict[str, vd.Hyp]:
    """Each hypothesis judged on the evidence (``verdicts.judge``) and opened in the transcript with its verdict,
    one after the other (a rule that fails on these facts stops there)."""
    hyps: dict[str, vd.Hyp] = {}
    for hid in ctx.playbook.order():
        hp = ctx.playbook.get(hid)
        hyps[hid] = vd.judge(ctx.playbook, hid, facts)
        ctx.transcript.emit("hypothesis_opened", hypothesis=hid, title=hp.title, checks=list(hp.checks))
        emit_verdict(ctx, hid, hyps[hid], "; ".join(hyps[hid].because))
    return hyps


# ---------------------------------------------------------------- plan
def base_head(ctx: Ctx) -> str | None:
    return ctx.baseline_snapshot.repo.head if ctx.baseline_snapshot and ctx.baseline_snapshot.repo else None


def candidates(ctx: Ctx, s: RunState, hyps: dict[str, vd.Hyp]) -> list[tuple[str, dict[str, Any]]]:
    return vd.candidates(hyps, ctx.playbook.order(), s.done, {h.id: h.cost for h in ctx.playbook.hypotheses},
                         base_head(ctx))


def hidden_next(ctx: Ctx, s: RunState, hyps: dict[str, vd.Hyp]) -> tuple[str, dict[str, Any]] | None:
    """Where the confirmed causes leave the regression unexplained (their share's 95% upper bound below 100%,
    measured together where they were), the first suspect an experiment ruled out alone, its change made again
    with theirs reverted in one restart (``verdicts.on_top_result`` judges what it adds); once each. None where
    there is none, or none whose experiment one restart can combine with theirs."""
    if vd.explains_enough(hyps):
        return None
    base = vd.unexplained_by(hyps, s.joint)
    if base is None:
        return None
    causes = vd.joint_causes(hyps)
    them = ", ".join(causes)
    for hid in vd.hidden_suspects(hyps, ctx.playbook.order()):
        spec, _ = vd.joint_experiment(hyps, lambda sp: resolve_restore(ctx, s, sp), (hid, hyps[hid].ruled_specs[-1]))
        if spec is None or vd.exp_key(hid, spec) in s.done:
            continue
        spec["base"] = [round(base[0], 4), round(base[1], 4)]
        ctx.say(f"The confirmed {'cause, ' + them + ', recovers' if len(causes) == 1 else 'causes, ' + them + ', recover'}"
                f" {pct(base[0])} of the regression (the 95% upper bound is below 100%). {hid} was ruled out alone, "
                f"with {them} in place, and one cause can hide another: where {them} makes each step slow enough, "
                f"{hid}'s own cost adds little to it. So {hid}'s change is made again, with {them} reverted too.", hid)
        return hid, spec
    return None


def add_groups(ctx: Ctx, s: RunState, hyps: dict[str, vd.Hyp]) -> bool:
    """The confirmed causes do not explain the regression (none is confirmed, or their measured share's upper bound
    stays below 100%): test the not-judged flags and variables by removal, in groups. Not with a baseline snapshot
    (its differences are the suspects), nor when a cause confirmed by evidence alone has no measured share (what it
    leaves unexplained is unknown)."""
    if ctx.baseline_snapshot is not None:
        return False
    if any(h.status == "confirmed" and h.share is None for h in hyps.values()):
        return False
    nj = vd.NotJudged.model_validate((s.facts or {}).get("not_judged") or {})
    added = vd.add_groups(hyps, nj, ctx.playbook.group_targets())
    total, ci = vd.explained(hyps)
    why = ("no confirmed cause explains the regression" if ci is None else
           f"the confirmed causes explain {pct(total)} of the regression (95% CI {pct(ci[0])} to {pct(ci[1])}), "
           f"{pct(max(0.0, 1 - total))} unexplained")
    for hid, items in added:
        workload = (f" The workload's own flags are never removed (removing one changes the work measured, not how "
                    f"it runs): {', '.join('--' + f for f in nj.workload)}."
                    if nj.workload and ctx.playbook.group_targets().get(hid) == "flags" else "")
        ctx.say(f"The known suspects do not explain the regression ({why}); testing what no knowledge list judges by "
                f"removal (back to the engine's default), as a group: {', '.join(items)} (split like a bisection if it "
                f"recovers).{workload}", hid)
    return bool(added)


def choose(ctx: Ctx, s: RunState) -> dict[str, Any]:
    """The next experiment by expected value (``verdicts.order_experiments``), asked for where mutations are not
    allowed; not-judged values in groups last. Returns the state's update."""
    hyps = {k: h.model_copy(deep=True) for k, h in s.hyps.items()}
    cands = candidates(ctx, s, hyps)
    if joint_due(s, hyps):
        # two or more causes confirmed, none explaining it alone: what they recover together decides whether any
        # further suspect is needed, so it is measured before them
        out = joint_or_stop(ctx, s, hyps, first=True)
        if out.get("current") is not None:
            return out
    j = s.joint or {}
    if j.get("share_ci") and j["share_ci"][1] >= 1.0:
        # measured together, the confirmed causes may explain all of the regression: further suspects are not
        # tested (a group that recovered is still split to name its culprit)
        rest = [c for c in cands if c[1].get("group") and hyps[c[0]].status == "confirmed"]
        if not rest:
            lo, hi = j["share_ci"]
            ctx.say(f"Together the confirmed causes recover {pct(j['share'])} of the regression (95% CI {pct(lo)} to "
                    f"{pct(hi)}): the interval reaches 100%, so what is left may be nothing; no further suspect is "
                    "tested.")
            return {"current": None, "hyps": hyps}
        cands = rest
    hidden = hidden_next(ctx, s, hyps)
    head = base_head(ctx)
    if hidden is not None and (not cands or vd.evidence_rank(hyps[hidden[0]].ruled_specs[-1], head)
                               <= vd.evidence_rank(cands[0][1], head)):
        # a suspect the evidence named, ruled out alone, before weaker evidence: the confirmed causes leave the
        # regression unexplained, and its cost may have been hidden by theirs
        return ask(ctx, s, hyps, [hidden])
    if vd.explains_enough(hyps):
        # a group that recovered is still split to name its culprit; a suspect the evidence points at is still
        # tested while the confirmed causes' measured share is short of EXPLAINED_ENOUGH (an interval that
        # reaches 100% is not a measurement that the rest is nothing)
        total, _ = vd.explained(hyps)
        rest = [c for c in cands if c[1].get("group") or (total < vd.EXPLAINED_ENOUGH and hyps[c[0]].status == "suspect")]
        if not rest:
            ctx.say(vd.enough_words(hyps))
            return joint_or_stop(ctx, s, hyps)
        if any(not c[1].get("group") for c in rest):
            ctx.say(vd.enough_words(hyps, suspects=sorted({c[0] for c in rest if not c[1].get("group")})))
        cands = rest
    elif not cands and add_groups(ctx, s, hyps):
        cands = candidates(ctx, s, hyps)
    if not cands:
        return joint_or_stop(ctx, s, hyps)
    if ctx.advisor is not None and len(cands) > 1:
        cands = ctx.advisor.order(cands, s.facts or {}, dump_hyps(hyps), ctx.transcript)
    return ask(ctx, s, hyps, cands)


def joint_words(j: dict[str, Any]) -> str:
    """What reverting the causes together recovered, in one sentence."""
    if j.get("share") is None:
        return (f"Reverted together ({', '.join(j['causes'])}), the causes could not be measured: "
                f"{j.get('error') or j.get('text')}.")
    lo, hi = j["share_ci"]
    return (f"Together {', '.join(j['causes'])} recover {pct(j['share'])} of the regression (95% CI {pct(lo)} to "
            f"{pct(hi)}; one at a time their shares add to {pct(j['sum_alone'])}); {pct(j['unexplained'])} unexplained.")


def resolve_restore(ctx: Ctx, s: RunState, spec: dict[str, Any]) -> dict[str, Any]:
    """A restoring restart's spec as the flags and variables it puts back (for the joint restart)."""
    if spec.get("kind") not in ("restore_baseline_flags", "restore_baseline_env"):
        return spec
    from .playbook import restored
    out = {**spec, "set_flags": dict(spec.get("set_flags") or {}), "unset_flags": list(spec.get("unset_flags") or []),
           "set_env": dict(spec.get("set_env") or {}), "unset_env": list(spec.get("unset_env") or [])}
    for c in restored(spec, lab_facts(ctx, s).changes):
        area, _, name = c.path.partition(".")[2].partition(".")
        if area == "args":
            (out["unset_flags"].append(name) if c.a is None else out["set_flags"].__setitem__(name, c.a))
        elif c.a is None:
            out["unset_env"].append(name)
        elif c.a != "[REDACTED]":
            out["set_env"][name] = c.a
    return out


def joint_due(s: RunState, hyps: dict[str, vd.Hyp]) -> bool:
    """Two or more causes confirmed by experiment, each one's share interval below 100% (none explains it alone),
    not yet measured together."""
    hids = vd.joint_causes(hyps)
    return (len(hids) >= 2 and s.joint is None and not any(k.endswith("reverted together") for k in s.done)
            and all((hyps[h].share_ci or (0.0, 1.0))[1] < 1.0 for h in hids))


def joint_or_stop(ctx: Ctx, s: RunState, hyps: dict[str, vd.Hyp], first: bool = False) -> dict[str, Any]:
    """Two or more causes confirmed by experiment are reverted together once, so the run can say what they recover
    together and what is left unexplained: before stopping, or (``first``) before any further suspect, which is
    then tested only while their joint interval stays below 100%."""
    hids = vd.joint_causes(hyps)
    if len(hids) < 2 or s.joint is not None or any(k.endswith("reverted together") for k in s.done):
        return {"current": None, "hyps": hyps}
    spec, why = vd.joint_experiment(hyps, lambda sp: resolve_restore(ctx, s, sp))
    if spec is None and first:   # said once, when the run stops
        return {"current": None, "hyps": hyps}
    if spec is None:
        total, _ = vd.explained(hyps)
        ctx.say(f"{len(hids)} causes are confirmed ({', '.join(hids)}), but they are not measured together: {why}; "
                f"their shares measured one at a time add to {pct(total)}.")
        return {"current": None, "hyps": hyps}
    ctx.say(f"{len(hids)} causes are confirmed ({', '.join(hids)}), each measured alone; reverting them together "
            "measures what they recover jointly (causes can overlap or compound) and what is left unexplained"
            + (": before any further suspect, which is tested only while their joint interval stays below 100%."
               if first else "."))
    return ask(ctx, s, hyps, [(hids[0], spec)])


def ask(ctx: Ctx, s: RunState, hyps: dict[str, vd.Hyp], cands: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The first candidate the user allows (``--allow-mutations`` allows all); the others noted as not run."""
    notes, done = list(s.notes), list(s.done)
    for hid, spec in cands:
        title = spec.get("title") or spec["kind"]
        if ctx.allow_mutations or (ctx.confirm is not None and ctx.confirm(title, hypothesis=hid, spec=spec)):
            ctx.say(f"Next: {title}, to test {hid} ({hyps[hid].because[0]}).", hid)
            return {"current": Current(hyp=hid, spec=spec), "hyps": hyps, "done": done, "notes": notes}
        note = f"{hid}: experiment \"{title}\" not run (it changes the host: give --allow-mutations or answer yes)"
        ctx.say(note, hid, kind="not_run")
        notes.append(note)
        hyps[hid] = vd.not_run(hyps[hid], spec, title)
        done.append(vd.exp_key(hid, spec))
    return {"current": None, "hyps": hyps, "done": done, "notes": notes}


def dump_hyps(hyps: dict[str, vd.Hyp]) -> dict[str, dict[str, Any]]:
    return {k: h.model_dump(mode="json") for k, h in hyps.items()}


# ---------------------------------------------------------------- experiment
def lab_for(ctx: Ctx, s: RunState, hid: str) -> Lab:
    """A lab for one experiment, measuring as the reproduce step did, with the run's budget and setup."""
    d, reg = s.discovered, s.regression
    max_runs = int(ctx.overrides.max_runs or 0)
    # re-measure the reference just before a change that nothing re-measures it after: an experiment that restarts
    # the server is controlled by the server as found, restarted after it; a benchmark in a worktree runs between
    # runs of the unchanged state
    kind = kind_of(s.current.spec if s.current is not None else None)
    fresh = fresh_reference_runs(reg.sd, reg.delta) if kind is not None and kind.fresh else 0
    # a server an earlier experiment's undo restarted is warmed up first, by a run that counts too; so is the one
    # the experiment starts. Under a tight --max-runs the re-measured reference goes before the two runs of the
    # changed state an experiment needs to decide anything
    warm = 1 if ctx.warmth.due else 0
    restarts = 1 if kind is not None and kind.restarts else 0
    if max_runs:
        fresh = max(0, min(fresh, max_runs - 2 - warm - restarts))
    bench = bench_of(ctx, d)
    assert bench is not None, "an experiment is planned only once discovery has a benchmark"
    return Lab(ctx.runner, lambda ev, **kw: ctx.transcript.emit(ev, hypothesis=hid, **kw), ctx.undo,
               Measure(bench=bench, metric=d["metric"], cwd=d.get("repo"), regex=ctx.overrides.bench_regex,
                       ready_timeout_s=ctx.overrides.ready_timeout, regression_se=reg.delta_se or 0.0,
                       max_runs=max(2, max_runs - fresh - (warm if fresh else 0)) if max_runs else 0),
               ctx.run_id, ctx.symptom.direction == "lower",
               LabSetup.from_inputs(ctx.overrides, (d.get("host_facts") or {}).get("profile")), ctx.warmth,
               ctx.found_restarted, discovery=run_input(ctx.overrides, d["metric"], d.get("server")),
               noise=baseline_noise(ctx, reg) + earlier_states(s), fresh_runs=fresh, shadow=d.get("shadow"),
               workload=d.get("server") if is_workload(d.get("server")) else None,   # how many to run; ``Lab.reference`` keeps how many it had
               peer=peer_reader(ctx, hid), speed_moved=ctx.speed_moved)


def peer_reader(ctx: Ctx, hid: str) -> PeerReader | None:
    """``--peer``: the peer as an experiment may read it (opened again for the read, closed after)."""
    peer = ctx.peer
    if peer is None:
        return None

    def open_peer() -> Runner:
        peer.open_again()
        return ctx.peer_runner(hid)
    return PeerReader(name=peer.name, python=peer.python, open=open_peer, close=peer.close)


def earlier_states(s: RunState) -> tuple[list[float], ...]:
    """The changed states of this run's earlier experiments, each one start's runs around their own mean: the next
    experiments' tests pool them into their estimate of the noise, as they pool the baseline snapshot's, so that a few
    quiet runs of two states cannot alone make a small difference look certain (``stats.noise_sd`` never lets them
    lower the two states' own SD). An offline workload's code experiment compared 2 runs with 3 whose SD came out a
    tenth of the noise and confirmed a harmless commit at p=0.0004, beside an experiment whose 2 runs showed it.
    A benchmark's noise grows with its value (a server twice as fast varies twice as much in tok/s), so each state's
    spread is scaled to the reproduce step's mean: a fast state's runs do not widen the noise of a slow one."""
    ref = s.regression.mean
    out = []
    for h in s.hyps.values():
        for res in h.results:
            g = list(res.samples)
            if len(g) < 2:
                continue
            m = statistics.fmean(g)
            k = abs(ref / m) if ref and m else 1.0
            out.append([m + (x - m) * k for x in g])
    return tuple(out)


def baseline_noise(ctx: Ctx, reg: Regression | None = None) -> tuple[list[float], ...]:
    """The baseline snapshot's benchmark runs (two or more; with ``--peer``, the peer's runs interleaved with the
    reproduce step's), which the experiments' tests pool into their estimate of the noise, as the reproduce step
    does; none without a baseline snapshot."""
    peer = (reg.peer or {}).get("samples") if reg is not None else None
    bs = list(peer) if peer and len(peer) >= 2 else _baseline_for(ctx, None)[1]
    return (bs,) if len(bs) >= 2 else ()


def systemd_check(ctx: Ctx, d: dict[str, Any]) -> None:
    """A server under a systemd unit, on a run that may change the host: this session must be able to change the unit
    as the experiments do (``systemctl`` on PATH, ``/etc/systemd/system`` writable), else exit 2 with the fix, right
    after discovery, before any benchmark run or change; a restart hook (``--restart-cmd`` or the host profile's), a
    shadow experiment (the server is never restarted) or a run that changes nothing need no such right."""
    server = d.get("server") or {}
    sup = (server.get("shape") or {}).get("supervisor") or {}
    unit = sup.get("unit")
    profile = (d.get("host_facts") or {}).get("profile") or {}
    may_change = ctx.allow_mutations or ctx.confirm is not None
    if (sup.get("kind") != "systemd" or not unit or not may_change or ctx.overrides.restart_cmd
            or profile.get("restart_cmd") or d.get("shadow") or not ctx.transport.live):
        return
    o = ctx.runner(None).call("systemd_access", {"unit": unit},
                              why=f"the server runs under the systemd unit {unit}: may this session change it "
                              "(systemctl, /etc/systemd/system) as an experiment would?")
    if not o.ok:
        return   # not known: the experiment's own command checks again before it writes anything
    a = o.output
    if a.systemctl and a.writable:
        return
    who = f"uid {a.uid}" if a.uid is not None else "this user"
    why = "systemctl is not installed here" if not a.systemctl else "no permission to write /etc/systemd/system"
    raise UsageError(f"the server (pid {server.get('pid')}) runs under the systemd unit {unit}, and this session "
                     f"({who}) cannot change it: {why}; an experiment restarts it through a drop-in, `systemctl "
                     "daemon-reload` and `systemctl restart`. Nothing was changed on the host",
                     fix=f"run as a user allowed to write /etc/systemd/system and to `systemctl restart {unit}` (root: "
                     f"--host root@…), or give --restart-cmd CMD (e.g. `sudo systemctl restart {unit}` with the change "
                     "in the unit's environment), or --shadow-gpus/--shadow-port, or --read-only")


def shadow_check(ctx: Ctx, d: dict[str, Any], bench: str | None) -> dict[str, Any]:
    """``--shadow-gpus``/``--shadow-port`` checked against the server found, before any benchmark run (exit 2 with
    the fix); the plan the experiments follow, its notes said."""
    plan = shadow.check(ctx.runner(None), ctx.overrides.shadow_gpus, ctx.overrides.shadow_port, d.get("server"), bench)
    ctx.say(f"Shadow experiments: the server (pid {(d.get('server') or {}).get('pid')}, port {plan.server_port}) is never "
            f"restarted; each experiment starts a changed copy of it on port {plan.port} and an unchanged one on port "
            f"{plan.ref_port}, on GPUs {','.join(plan.gpus)}, and measures them in turn.")
    for note in plan.notes:
        ctx.say(f"Shadow: {note}.")
    return plan.model_dump()


def run_experiment(ctx: Ctx, s: RunState) -> tuple[Current, int]:
    """Run the chosen experiment (again, up to ``RETRIES`` times, when the connection was lost); the result
    and the benchmark runs it took."""
    cur = s.current
    assert cur is not None
    hid, spec, reg = cur.hyp, cur.spec, s.regression
    lab = lab_for(ctx, s, hid)
    reference = list(reg.samples)   # the reproduce step's runs; the lab adds the re-measured ones
    ctx.transcript.emit("experiment", hypothesis=hid, phase="start", text=spec.get("title") or spec["kind"], spec=spec)
    facts, retried = lab_facts(ctx, s), cur.retried
    while True:
        try:
            result = lab.run(hid, spec, facts, reference, reg.size)
            result = decided(result, lab.last_decision, reg)
        except ConnectionLost as exc:
            ctx.say(str(exc), hid)
            if retried < RETRIES:
                retried += 1
                continue
            result = ExperimentResult.failed(spec["kind"], str(exc))
        except ExperimentError as exc:
            result = ExperimentResult.failed(spec["kind"], str(exc))
        break
    ctx.transcript.emit("experiment", hypothesis=hid, phase="result", text=result.text, share=result.share,
                        significant=result.significant)
    return cur.model_copy(update={"result": result, "retried": retried}), lab.bench_runs


def decided(result: ExperimentResult, d: Any, reg: Regression) -> ExperimentResult:
    """The three-way outcome and the share's interval (with the regression's own uncertainty)."""
    if d is None:
        return result
    out: dict[str, Any] = {"outcome": d.outcome, "improvement": d.improvement, "share_ci": None, "share_se": None,
                           "reference_runs": d.n_reference}
    if reg.size:
        share, lo, hi = share_interval(d.improvement, d.improvement_se, d.df, reg.size, reg.delta_se or 0.0)
        out.update(share=round(share, 3), share_ci=(round(lo, 3), round(hi, 3)), share_se=(hi - share) / 1.96)
    return result.model_copy(update=out)
