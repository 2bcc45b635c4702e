"""What a hypothesis' verdict is, from its rule findings and its experiments' results.

Pure functions over pydantic models; the graph's nodes only load and store them.

The words keep the promises of docs/verdicts.md: ``confirmed`` only by an experiment
decided "a cause" or by a rule whose evidence is decisive on its own; ``ruled_out`` only by
an experiment decided "not a cause" or a rule whose evidence positively excludes it;
an experiment that stays undecided at its run budget (or fails) makes the hypothesis
``inconclusive``, with the reason and the next step.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Literal

from debugagent.tools.probes.text import plural
from debugagent.tools.units import plain, whole_pct
from pydantic import BaseModel, Field

from .config import REPRODUCE_RUNS
from .lab.registry import kind_of
from .playbook import Finding, Playbook, evaluate
from .results import REPEAT, ExperimentResult
from .stats import ALPHA_CAUSE, ALPHA_NOT, NOT_CAUSE_SHARE

Status = Literal["pending", "suspect", "confirmed", "ruled_out", "inconclusive"]
EXPLAINED_ENOUGH = 0.9


class Hyp(BaseModel):
    """One hypothesis as the run sees it (stored in the graph state as its ``model_dump``)."""

    status: Status = "pending"
    how: str | None = None            # experiment | evidence
    because: list[str] = Field(default_factory=list)
    share: float | None = None        # measured share of the regression its experiments recovered
    share_se: float | None = None
    share_ci: tuple[float, float] | None = None
    findings: list[Finding] = Field(default_factory=list)
    experiments: list[dict[str, Any]] = Field(default_factory=list)   # still to run
    results: list[ExperimentResult] = Field(default_factory=list)
    next: str | None = None           # what would decide it
    culprit: dict[str, Any] | None = None
    groups_tried: bool = False
    rule: str | None = None           # what decided "ruled out": the bound an experiment fell below, or the rule
    cause_specs: list[dict[str, Any]] = Field(default_factory=list)   # the experiments that confirmed it (a group's
    # narrowest half replaces the group)
    judged: list[str] = Field(default_factory=list)   # the flags and variables its decided experiments changed
    # the experiments that decided it "not a cause", each made with the other causes still in place: tested again with
    # the confirmed causes reverted where those leave the regression unexplained (``steps.hidden_next``)
    ruled_specs: list[dict[str, Any]] = Field(default_factory=list)


def from_findings(findings: list[Finding], next_step: str | None) -> Hyp:
    """The verdict of a hypothesis on the evidence alone (before any experiment)."""
    strong = [f for f in findings if f.verdict in ("suspect", "confirmed")]
    if strong:
        confirmed = any(f.verdict == "confirmed" for f in strong)
        return Hyp(status="confirmed" if confirmed else "suspect", how="evidence" if confirmed else None,
                   because=[f.because for f in strong], findings=list(strong),
                   experiments=[f.experiment for f in strong if f.experiment],
                   next=None if confirmed else next_step)
    f = findings[0]
    return Hyp(status=f.verdict, how="evidence" if f.verdict == "ruled_out" else None,  # type: ignore[arg-type]
               because=[f.because], findings=[f],
               next=next_step if f.verdict == "inconclusive" else None)


def _combine(h: Hyp, share: float, se: float | None,
             ci: tuple[float, float] | None = None) -> tuple[float, float | None, tuple[float, float] | None]:
    if h.share is None and ci is not None:   # the first measurement: its own interval, as its sentence says it
        return share, se, ci
    total = (h.share or 0.0) + share
    if se is None:
        return total, h.share_se, h.share_ci
    tse = math.sqrt((h.share_se or 0.0) ** 2 + se ** 2)
    return total, tse, (total - 1.96 * tse, total + 1.96 * tse)


def apply_result(h: Hyp, spec: dict[str, Any], res: ExperimentResult, max_runs_hint: int | None = None) -> Hyp:
    """The hypothesis after one experiment's result."""
    h = h.model_copy(deep=True)
    res = res.model_copy(update={"group": spec.get("group")})
    within_group = bool(spec.get("group")) and any(
        r.outcome == "cause" and set(spec["group"]) < set(r.group or []) for r in h.results)
    h.results.append(res)
    h.experiments = [e for e in h.experiments if e != spec]
    untested = [f for f in h.findings if f.verdict == "suspect" and not f.experiment]
    nothing_left = not h.experiments and not untested
    title = spec.get("title") or spec["kind"]
    if res.error:
        # nothing was measured: the evidence still points where it did (a suspect stays a suspect),
        # and what stopped the experiment says how to run it
        h.because.append(f"experiment failed: {res.error}")
        if h.status == "suspect":
            h.next = f"\"{title}\", once what stopped it (above) is fixed"
        return h
    outcome = res.decided
    h.because.append(res.text)
    if outcome in ("cause", "not_cause") and not spec.get("group"):
        h.judged = sorted(set(h.judged) | spec_names(spec))
    if outcome == "cause":
        h.status, h.how, h.next = "confirmed", "experiment", None
        narrower = set(spec.get("group") or [])
        h.cause_specs = [c for c in h.cause_specs if not (narrower and narrower < set(c.get("group") or []))]
        h.cause_specs.append(dict(spec))
        if res.share_ci is not None and within_group:   # the narrower group's measurement replaces the wider one's
            h.share, h.share_se, h.share_ci = float(res.share), res.share_se, (res.share_ci[0], res.share_ci[1])
        elif res.share_ci is not None:
            h.share, h.share_se, h.share_ci = _combine(h, float(res.share), res.share_se,
                                                       (res.share_ci[0], res.share_ci[1]))
        if res.culprit:
            h.culprit = res.culprit
    elif outcome == "not_cause":
        # a failed experiment measured nothing: what it was to test is still a suspect, whatever the others showed
        if h.status == "suspect" and nothing_left and not any(r.outcome == "more" or r.error for r in h.results):
            h.status, h.how = "ruled_out", "experiment"
            h.rule = res.rule or h.rule
        if not spec.get("group"):
            h.ruled_specs.append(dict(spec))
    else:
        runs = len(res.samples)
        hint = max_runs_hint or max(2 * runs, 8)
        if h.status == "suspect" and nothing_left:
            h.status, h.how = "inconclusive", None
        if h.status != "confirmed":
            h.next = (more_starts_next(title, res.starts, res.found_starts) if len(res.starts) >= 2 else
                      more_runs_next(title, runs, None if res.control else res.reference_runs, hint))
    return h


def more_starts_next(title: str, starts: list[float], found: list[float]) -> str:
    """What would decide an experiment left undecided over the starts of the server (``control.restart_again``): the
    starts' means differ by more than their runs' noise, so more runs of one start would not decide it; more starts
    each way would, or a server (and host) whose speed holds from one start to the next."""
    each = ", ".join(plain(m, 4) for m in starts)
    as_found = ", ".join(plain(m, 4) for m in found)
    return (f"{REPEAT}{title}\" over more starts of the server: its starts read {each} with the change and "
            f"{as_found} as found, so more runs of one start would not decide it (the server's or the host's speed "
            "moves between starts; where it holds from one start to the next, they would)")


def more_runs_next(title: str, runs: int, reference: int | None, hint: int) -> str:
    """What would decide an experiment left undecided by ``runs`` runs of the changed state against ``reference``
    runs of the reference state (None: a control's or the starts', not the reproduce step's). Where the changed
    state has twice the reference's runs or more, the reference carries two thirds or more of the variance of the
    difference of means, and more changed runs would not narrow it: more runs of the host as found would."""
    if reference and runs >= 2 * reference:
        part = runs / (runs + reference)
        want = max(reference + 2, min(runs, REPRODUCE_RUNS))
        return (f"{REPEAT}{title}\" with more runs of the host as found (--min-reproduce-runs {want}): against the "
                f"reference state's {plural(reference, 'run')} its {runs} runs could not decide it, and more of them "
                f"would not: the reference's runs carry {part:.0%} of the variance of the difference of the means")
    return f"{REPEAT}{title}\" with more runs (--max-runs {hint}): {runs} runs could not decide it"


def after_experiment(hid: str, h: Hyp, spec: dict[str, Any], res: ExperimentResult) -> Hyp:
    """The hypothesis after its experiment: the result applied, a group that recovered split in halves."""
    h = apply_result(h, spec, res)
    h.experiments += split_group(spec, res)
    return h


def judge(playbook: Playbook, hid: str, facts: dict[str, Any]) -> Hyp:
    """A hypothesis' verdict on the evidence alone: its rules over the facts."""
    steps = playbook.knowledge.get("next_steps") or {}
    hp = playbook.get(hid)
    h = from_findings(evaluate(hp, facts, playbook.source), steps.get(hid))
    if h.status == "ruled_out" and h.findings and 0 <= h.findings[0].rule < len(hp.rules):
        h.rule = f"the evidence, by the playbook's rule {h.findings[0].rule + 1} of {hid}: when {hp.rules[h.findings[0].rule].when}"
    return h


def explained(hyps: dict[str, Hyp]) -> tuple[float, tuple[float, float] | None]:
    """The share of the regression the confirmed causes' experiments recovered, with its interval."""
    measured = [h for h in hyps.values() if h.status == "confirmed" and h.share is not None]
    total = sum(h.share or 0.0 for h in measured)
    if not measured:
        return 0.0, None
    if len(measured) == 1 and measured[0].share_ci is not None:   # one cause: its own interval, the one it reports
        lo, hi = measured[0].share_ci
        return total, (lo, hi)
    se = math.sqrt(sum((h.share_se or 0.0) ** 2 for h in measured))
    return total, (total - 1.96 * se, total + 1.96 * se)


def explains_enough(hyps: dict[str, Hyp]) -> bool:
    """Stop testing: the confirmed causes explain the regression within its interval."""
    total, ci = explained(hyps)
    if total >= EXPLAINED_ENOUGH:
        return True
    return bool(ci and ci[1] >= 1.0 and ci[0] >= 0.5)


# ---------------------------------------------------------------- what no list judges
class NotJudged(BaseModel):
    flags: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    # flags of the workload itself (the knowledge's ``workload_flags``, or a flag the benchmark's own command line
    # gives too): never removed, since removing one changes the work measured, not how it runs
    workload: list[str] = Field(default_factory=list)
    # flags set to a value as fast as the engine's default (the knowledge's ``default_values``): nothing to test
    at_default: list[str] = Field(default_factory=list)
    # of ``flags`` and ``env``, those a removal in a group decided "not a cause" (``removed_not_cause``)
    removed: list[str] = Field(default_factory=list)


def _matches(item: dict[str, Any], value: Any) -> bool:
    return value is not None and ("value" not in item or str(value) == str(item["value"]))


def bench_flags(bench_cmd: str | None) -> set[str]:
    """The flags the benchmark's own command line gives (``--input-len 1024`` -> input-len)."""
    import shlex

    from debugagent.tools.host import parse_flags
    try:
        words = shlex.split(bench_cmd or "")
    except ValueError:
        return set()
    return {str(f).replace("_", "-").lower() for f in parse_flags(words)}


def not_judged(server: dict[str, Any] | None, knowledge: dict[str, Any], bench_cmd: str | None = None) -> NotJudged:
    """Flags and performance variables that no knowledge list names (as set, or as harmless); the workload's own
    flags and those at a value as fast as the engine's default apart."""
    if not server:
        return NotJudged()
    flags = server.get("flags") or {}
    env = server.get("env") or {}
    norm = lambda s: str(s).replace("_", "-").lower()  # noqa: E731
    usual = {norm(f) for f in knowledge.get("usual_flags") or []}
    workload_names = {norm(f) for f in knowledge.get("workload_flags") or []} | bench_flags(bench_cmd)
    defaults = {norm(k): {str(x).lower() for x in (v if isinstance(v, list) else [v])}
                for k, v in (knowledge.get("default_values") or {}).items()}
    costly = [c for c in knowledge.get("costly_flags") or []]
    candidates = [f for f in flags if norm(f) not in usual
                  and not any(norm(c["flag"]) == norm(f) and _matches(c, flags[f]) for c in costly)]
    workload = [f for f in candidates if norm(f) in workload_names]
    at_default = [f for f in candidates if f not in workload and str(flags[f]).lower() in defaults.get(norm(f), set())]
    nj_flags = [f for f in candidates if f not in workload and f not in at_default]
    prefixes = tuple(knowledge.get("perf_env_prefixes") or [])
    usual_env = set(knowledge.get("usual_env") or [])
    costly_env = knowledge.get("costly_env") or []
    nj_env = [v for v in env if prefixes and v.startswith(prefixes) and v not in usual_env
              and not any(c["var"] == v and _matches(c, env[v]) for c in costly_env)]
    return NotJudged(flags=sorted(nj_flags), env=sorted(nj_env), workload=sorted(workload), at_default=sorted(at_default))


def group_experiment(what: str, items: list[str]) -> dict[str, Any]:
    """One restart with a group of not-judged flags (``what`` = flags) or variables (env) removed."""
    if what == "flags":
        return {"kind": "server_restart", "title": "restart the server without the not-judged flags "
                + ", ".join(f"--{f}" for f in items), "unset_flags": list(items), "group": list(items)}
    return {"kind": "server_restart", "title": "restart the server without the not-judged variables "
            + ", ".join(items), "unset_env": list(items), "group": list(items)}


def split_group(spec: dict[str, Any], res: ExperimentResult) -> list[dict[str, Any]]:
    """A group that recovered is split in halves, like a bisection; a single item is the answer."""
    group = spec.get("group") or []
    if len(group) < 2 or res.outcome != "cause":
        return []
    mid = len(group) // 2
    what = "flags" if spec.get("unset_flags") else "env"
    return [group_experiment(what, group[:mid]), group_experiment(what, group[mid:])]


def add_groups(hyps: dict[str, Hyp], nj: NotJudged, targets: dict[str, str]) -> list[tuple[str, list[str]]]:
    """Each not-judged group not yet tried, added to the experiments of the hypothesis the playbook gives it
    (``targets``: hypothesis id -> flags or env, ``Playbook.group_targets``); returns what was added."""
    added = []
    for hid, what in targets.items():
        items = nj.flags if what == "flags" else nj.env
        if items and hid in hyps and not hyps[hid].groups_tried:
            hyps[hid].groups_tried = True
            hyps[hid].experiments.append(group_experiment(what, items))
            added.append((hid, items))
    return added


def spec_names(spec: dict[str, Any]) -> set[str]:
    """The flags and variables an experiment sets or removes (empty names, a template's unused slot, left out)."""
    names = [*(spec.get("set_flags") or {}), *(spec.get("unset_flags") or []), *(spec.get("set_env") or {}),
             *(spec.get("unset_env") or [])]
    return {str(n) for n in names if n}


def without_judged(hyps: dict[str, Hyp], nj: NotJudged) -> NotJudged:
    """The not-judged lists without what a hypothesis' own experiment changed and decided (a playbook's hypothesis
    for OMP_NUM_THREADS judges it, though no knowledge list names it), and without what a removal found a cause."""
    judged = {n for h in hyps.values() for n in h.judged}
    # a group whose removal was a cause judged its values too: they are (part of) a confirmed cause
    judged |= {i for h in hyps.values() for r in h.results if r.group and not r.error and r.decided == "cause"
               for i in r.group}
    return nj.model_copy(update={"flags": [f for f in nj.flags if f not in judged],
                                 "env": [v for v in nj.env if v not in judged]})


def _decided_not_cause(h: Hyp, items: list[str]) -> set[str]:
    """Of ``items``, those a group removal on ``h`` decided "not a cause" (measured, not failed nor undecided)."""
    return {i for r in h.results if r.group and not r.error and r.decided == "not_cause" for i in r.group} & set(items)


def removed_not_cause(hyps: dict[str, Hyp], nj: NotJudged, targets: dict[str, str]) -> NotJudged:
    """The not-judged lists with ``removed``: the values their group's removal decided "not a cause"."""
    done: set[str] = set()
    for hid, what in targets.items():
        if hid in hyps:
            done |= _decided_not_cause(hyps[hid], nj.flags if what == "flags" else nj.env)
    return nj.model_copy(update={"removed": sorted(done)})


def unjudged_left(hyps: dict[str, Hyp], nj: NotJudged, targets: dict[str, str]) -> dict[str, Hyp]:
    """Group targets ruled out on what they measured (a known-costly flag removed) while values no knowledge list
    names were never decided by removal (their group not run, failed or undecided): "not decided", naming how many
    and which, since unknown is not "ruled out". Returns the hypotheses changed (call it without a baseline snapshot:
    there, equal flags and variables exclude them all)."""
    out: dict[str, Hyp] = {}
    for hid, what in targets.items():
        items = nj.flags if what == "flags" else nj.env
        h = hyps.get(hid)
        if not items or h is None or h.status != "ruled_out":
            continue
        if _decided_not_cause(h, items) == set(items):
            continue
        noun = ("flag" if what == "flags" else "variable") + ("s" if len(items) > 1 else "")
        names = ", ".join(f"--{f}" if what == "flags" else f for f in items)
        h = h.model_copy(deep=True)
        h.status, h.how, h.rule = "inconclusive", None, None
        h.because.append(f"ruled out only for what was measured; {len(items)} {noun} not judged ({names}): no knowledge "
                         f"list names {'them' if len(items) > 1 else 'it'} and no experiment removed "
                         f"{'them' if len(items) > 1 else 'it'}")
        h.next = h.next or f"\"{group_experiment(what, items)['title']}\" (split like a bisection if it recovers)"
        out[hid] = h
    return out


def not_run(h: Hyp, spec: dict[str, Any], title: str) -> Hyp:
    """The hypothesis when the user did not allow its experiment: dropped, and named as what would decide it."""
    h = h.model_copy(deep=True)
    h.experiments = [e for e in h.experiments if e != spec]
    h.next = h.next or f"run \"{title}\" (give --allow-mutations)"
    return h


def enough_words(hyps: dict[str, Hyp], suspects: list[str] | None = None) -> str:
    total, ci = explained(hyps)
    said = (f"The confirmed causes explain {whole_pct(total)} of the regression"
            + (f" (95% CI {whole_pct(ci[0])} to {whole_pct(ci[1])})" if ci else ""))
    if suspects:
        return (f"{said}: it may be all of it, but that is not measured, and the evidence still points at "
                f"{', '.join(suspects)}; testing {'it' if len(suspects) == 1 else 'them'} too.")
    return said + "; no further experiment is needed."


# ---------------------------------------------------------------- experiment order
def exp_key(hid: str, spec: dict[str, Any]) -> str:
    """One experiment's identity: a hypothesis can hold several of the same kind (one per flag)."""
    return f"{hid}:{spec['kind']}:{spec.get('title', '')}"


def candidates(hyps: dict[str, Hyp], order: list[str], done: list[str], costs: dict[str, int],
               baseline_head: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The experiments still to run, best first: of hypotheses not closed, none done yet; a hypothesis an
    experiment confirmed runs its groups' halves and its other values known to cost (a second costly variable is a
    second cause), not its weaker evidence."""
    cands = [(hid, e) for hid in order for e in hyps[hid].experiments
             if (hyps[hid].status in ("suspect", "confirmed", "inconclusive")
                 or (hyps[hid].status == "ruled_out" and e.get("group")))   # ruled out on what it measured: the
             and exp_key(hid, e) not in done                                 # values no list judges are still tested
             and not (hyps[hid].status == "confirmed" and hyps[hid].how == "experiment" and not e.get("group")
                      and evidence_rank(e, baseline_head) > 0)]
    return order_experiments(cands, order, costs, baseline_head)


def evidence_rank(spec: dict[str, Any], baseline_head: str | None) -> int:
    """0: a difference from the baseline snapshot or a value known to cost performance; 1: other
    evidence (the reflog shows the checkout moved); 2: a group of not-judged values."""
    if spec.get("group"):
        return 2
    kind = kind_of(spec)
    return kind.evidence_rank(spec, baseline_head) if kind is not None else 0


def order_experiments(cands: list[tuple[str, dict[str, Any]]], order: list[str], costs: dict[str, int],
                      baseline_head: str | None) -> list[tuple[str, dict[str, Any]]]:
    """Best expected value first: strength of evidence, then the playbook's cost, then its order."""
    return sorted(cands, key=lambda c: (evidence_rank(c[1], baseline_head), costs.get(c[0], 1), order.index(c[0])))


# ---------------------------------------------------------------- the confirmed causes measured together
RESTART_KINDS = ("server_restart", "restore_baseline_flags", "restore_baseline_env")
OVERLAY_KIND = "package_restore"   # a restart onto a package overlay: the others' flags and variables can join it
JOINT = "joint"


def joint_causes(hyps: dict[str, Hyp]) -> list[str]:
    """The causes an experiment confirmed with a measured share: two or more are measured together."""
    return [hid for hid, h in hyps.items() if h.status == "confirmed" and h.how == "experiment"
            and h.share is not None and h.cause_specs]


def joint_experiment(hyps: dict[str, Hyp], resolve: Any,
                     on_top: tuple[str, dict[str, Any]] | None = None) -> tuple[dict[str, Any] | None, str]:
    """One restart with every confirmed cause's change at once (their experiments are restarts with flags or
    variables changed: ``resolve`` turns a restoring spec into the flags and variables it puts back), or None and
    why not. ``on_top``: a suspect ruled out alone and its experiment's spec, whose change joins theirs
    (``on_top_result`` judges it)."""
    hids = joint_causes(hyps)
    specs = [sp for h in hids for sp in hyps[h].cause_specs] + ([on_top[1]] if on_top else [])
    overlays = [sp for sp in specs if sp.get("kind") == OVERLAY_KIND]
    if len(overlays) > 1 or any(sp.get("kind") not in RESTART_KINDS for sp in specs if sp not in overlays):
        kinds = sorted({str(sp.get("kind")) for sp in specs})
        return None, (f"their experiments ({', '.join(kinds)}) are not all server restarts (with at most one package "
                      "overlay), which one restart could combine")
    # a package overlay is a restart too: the flags and variables are changed in the restart onto the overlay
    joint: dict[str, Any] = {**{k: v for k, v in (overlays[0] if overlays else {}).items() if k not in ("title", "fix")},
                             "kind": OVERLAY_KIND if overlays else "server_restart",
                             "set_flags": {}, "unset_flags": [], "set_env": {}, "unset_env": []}
    for sp in (sp for sp in specs if sp not in overlays):
        sp = resolve(sp)
        joint["set_flags"].update({k: v for k, v in (sp.get("set_flags") or {}).items() if k})
        joint["unset_flags"] += [f for f in sp.get("unset_flags") or [] if f and f not in joint["unset_flags"]]
        joint["set_env"].update({k: v for k, v in (sp.get("set_env") or {}).items() if k})
        joint["unset_env"] += [v for v in sp.get("unset_env") or [] if v and v not in joint["unset_env"]]
    joint["title"] = f"restart the server with {', '.join(hids)} reverted together"
    joint[JOINT] = hids
    if on_top:
        joint["title"] = f"restart the server with {', '.join(hids)} and {on_top[0]} reverted together"
        joint[JOINT], joint[ON_TOP] = [*hids, on_top[0]], on_top[0]
    return joint, ""


def joint_result(hids: list[str], res: ExperimentResult, hyps: dict[str, Hyp]) -> dict[str, Any]:
    """What reverting the causes together recovered: its share with the interval, and what is left unexplained."""
    alone = sum(hyps[h].share or 0.0 for h in hids)
    out: dict[str, Any] = {"causes": hids, "title": res.title, "error": res.error, "share": None, "share_ci": None,
                           "unexplained": None, "sum_alone": round(alone, 3), "text": res.text}
    if not res.error and res.share_ci is not None:
        out.update(share=round(float(res.share), 3), share_ci=(round(res.share_ci[0], 3), round(res.share_ci[1], 3)),
                   unexplained=round(max(0.0, 1 - float(res.share)), 3))
    return out


# ---------------------------------------------------------------- a suspect hidden by a confirmed cause
# Two causes can hide one another: on the H200 lab, float32 layers made each decode step so long that
# CUDA_LAUNCH_BLOCKING=1 cost 2% of the regression beside them, and it was ruled out alone (the 80% upper bound of
# its recovery 3%), while with bfloat16 back it cost the 36% the dtype left unexplained. Where the confirmed causes
# leave the regression unexplained, a suspect an experiment ruled out alone is tested once more, with them reverted.
ON_TOP = "on_top"
Z_CAUSE = NormalDist().inv_cdf(1 - ALPHA_CAUSE)   # what a change must add, in standard errors, to be a cause
Z_NOT = NormalDist().inv_cdf(1 - ALPHA_NOT)       # the upper bound below which what it adds is "not a cause"
Z_CI = 1.96                                       # the 95% intervals every share is given with


def hidden_suspects(hyps: dict[str, Hyp], order: list[str]) -> list[str]:
    """Suspects an experiment ruled out alone (its change made while the confirmed causes were in place), in the
    playbook's order: what ``steps.hidden_next`` may test again with the confirmed causes reverted."""
    return [hid for hid in order if hyps[hid].status == "ruled_out" and hyps[hid].how == "experiment"
            and hyps[hid].ruled_specs]


def unexplained_by(hyps: dict[str, Hyp], joint: dict[str, Any] | None) -> tuple[float, float] | None:
    """What the confirmed causes recover (share, standard error), measured together where they were (``joint``,
    naming the same causes), else their shares added; None where there is none, or where its 95% upper bound reaches
    100% (what is left may be nothing)."""
    hids = joint_causes(hyps)
    if not hids:
        return None
    if joint and joint.get("share_ci") and sorted(joint.get("causes") or []) == sorted(hids):
        share, (lo, hi) = float(joint["share"]), joint["share_ci"]
    else:
        share, ci = explained(hyps)
        if ci is None:
            return None
        lo, hi = ci
    return None if hi >= 1.0 else (share, max(0.0, (hi - lo) / (2 * Z_CI)))


def on_top_result(hid: str, h: Hyp, causes: list[str], res: ExperimentResult,
                  base: tuple[float, float], moved: str | None = None) -> Hyp:
    """The suspect after its change was made again with the confirmed causes reverted (``res``, against the reproduce
    step's runs, as every experiment): what it adds to what they recover alone (``base``: share, standard error),
    judged as an experiment's share is: a cause where it adds more than the noise allows (one-sided p below
    stats.ALPHA_CAUSE) and at least 20% of the regression; not a cause where its 80% upper bound stays below 20%;
    otherwise undecided. ``moved``: the run has seen the server's speed move from one start to the next (``Ctx.
    speed_moved``), so what one start of this state adds to another start's is not shown: undecided, never a cause."""
    h = h.model_copy(deep=True)
    them = ", ".join(causes)
    if res.error or res.share_ci is None:
        h.because.append(f"with {them} reverted too, not measured: {res.error or res.text}")
        return h
    b, bse = base
    rse = res.share_se if res.share_se else (res.share_ci[1] - res.share_ci[0]) / (2 * Z_CI)
    added = float(res.share) - b
    se = math.hypot(rse, bse)
    lo, hi, up80 = added - Z_CI * se, added + Z_CI * se, added + Z_NOT * se
    words = (f"with {them} reverted too: {res.text}; against {whole_pct(b)} for {them} alone, this change adds "
             f"{whole_pct(added)} of the regression (95% CI {whole_pct(lo)} to {whole_pct(hi)})")
    adds = res.significant and se > 0 and added / se >= Z_CAUSE and added >= NOT_CAUSE_SHARE
    if adds and moved:
        h.status, h.how = "inconclusive", None
        h.next = (f"{REPEAT}{res.title}\" over more starts of the server: {moved}, so what one start adds to "
                  "another's is not shown")
        h.because.append(f"{words}: undecided, since {moved}")
    elif adds:
        h.status, h.how, h.next, h.rule = "confirmed", "experiment", None, None
        h.share, h.share_se, h.share_ci = round(added, 3), se, (lo, hi)
        h.cause_specs = [h.ruled_specs[-1]]
        h.because.append(f"{words}: a cause, hidden while {them} {'was' if len(causes) == 1 else 'were'} in place "
                         "(alone it recovered too little to count)")
    elif up80 < NOT_CAUSE_SHARE:
        h.rule = (f"the 80% upper bound of what it adds with {them} reverted too is {whole_pct(up80)} of the "
                  f"regression, below the {whole_pct(NOT_CAUSE_SHARE)} a cause must recover")
        h.because.append(f"{words}: not a cause with {them} reverted either ({h.rule})")
    else:
        h.status, h.how = "inconclusive", None
        h.next = f"{REPEAT}{res.title}\" with more runs: what it adds ({whole_pct(added)}) is not decided"
        h.because.append(f"{words}: undecided")
    return h
