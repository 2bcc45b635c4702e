"""The restart control: a restart that recovered the regression is compared with the server as found,
restarted by the undo and measured the same way, so that what a plain restart recovers is not taken for the
change's effect."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from debugagent.tools.probes.text import plural
from debugagent.tools.registry import Runner
from debugagent.tools.units import plain

from ..results import ExperimentResult
from ..stats import CONTROL_LEVEL, CONTROL_RUNS, RESTART_PART, across_restarts, control, restart_shift

if TYPE_CHECKING:
    from .lab import Lab


def restart_control(lab: Lab, r: Runner, result: ExperimentResult, bad: list[float],
                    regression: float | None) -> ExperimentResult:
    """A restart recovered the regression: was it the change, or the restart itself? A server that slows
    down while it runs (a cache that grows, fragmented memory, a leak) is fast again after any restart, so
    the experiment's server is compared with the server as found, restarted by the undo just now and
    measured the same way: what part of the change's recovery a plain restart also gives, with its interval.
    The change stays a cause when that part is surely below half, is not one when it is surely above half
    (the restart did it), and is undecided in between after the most control runs. These runs are also the
    reference re-measured after the change (``stats.control``), so none is taken before it."""
    b = lab.measuring
    vals = result.samples
    cap = b.spec.max_runs or 0
    # --max-runs counts every benchmark run of the experiment, the control's included
    left = cap - (b.bench_runs - b.runs_at_start) if cap else CONTROL_RUNS[1]
    if cap and b.warmth.due:   # the restarted server's warm-up run comes first, and counts
        left -= 1
    earlier = list(lab.found_restarted)
    n = max(min(CONTROL_RUNS[0], left), len(earlier))
    if n < 1:
        return result.model_copy(update={"text": f"{result.text}; not compared with a plain restart of the server "
                                         f"as found (--max-runs {cap} left no runs for that control)"})
    most = max(n, min(CONTROL_RUNS[1], len(earlier) + left))
    lab.emit("experiment", phase="plan", text=(
        f"control: the server as found, restarted, as an earlier control measured it ({plural(len(earlier), 'run')}), "
        f"measured again after this undo only while that does not decide (at most {most} runs in all)" if earlier
        else f"control: the server as found, restarted by the undo, is measured {n} to {most} times, so that what "
        "a plain restart recovers is not taken for the change's effect"))
    # the server the experiment started is gone (the undo stopped it): while the benchmark waits for the one
    # the undo started, that one is watched instead (under a hook, none is: a supervisor may replace it)
    lab.server.started = lab.server.found_again
    ctrl: list[float] = list(earlier)
    while True:   # sequential, as the experiment itself: more runs while the restart's part is unclear
        while len(ctrl) < n:
            ctrl.append(b.measured(r, b.spec.cwd, f"control: the server as found, restarted (run {len(ctrl) + 1})"))
            lab.found_restarted.append(ctrl[-1])
        final = n >= most
        c = control(bad, ctrl, vals, regression, b.lower, final=final, noise=b.noise,
                    regression_se=b.spec.regression_se)
        if c.outcome != "more":
            break
        n += 1
    b.judge_warm_up(ctrl[len(earlier):], bad)
    runs = plural(len(ctrl), "run")
    if earlier:
        runs += (", measured after an earlier experiment's undo" if len(ctrl) == len(earlier) else
                 f", {len(earlier)} of them measured after an earlier experiment's undo")
    said = (f"control: the server as found, restarted, gives mean {plain(statistics.fmean(ctrl), 4)} ({runs}): "
            f"a plain restart recovers {c.part:.0%} of what the change did ({2 * CONTROL_LEVEL - 1:.0%} CI "
            f"{c.low:.0%} to {c.high:.0%})")
    lab.shifted = c if restart_shift(c) else None
    if lab.shifted is not None:   # decided over the starts of the server (``restart_again``)
        return result.model_copy(update={"control": ctrl, "text": f"{result.text}; {said}"})
    if c.outcome == "change":
        return result.model_copy(update={"control": ctrl, "text": f"{result.text}; {said}, so the restart alone "
                                         "does not explain it"})
    d = c.decision
    assert d is not None
    if c.outcome == "beyond":   # part of it may be the restart's, but the change does better than a plain restart
        d = d.model_copy(update={"outcome": "cause"})
        b.last_decision = d   # the share is the change's over the restarted server as found
        return result.model_copy(update={"control": ctrl, "share": round(d.share, 3), "share_ci": None,
                                         "decision": d.text, "text": f"{result.text}; {said}, and the change "
                                         f"beats the restarted server ({d.text}), so it is a cause by that much"})
    if c.outcome == "restart":
        d = d.model_copy(update={"outcome": "not_cause"})
        why = ("so the restart, not the change, recovered it: the server slows down while it runs, or the "
               "reproduce step's runs were slower than the server as found is now")
        rule = (f"the {CONTROL_LEVEL:.0%} lower bound of what a plain restart recovers is {c.low:.0%} of what the change "
                f"did, above the {RESTART_PART:.0%} a change may share with a restart, and the change does not beat it")
        b.last_decision = d
        return result.model_copy(update={"control": ctrl, "significant": False, "outcome": d.outcome,
                                         "share": round(d.share, 3), "share_ci": None, "decision": why, "rule": rule,
                                         "text": f"{result.text}; {said}, {why}"})
    else:
        d = d.model_copy(update={"outcome": "more"})
        why = "so what the change adds to a plain restart is undecided"
    b.last_decision = d   # the outcome and the share are the change's over the restarted server as found
    return result.model_copy(update={"control": ctrl, "significant": False, "outcome": d.outcome,
                                     "share": round(d.share, 3), "share_ci": None, "decision": why,
                                     "text": f"{result.text}; {said}, {why}"})


def restart_again(lab: Lab, r: Runner, result: ExperimentResult, bad: list[float], regression: float | None,
                  again: Callable[[], ExperimentResult]) -> ExperimentResult:
    """A plain restart recovered part of the regression by itself (``stats.restart_shift``): the server's speed
    changes at restarts (a server that comes up in one of two modes), which the runs of one start do not show, so
    one start with the change and one without cannot tell the change from the restart. The change is made again
    (``again``: the kind's apply and undo, no bisection) and the server as found, restarted by that undo, measured
    again; the change is then judged over the starts' means (``stats.across_restarts``): the starts with the change
    against the server as found before it and after each undo. Undecided there, it is no cause."""
    c = lab.shifted
    assert c is not None
    lab.shifted = None
    b = lab.measuring
    cap = b.spec.max_runs or 0
    warm = 1 if b.warmth.needed is not False else 0   # each restart's warm-up run counts toward --max-runs
    left = cap - (b.bench_runs - b.runs_at_start) if cap else None
    why = ("the server's speed may change at restarts, which the runs of one start do not show, and one start "
           "with the change cannot be told from that")
    if left is not None and left < 3 + 2 * warm:   # two runs with the change, one of the server as found
        return _undecided(lab, result, f"{result.text}, so {why}; --max-runs {cap} left no runs to make the change "
                                       "again")
    lab.emit("experiment", phase="plan", text=(
        f"a plain restart alone recovered {c.part:.0%} of what the change did ({2 * CONTROL_LEVEL - 1:.0%} CI "
        f"{c.low:.0%} to {c.high:.0%}), so {why}: the change is made again, the server as found restarted again "
        "after it, and the change is judged over the starts' means"))
    saved = b.spec.max_runs
    if left is not None:
        b.spec.max_runs = left - 1 - warm   # the second start's control run (and its warm-up) are kept for
    lab.server.started = lab.server.found_again = None   # as each experiment starts: no server of its own yet
    try:
        second = again()
    finally:
        b.spec.max_runs = saved
    lab.server.started = lab.server.found_again   # the server the undo started, as the first control measured it
    ctrl = [b.measured(r, b.spec.cwd, "control: the server as found, restarted again")]
    lab.found_restarted.extend(ctrl)
    d = across_restarts([result.samples, second.samples], [bad, result.control, ctrl], regression, b.lower,
                        b.spec.regression_se)
    b.last_decision = d
    text = (f"{result.text}, so {why}; made again: mean {plain(statistics.fmean(second.samples), 4)} "
            f"({plural(len(second.samples), 'run')}), the server as found restarted again: "
            f"{plain(ctrl[0], 4)}; {d.text}")
    if d.outcome == "cause":
        return result.model_copy(update={"share": round(d.share, 3), "share_ci": d.share_ci, "share_se": d.share_se,
                                         "decision": d.text, "text": text, "outcome": "cause", "significant": True,
                                         "improvement": d.improvement, "control": [*result.control, *ctrl]})
    return _undecided(lab, result.model_copy(update={"control": [*result.control, *ctrl]}), text, d.text)


def _undecided(lab: Lab, result: ExperimentResult, text: str, decision: str | None = None) -> ExperimentResult:
    d = lab.measuring.last_decision
    if d is not None:
        lab.measuring.last_decision = d.model_copy(update={"outcome": "more"})
    return result.model_copy(update={"significant": False, "outcome": "more", "share_ci": None,
                                     "decision": decision or "undecided: the server's speed may change at restarts",
                                     "text": text})
