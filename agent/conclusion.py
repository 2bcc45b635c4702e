"""The conclusion of a run, from the hypotheses' verdicts: pure, and the shape of ``--json``.

Elimination never confirms: when everything else was ruled out, the last suspect is ranked
first ("the only suspect not ruled out", or with a baseline snapshot "the remaining
difference"), still with ``explains: null`` and the experiment that would confirm it.
Exit 0 only with a confirmed cause.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .results import Regression
from .stats import more_runs_advice
from .stats import pct as _pct  # half up, as the experiment's own sentence: never "explains 96%" beside "97%"
from .verdicts import Hyp, NotJudged

SCHEMA = 2


class Cause(BaseModel):
    hypothesis: str
    summary: str
    evidence: list[str]
    how: str                                    # experiment | evidence
    explains: float | None                      # measured share of the regression, None when not measured
    explains_ci: tuple[float, float] | None     # its 95% interval
    culprit: dict[str, Any] | None = None
    fix: str | None = None                      # the command that makes the fix permanent, when an experiment found one


class Suspect(BaseModel):
    hypothesis: str
    because: str
    next: str | None = None                     # the experiment that would decide it
    rank: str | None = None                     # why it is ranked where it is


class Open(BaseModel):
    hypothesis: str
    because: str
    next: str | None = None
    rule: str | None = None                     # ruled out: what decided it (the bound, or the evidence's rule)


class Joint(BaseModel):
    """Two or more confirmed causes reverted together in one experiment."""

    causes: list[str]
    share: float | None                         # of the regression they recover together; None when not measured
    share_ci: tuple[float, float] | None        # its 95% interval
    unexplained: float | None                   # 1 - share (at least 0)
    sum_alone: float                            # their shares measured one at a time, added
    text: str = ""


class Conclusion(BaseModel):
    schema_: int = Field(default=SCHEMA, serialization_alias="schema")
    root_cause: Cause | None
    root_causes: list[Cause]
    suspects: list[Suspect]
    ruled_out: list[Open]
    inconclusive: list[Open]
    not_judged: NotJudged
    summary: str
    exit_code: int
    joint: Joint | None = None                  # the confirmed causes measured together (two or more)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def cause_of(hid: str, h: Hyp) -> Cause:
    if h.how == "experiment":
        # the last cause found is the narrowest (a group split down to one flag)
        summary = next((r.text for r in reversed(h.results) if r.decided == "cause" and not r.error), h.because[-1])
    else:
        summary = h.because[0]
    if h.culprit:
        c = h.culprit
        conf = f", confidence {c['confidence']:.0%}" if c.get("confidence") is not None else ""
        summary = f"commit {c['short']} \"{c['subject']}\" ({c['sha'][:12]}{conf}): " + summary
    measured = h.how == "experiment" and h.share_ci is not None
    return Cause(hypothesis=hid, summary=summary, evidence=h.because, how=h.how or "evidence",
                 explains=round(h.share, 3) if measured and h.share is not None else None,
                 explains_ci=(round(h.share_ci[0], 3), round(h.share_ci[1], 3)) if measured and h.share_ci else None,
                 culprit=h.culprit,
                 fix=next((r.fix for r in h.results if r.outcome == "cause" and r.fix), None))


def rank_suspects(hyps: dict[str, Hyp], order: list[str], baseline_snapshot: bool,
                  next_steps: dict[str, str]) -> list[Suspect]:
    """Suspects, best first; elimination only decides the order."""
    sus = [hid for hid in order if hyps[hid].status == "suspect"]
    others_closed = all(hyps[h].status in ("ruled_out", "confirmed") for h in order if h not in sus)
    out: list[Suspect] = []
    for hid in sus:
        h = hyps[hid]
        rank = None
        if len(sus) == 1 and others_closed:
            rank = ("the remaining difference from the baseline snapshot: every other difference was ruled out"
                    if baseline_snapshot else
                    "the only suspect not ruled out (elimination ranks it first; it does not confirm it)")
        out.append(Suspect(hypothesis=hid, because="; ".join(h.because), rank=rank,
                           next=h.next or next_steps.get(hid)))
    return out


def no_regression_summary(regression: Regression) -> str:
    """Why nothing is blamed when the regression was measured and is not there."""
    if regression.outcome == "better":
        return (f"No regression: the host measures better than the baseline ({regression.why}); "
                "were --symptom and --baseline swapped? Nothing is blamed.")
    if regression.outcome == "noise":
        return f"Not shown to be a regression: {regression.why}. Nothing is blamed."
    if regression.outcome == "more":
        return (f"Regression smaller than the noise can show in {len(regression.samples)} runs "
                f"({regression.why}); {more_runs_advice(regression.runs_needed)}. Nothing is blamed.")
    return f"No reproducible regression: {regression.why}. Nothing is blamed."


def not_judged_words(nj: NotJudged) -> tuple[list[str], list[str]]:
    """The flags (``--NAME``) and variables no knowledge list names: those never decided, and those a removal in a
    group decided "not a cause"."""
    names = [(f"--{f}", f) for f in nj.flags] + [(v, v) for v in nj.env]
    return [w for w, n in names if n not in nj.removed], [w for w, n in names if n in nj.removed]


def conclude(hyps: dict[str, Hyp], order: list[str], regression: Regression, *, baseline_snapshot: bool,
             next_steps: dict[str, str], not_judged: NotJudged, joint: dict[str, Any] | None = None) -> Conclusion:
    def closed(status: str) -> list[Open]:
        return [Open(hypothesis=h, because="; ".join(hyps[h].because), next=hyps[h].next,
                     rule=hyps[h].rule if status == "ruled_out" else None)
                for h in order if hyps[h].status == status]
    ruled, undecided = closed("ruled_out"), closed("inconclusive")
    if regression.refuted:
        summary = no_regression_summary(regression)
        return Conclusion(root_cause=None, root_causes=[], suspects=[], ruled_out=ruled, inconclusive=undecided,
                          not_judged=not_judged, summary=summary, exit_code=3)
    causes = [cause_of(h, hyps[h]) for h in order if hyps[h].status == "confirmed"]
    causes.sort(key=lambda c: (c.how != "experiment", -(c.explains or 0)))
    suspects = rank_suspects(hyps, order, baseline_snapshot, next_steps)
    if causes:
        parts: list[str] = []
        for c in causes:
            share = (f"explains {_pct(c.explains)}, 95% CI {_pct(c.explains_ci[0])} to {_pct(c.explains_ci[1])}"
                     if c.explains is not None and c.explains_ci else "share not measured")
            parts.append(f"{c.hypothesis} ({share}, by {c.how}): {c.summary}")
        summary = "Root cause" + ("s" if len(causes) > 1 else "") + ": " + " | ".join(parts) + "."
        if joint and joint.get("share") is not None and joint.get("share_ci"):
            lo, hi = joint["share_ci"]
            summary += (f" Together they recover {_pct(joint['share'])} (95% CI {_pct(lo)} to {_pct(hi)}); "
                        f"{max(0, 100 - round(joint['share'] * 100)):.0f}% unexplained.")   # adds up to what is shown
    else:
        summary = "No confirmed root cause."
        if suspects:
            top = suspects[0]
            summary += (f" Top suspect: {top.hypothesis}" + (f" ({top.rank})" if top.rank else "")
                        + f": {top.because}" + (f"; to confirm it: {top.next}" if top.next else "") + ".")
            if len(suspects) > 1:
                summary += " Other suspects: " + ", ".join(s.hypothesis for s in suspects[1:]) + "."
    if undecided:
        summary += " Could not decide: " + ", ".join(o.hypothesis for o in undecided) + "."
    untested, removed = not_judged_words(not_judged)
    if untested:
        summary += " Not judged: " + ", ".join(untested) + "."
    if removed:
        summary += " Removed by experiment, not a cause (no knowledge list names them): " + ", ".join(removed) + "."
    return Conclusion(root_cause=causes[0] if causes else None, root_causes=causes, suspects=suspects,
                      ruled_out=ruled, inconclusive=undecided, not_judged=not_judged, summary=summary,
                      exit_code=0 if causes else 3,
                      joint=Joint.model_validate(joint) if joint and causes and joint.get("share") is not None else None)


class TableRow(BaseModel):
    """One hypothesis in the closing table."""

    id: str
    status: str
    how: str | None
    because: list[str]
    share: float | None
    share_ci: tuple[float, float] | None
    next: str | None


class RunConclusion(Conclusion):
    """The conclusion with the run's counts: the ``conclusion`` event and the source of ``--json``."""

    commands: int
    bench_runs: int
    regression: dict[str, Any]
    notes: list[str]
    table: list[TableRow]


def run_conclusion(hyps: dict[str, Hyp], order: list[str], regression: Regression, *, baseline_snapshot: bool,
                   next_steps: dict[str, str], not_judged: NotJudged, commands: int, bench_runs: int,
                   notes: list[str], joint: dict[str, Any] | None = None) -> RunConclusion:
    """The verdicts as a conclusion, with the table of every hypothesis and the run's counts."""
    c = conclude(hyps, order, regression, baseline_snapshot=baseline_snapshot, next_steps=next_steps,
                 not_judged=not_judged, joint=joint)
    table = [TableRow(id=h, status=hyps[h].status, how=hyps[h].how, because=hyps[h].because, share=hyps[h].share,
                      share_ci=hyps[h].share_ci, next=hyps[h].next) for h in order]
    return RunConclusion(**dict(c), commands=commands, bench_runs=bench_runs,
                         regression=regression.to_json(samples=False), notes=notes, table=table)
