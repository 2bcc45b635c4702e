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
from ..stats import (
    ALPHA_CONTROL,
    ALPHA_STARTS,
    CONTROL_LEVEL,
    CONTROL_RUNS,
    RESTART_PART,
    across_restarts,
    control,
    decide,
    restart_shift,
    starts_differ,
)

if TYPE_CHECKING:
    from .lab import Lab


def restart_control(lab: Lab, r: Runner, result: ExperimentResult, bad: list[float],
                    regression: float | None) -> tuple[ExperimentResult, str | None]:
    """A restart recovered the regression: was it the change, or the restart itself? A server that slows
    down while it runs (a cache that grows, fragmented memory, a leak) is fast again after any restart, so
    the experiment's server is compared with the server as found, restarted by the undo just now and
    measured the same way: what part of the change's recovery a plain restart also gives, with its interval.
    The change stays a cause when that part is surely below half, is not one when it is surely above half
    (the restart did it), and is undecided in between after the most control runs. These runs are also the
    reference re-measured after the change (``stats.control``), so none is taken before it. Returns the result and,
    where a plain restart recovered a part by itself (``stats.restart_shift``), the words that say so, for the
    second start (``restart_again``); else None."""
    b = lab.measuring
    vals = result.samples
    cap = b.spec.max_runs or 0
    left = _runs_left(lab)
    earlier = list(lab.found_restarted)
    n = max(min(CONTROL_RUNS[0], left), len(earlier))
    if n < 1:
        return result.model_copy(update={"text": f"{result.text}; not compared with a plain restart of the server "
                                         f"as found (--max-runs {cap} left no runs for that control)"}), None
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
        _measure_found(lab, r, ctrl, n, "control: the server as found, restarted")
        final = n >= most
        c = control(bad, ctrl, vals, regression, b.lower, final=final, noise=b.noise,
                    regression_se=b.spec.regression_se)
        if c.outcome != "more":
            break
        n += 1
    b.judge_warm_up(ctrl[len(earlier):], bad)
    _note_moved(lab, bad, ctrl[len(earlier):], "the server as found, restarted for a control")
    runs = plural(len(ctrl), "run")
    if earlier:
        runs += (", measured after an earlier experiment's undo" if len(ctrl) == len(earlier) else
                 f", {len(earlier)} of them measured after an earlier experiment's undo")
    said = (f"control: the server as found, restarted, gives mean {plain(statistics.fmean(ctrl), 4)} ({runs}): "
            f"a plain restart recovers {c.part:.0%} of what the change did ({2 * CONTROL_LEVEL - 1:.0%} CI "
            f"{c.low:.0%} to {c.high:.0%})")
    if restart_shift(c):   # decided over the starts of the server (``restart_again``)
        seen = (f"a plain restart alone recovered {c.part:.0%} of what the change did ({2 * CONTROL_LEVEL - 1:.0%} CI "
                f"{c.low:.0%} to {c.high:.0%})")
        return result.model_copy(update={"control": ctrl, "text": f"{result.text}; {said}"}), seen
    if c.outcome == "change":
        return result.model_copy(update={"control": ctrl, "text": f"{result.text}; {said}, so the restart alone "
                                         "does not explain it"}), None
    d = c.decision
    assert d is not None
    if c.outcome == "beyond":   # part of it may be the restart's, but the change does better than a plain restart
        # decided at the control's own level, not decide's cause level: its words say which
        d = d.model_copy(update={"outcome": "cause", "text": d.text.rsplit(": ", 1)[0]
                                 + f": below the control's level of {ALPHA_CONTROL}"})
        b.last_decision = d   # the share is the change's over the restarted server as found
        return result.model_copy(update={"control": ctrl, "share": round(d.share, 3), "share_ci": None,
                                         "decision": d.text, "text": f"{result.text}; {said}, and the change "
                                         f"beats the restarted server ({d.text}), so it is a cause by that much"}), None
    if c.outcome == "restart":
        d = d.model_copy(update={"outcome": "not_cause"})
        why = ("so the restart, not the change, recovered it: the server slows down while it runs, or the "
               "reproduce step's runs were slower than the server as found is now")
        rule = (f"the {CONTROL_LEVEL:.0%} lower bound of what a plain restart recovers is {c.low:.0%} of what the change "
                f"did, above the {RESTART_PART:.0%} a change may share with a restart, and the change does not beat it")
        b.last_decision = d
        return result.model_copy(update={"control": ctrl, "significant": False, "outcome": d.outcome,
                                         "share": round(d.share, 3), "share_ci": None, "decision": why, "rule": rule,
                                         "text": f"{result.text}; {said}, {why}"}), None
    else:
        d = d.model_copy(update={"outcome": "more"})
        why = "so what the change adds to a plain restart is undecided"
    b.last_decision = d   # the outcome and the share are the change's over the restarted server as found
    return result.model_copy(update={"control": ctrl, "significant": False, "outcome": d.outcome,
                                     "share": round(d.share, 3), "share_ci": None, "decision": why,
                                     "text": f"{result.text}; {said}, {why}"}), None


def _runs_left(lab: Lab) -> int:
    """Runs of the server as found, restarted, that --max-runs leaves to this experiment (it counts every benchmark
    run of the experiment, these included); CONTROL_RUNS[1] without a cap."""
    b = lab.measuring
    cap = b.spec.max_runs or 0
    if not cap:
        return CONTROL_RUNS[1]
    left = cap - (b.bench_runs - b.runs_at_start)
    return left - 1 if b.warmth.due else left   # the restarted server's warm-up run comes first, and counts


def _note_moved(lab: Lab, bad: list[float], runs: list[float], what: str) -> None:
    """Where ``runs`` of the server as found, restarted, differ from the reproduce step's ``bad`` by more than their
    runs' noise (``stats.starts_differ`` below ALPHA_STARTS), the words that say so join ``lab.speed_moved``: later
    rulings of the run need more than one start (``Lab._moved``)."""
    if not runs or lab.speed_moved:
        return
    p = starts_differ([bad, runs])
    if p < ALPHA_STARTS:
        lab.speed_moved.append(f"{what}, read {plain(statistics.fmean(runs), 4)} ({plural(len(runs), 'run')}) against "
                               f"the reproduce step's {plain(statistics.fmean(bad), 4)} (F-test p={p:.2g})")


def _measure_found(lab: Lab, r: Runner, ctrl: list[float], n: int, why: str) -> None:
    """Runs of the server as found, restarted by the undo, added to ``ctrl`` until it holds ``n``; each kept for a
    later control of the same run (``lab.found_restarted``)."""
    b = lab.measuring
    while len(ctrl) < n:
        ctrl.append(b.measured(r, b.spec.cwd, f"{why} (run {len(ctrl) + 1})"))
        lab.found_restarted.append(ctrl[-1])


def restart_again(lab: Lab, r: Runner, result: ExperimentResult, bad: list[float], regression: float | None,
                  again: Callable[[], ExperimentResult], seen: str) -> ExperimentResult:
    """A plain restart recovered part of the regression by itself (``stats.restart_shift``): the server's speed
    changes at restarts (a server that comes up in one of two modes), which the runs of one start do not show, so
    one start with the change and one without cannot tell the change from the restart. The change is made again
    (``again``: the kind's apply and undo, no bisection) and the server as found, restarted by that undo, measured
    again; the change is then judged over the starts' means (``stats.across_restarts``): the starts with the change
    against the server as found before it and after each undo. Undecided there, it is no cause. ``seen``: what showed
    the speed change (``restart_control``: a plain restart's part; ``reference_restarted``: the starts of the server
    as found differ)."""
    b = lab.measuring
    cap = b.spec.max_runs or 0
    warm = 1 if b.warmth.needed is not False else 0   # each restart's warm-up run counts toward --max-runs
    left = cap - (b.bench_runs - b.runs_at_start) if cap else None
    why = ("the server's speed may change from one start to the next (at a restart, or with the host's own speed), "
           "which the runs of one start do not show, and one start with the change cannot be told from that")
    if left is not None and left < 3 + 2 * warm:   # two runs with the change, one of the server as found
        return _undecided(lab, result, f"{result.text}, so {why}; --max-runs {cap} left no runs to make the change "
                                       "again")
    lab.emit("experiment", phase="plan", text=(
        f"{seen}, so {why}: the change is made again, the server as found restarted again after it, and the change "
        "is judged over the starts' means"))
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
    # where the starts differ, each start's mean was one sample: what they read, for the advice of what would decide it
    differ = starts_differ([result.samples, second.samples], [bad, result.control, ctrl]) < ALPHA_STARTS
    means = {"starts": [statistics.fmean(g) for g in (result.samples, second.samples) if g],
             "found_starts": [statistics.fmean(g) for g in (bad, result.control, ctrl) if g]} if differ else {}
    text = (f"{result.text}, so {why}; made again: mean {plain(statistics.fmean(second.samples), 4)} "
            f"({plural(len(second.samples), 'run')}), the server as found restarted again: "
            f"{plain(ctrl[0], 4)}; {d.text}")
    if d.outcome == "cause":
        return result.model_copy(update={"share": round(d.share, 3), "share_ci": d.share_ci, "share_se": d.share_se,
                                         "decision": d.text, "text": text, "outcome": "cause", "significant": True,
                                         "improvement": d.improvement, "control": [*result.control, *ctrl], **means})
    return _undecided(lab, result.model_copy(update={"control": [*result.control, *ctrl], **means}), text, d.text)


def _undecided(lab: Lab, result: ExperimentResult, text: str, decision: str | None = None) -> ExperimentResult:
    d = lab.measuring.last_decision
    if d is not None:
        lab.measuring.last_decision = d.model_copy(update={"outcome": "more"})
    return result.model_copy(update={"significant": False, "outcome": "more", "share_ci": None,
                                     "decision": decision or "undecided: the server's speed may change from one start to the next",
                                     "text": text})


def reference_restarted(lab: Lab, r: Runner, result: ExperimentResult, bad: list[float],
                        regression: float | None, worse: str | None = None) -> tuple[ExperimentResult, str | None]:
    """A restart experiment left undecided by the reference state's few runs (``stats.changed_runs_futile``, or at
    its budget with twice the reference's runs or more; the reproduce step's runs against a snapshot are 2 by
    default): the server as found, restarted by the undo just now, is
    measured as the restart control measures it (2 to CONTROL_RUNS[1] runs, sequentially), and these runs join the
    reference. They are a start of the server as found of their own, so they join only while that start and the
    reproduce step's do not differ by more than their runs' noise (``stats.starts_differ``, as ``across_restarts``
    tests them); where they differ, the server's speed changes at restarts and one start each way decides nothing:
    the second value says what showed that (None where the runs joined), and the caller makes the change again
    (``restart_again``).

    ``worse``: instead, the changed state was ruled out for reading worse than the reference beyond the noise
    (``Lab._reads_worse``, its words): a change that recovers nothing reads that way seldom, a host whose speed moved
    since the reproduce step always, so the ruling waits for the same measurement."""
    b = lab.measuring
    earlier = list(lab.found_restarted)
    most = min(CONTROL_RUNS[1], len(earlier) + _runs_left(lab))
    n = max(2, len(earlier))
    if most < 2:
        if worse:
            cap = b.spec.max_runs or 0
            return result.model_copy(update={"text": f"{result.text}; {worse}, and the server as found was not "
                                             f"measured again (--max-runs {cap} left no runs for it)"}), None
        return result, None
    vals = result.samples
    lab.emit("experiment", phase="plan", text=(
        (f"{worse}: a change that recovers nothing seldom reads so, a host whose speed moved since the reproduce step "
         f"always does" if worse else
         f"its {len(vals)} runs could not decide it against the reference state's {plural(len(bad), 'run')}, which carry "
         f"{len(vals) / (len(vals) + len(bad)):.0%} of the variance of the difference of the means, and more of its runs "
         f"would not narrow that")
        + f", so the reference state is measured again: the server as found, restarted by the undo, "
        f"{n} to {most} runs in all"
        + (f" ({plural(len(earlier), 'run')} of them measured after an earlier experiment's undo)" if earlier else "")
        + "; they join the reference while that start and the reproduce step's agree"))
    lab.server.started = lab.server.found_again
    ctrl: list[float] = list(earlier)
    while True:
        _measure_found(lab, r, ctrl, n, "the reference state again: the server as found, restarted")
        d = decide([*bad, *ctrl], vals, regression, b.lower, final=n >= most, noise=b.noise,
                   regression_se=b.spec.regression_se)
        if d.decided or n >= most:
            break
        n += 1
    # asked once, of the runs as they ended (at each look, the chance alone would add up)
    p_starts = starts_differ([bad, ctrl])
    if p_starts < ALPHA_STARTS:
        d = None
    b.judge_warm_up(ctrl[len(earlier):], bad)
    _note_moved(lab, bad, ctrl[len(earlier):], "the server as found, restarted and measured again")
    said = (f"the server as found, restarted: mean {plain(statistics.fmean(ctrl), 4)} ({plural(len(ctrl), 'run')}) "
            f"against the reproduce step's {plain(statistics.fmean(bad), 4)}")
    if d is None:   # the caller makes the change again (``restart_again``), where the budget allows
        seen = f"the two starts of the server as found differ by more than their runs' noise (F-test p={p_starts:.2g})"
        why = f"{said}: {seen}"
        d0 = b.last_decision
        if d0 is not None:
            b.last_decision = d0.model_copy(update={"outcome": "more"})
        return result.model_copy(update={"control": ctrl, "significant": False, "outcome": "more",
                                         "decision": why, "text": f"{result.text}; {why}"}), seen
    b.last_decision = d
    text = (f"{result.text}; {said} (the starts agree, F-test p={p_starts:.2g}), so all "
            f"{len(bad) + len(ctrl)} runs of the reference state together: {d.text}")
    return result.model_copy(update={"control": ctrl, "significant": d.significant, "outcome": d.outcome,
                                     "share": round(d.share, 3), "share_ci": None, "decision": d.text,
                                     "rule": d.rule or None, "text": text, "improvement": d.improvement}), None
