"""Sequential statistics for deciding experiments, the reproduce step and bisection steps.

Pure functions over lists of floats; quantiles and tests come from ``scipy.stats`` (exact t
quantiles at any degrees of freedom, Shapiro–Wilk and Mann–Whitney U for noise that is not
normal), not from tables.

Every decision has three outcomes: decided one way, decided the other way, or "more runs".
The caller adds runs while the answer is "more" and stops at a budget; undecided at the
budget is reported as inconclusive, never as a "no".

Conventions: ``improvement`` and ``delta`` are in the metric's unit with positive meaning
*better* (an experiment) or *worse* (a regression); ``regression`` is the size of the
regression being explained, positive, or ``None`` when no baseline number measured it.
"""

from __future__ import annotations

import math
import statistics
from functools import cache, lru_cache
from typing import Literal

from debugagent.tools.units import plain, whole_pct
from pydantic import BaseModel

# One-sided error rate of a "cause" call at each look. Looks are correlated (each adds a run
# to the same samples), so over a budget of up to ~15 looks the family-wise rate stays near
# 1%; bench/stats measures it.
ALPHA_CAUSE = 0.0007
# One-sided level of the upper bound that rules a suspect out ("recovers less than
# NOT_CAUSE_SHARE of the regression").
ALPHA_NOT = 0.20
NOT_CAUSE_SHARE = 0.20
ALPHA_FRESH = 0.2
# A cause must recover at least this share (a significant but negligible recovery is not
# the regression's cause).
MIN_SHARE = 0.10
# The reproduce step.
ALPHA_REPRODUCE = 0.002
# A baseline given as one number is one measurement of unknown noise: the current state's noise is assumed for it,
# and the shift must also lie beyond what one run of the current state gives this often (one-sided).
ALPHA_ONE_READING = 0.01
ALPHA_WARM = 0.05       # one-sided level of "the first run after a restart is slower than the runs after it"
SD_UPPER = 0.50   # the budget's look uses this bound of the SD (its median: the estimate, corrected for its skew)
NO_DROP_RUNS = 3        # runs after which a mean on the better side of a number baseline stops the reproduce step
# Against a number, the reproduce step also stops (not shown) once even the budget's runs could not take the shift
# outside one reading's noise with the drop at this upper bound and the SD at this lower bound (both one-sided).
FUTILE_Q = 0.80
RELEVANT_PCT = 1.0      # a regression must be at least this percent of the baseline to be reported
MIN_BUDGET = 4         # an experiment may stop earlier once decided, but never gives up before this
AUTO_CAP = 24           # the most runs of the changed state when no --max-runs is given
PROMISING = 0.05        # at its budget, an experiment this close to "a cause" (a partial cause) runs on to the cap
POWER = 0.95
PARTIAL = 0.3           # the run budget is sized to find a cause of this share ...
PARTIAL_POWER = 0.8     # ... this often

Outcome = Literal["cause", "not_cause", "more"]


@cache
def _sps():  # noqa: ANN202 - the module itself (its type is inferred)
    """``scipy.stats``, loaded on the first decision (a command that stops at its input's check never loads it)."""
    from scipy import stats  # noqa: PLC0415
    return stats


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """The exact quantile of Student's t (scipy), cached: decisions ask for the same few."""
    return float(_sps().t.ppf(q, df))


def _var(x: list[float]) -> float:
    return statistics.variance(x) if len(x) > 1 else 0.0


def pooled_sd(*groups: list[float]) -> tuple[float, int]:
    """The noise SD pooled over groups (each around its own mean) and its degrees of freedom."""
    ss = sum(_var(g) * (len(g) - 1) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (math.sqrt(ss / df) if df else 0.0), df


def _floor(sd: float, *means: float) -> float:
    """A noise floor so that a noiseless benchmark does not divide by zero."""
    return max(sd, 1e-6 * max((abs(m) for m in means), default=1.0), 1e-12)


def looks_normal(*groups: list[float]) -> bool:
    """Shapiro–Wilk on the residuals; too few samples to tell counts as normal."""
    res = [v - statistics.fmean(g) for g in groups if len(g) > 1 for v in g]
    if len(res) < 10 or max(res) - min(res) == 0:
        return True
    return float(_sps().shapiro(res).pvalue) > 0.01


class Effect(BaseModel):
    """The difference between two samples, with a pooled t interval."""

    improvement: float      # mean(reference) - mean(changed), sign-corrected: positive = better after the change
    se: float
    df: int
    sd: float
    p_better: float         # one-sided p of "the change made it better"
    normal: bool


def noise_sd(reference: list[float], changed: list[float], noise: tuple[list[float], ...] = ()) -> tuple[float, int]:
    """The noise SD of two samples and its degrees of freedom. ``noise``: runs of other states of the same host and
    benchmark (the baseline snapshot's), each group around its own mean: they add degrees of freedom, never a lower
    SD than the two samples' own (a quiet baseline must not make a noisy state look quiet)."""
    sd, df = pooled_sd(reference, changed)
    if noise:
        sd_all, df = pooled_sd(reference, changed, *noise)
        sd = max(sd, sd_all)
    return sd, df


def effect(reference: list[float], changed: list[float], lower_is_better: bool,
           noise: tuple[list[float], ...] = ()) -> Effect:
    """``noise``: as in ``noise_sd``."""
    mr, mc = statistics.fmean(reference), statistics.fmean(changed)
    imp = (mr - mc) if lower_is_better else (mc - mr)
    sd, df = noise_sd(reference, changed, noise)
    sd = _floor(sd, mr, mc)
    se = sd * math.sqrt(1 / len(reference) + 1 / len(changed))
    df = max(df, 1)
    p = float(_sps().t.sf(imp / se, df))
    normal = looks_normal(reference, changed)
    if not normal and math.comb(len(reference) + len(changed), len(changed)) * ALPHA_CAUSE > 2:
        # Mann-Whitney only where it can reach the cause level at all (10 vs 4 runs cannot)
        alt = "less" if lower_is_better else "greater"
        p = float(_sps().mannwhitneyu(changed, reference, alternative=alt).pvalue)
    return Effect(improvement=imp, se=se, df=df, sd=sd, p_better=p, normal=normal)


class Decision(BaseModel):
    """One look at an experiment: cause, not a cause, or more runs."""

    outcome: Outcome
    improvement: float
    share: float                    # of the regression recovered; 0 (and share_ci None) without a measured regression
    share_ci: tuple[float, float] | None
    share_se: float | None
    improvement_se: float
    df: int
    p: float
    n_changed: int
    n_reference: int
    text: str
    rule: str = ""                  # the bound that decided "not a cause", in words

    @property
    def significant(self) -> bool:
        return self.outcome == "cause"

    @property
    def decided(self) -> bool:
        return self.outcome != "more"


def pct(x: float) -> str:
    """A share as a whole percent, as every output prints it: runfacts.pct of the share as the results keep it
    (3 decimals), so this sentence and the conclusion never round one share two ways."""
    return whole_pct(round(x, 3))


def share_interval(improvement: float, se: float, df: int, regression: float, regression_se: float = 0.0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(share, low, high): the share of ``regression`` that ``improvement`` recovers, with a two-sided
    interval that also carries the regression's own uncertainty (delta method)."""
    share = improvement / regression
    s_se = math.sqrt((se / regression) ** 2 + (improvement * regression_se / regression ** 2) ** 2)
    q = t_quantile(0.5 + level / 2, max(df, 1))
    return share, share - q * s_se, share + q * s_se


def fresh_agrees(reference: list[float], fresh: list[float], changed: list[float], lower_is_better: bool,
                 noise: tuple[list[float], ...] = ()) -> bool:
    """Is the changed state also better than the reference runs taken during the experiment (noise
    pooled from all runs; one-sided p < ALPHA_FRESH)? The reproduce step stops early when its
    runs look bad, which biases them: a cause must beat the fresh reference too."""
    if not fresh:
        return True
    mr, mc = statistics.fmean(fresh), statistics.fmean(changed)
    imp = (mr - mc) if lower_is_better else (mc - mr)
    sd, df = noise_sd(reference, changed, noise)
    se = _floor(sd, mr, mc) * math.sqrt(1 / len(fresh) + 1 / len(changed))
    return float(_sps().t.sf(imp / se, max(df, 1))) < ALPHA_FRESH


def decide(reference: list[float], changed: list[float], regression: float | None, lower_is_better: bool, *,
           regression_se: float = 0.0, final: bool = False, fresh: int = 0,
           noise: tuple[list[float], ...] = ()) -> Decision:
    """Decide an experiment from the reference state's runs and the changed state's runs.

    cause: recovers significantly (one-sided p < ALPHA_CAUSE) and at least MIN_SHARE of the
    regression. not a cause: the upper bound of what it recovers is below NOT_CAUSE_SHARE of
    the regression (or it made things worse). Otherwise more runs, or at the budget
    (``final``) still "more", which the caller reports as inconclusive. ``noise``: as in ``effect``.
    """
    e = effect(reference, changed, lower_is_better, noise)
    reg = regression if regression and regression > 0 else None
    q_not = t_quantile(1 - ALPHA_NOT, e.df)
    upper = e.improvement + q_not * e.se
    relevant = reg if reg is not None else 0.05 * abs(statistics.fmean(reference))
    share = share_se = None
    share_ci: tuple[float, float] | None = None
    if reg is not None:
        share, share_lo, share_hi = share_interval(e.improvement, e.se, e.df, reg, regression_se)
        share_ci = (share_lo, share_hi)
        share_se = (share_hi - share) / t_quantile(0.975, e.df)
    big_enough = e.improvement >= MIN_SHARE * relevant
    agrees = fresh_agrees(reference, reference[len(reference) - fresh:] if fresh else [], changed, lower_is_better,
                          noise)
    if e.p_better < ALPHA_CAUSE and big_enough and agrees:
        outcome: Outcome = "cause"
    elif upper < NOT_CAUSE_SHARE * relevant:
        outcome = "not_cause"
    else:
        outcome = "more"
    mc, mr = statistics.fmean(changed), statistics.fmean(reference)
    how = {"cause": "a cause", "not_cause": "not a cause", "more": "undecided" + (" at the run budget" if final else "")}
    share_txt = (f", {pct(share)} of the regression (95% CI {pct(share_ci[0])} to {pct(share_ci[1])})"
                 if share_ci is not None and share is not None else "")
    test = "t-test" if e.normal else "t-test and Mann-Whitney U (the noise is not normal)"
    of = "of the regression" if reg is not None else "of a 5% change of the reference mean (no regression was measured)"
    rule = ""
    if outcome == "not_cause":
        rule = (f"the {1 - ALPHA_NOT:.0%} upper bound of what it recovers is {max(upper, 0.0) / relevant:.1%} {of}, "
                f"below the {NOT_CAUSE_SHARE:.0%} a cause must recover" if upper >= 0 else
                f"it made things worse: the {1 - ALPHA_NOT:.0%} upper bound of what it recovers is below zero")
    text = (f"mean {plain(mc, 4)} vs {plain(mr, 4)} in the reference state ({len(changed)} vs {len(reference)} runs): "
            f"{'recovers' if e.improvement > 0 else 'changes'} {plain(e.improvement, sign=True)}{share_txt}; "
            f"{test} p={e.p_better:.2g}: {how[outcome]}" + (f" ({rule})" if rule else ""))
    return Decision(outcome=outcome, improvement=e.improvement, share=share if share is not None else 0.0,
                    share_ci=share_ci, share_se=share_se,
                    improvement_se=e.se, df=e.df, p=e.p_better, n_changed=len(changed), n_reference=len(reference), text=text,
                    rule=rule)


def run_budget(sd: float, regression: float | None, n_reference: int, cap: int | None = None) -> int:
    """Runs of the changed state that detect a partial cause (PARTIAL of the regression) with
    PARTIAL_POWER; a full cause or a harmless suspect is decided sooner by the sequential looks.

    Exact t quantiles at the degrees of freedom the test will have; at least MIN_BUDGET and at
    most ``cap`` (``--max-runs``) or AUTO_CAP.
    """
    most = cap or AUTO_CAP
    if not regression or regression <= 0 or sd <= 0:
        return max(2, min(most, 6))
    for n in range(2, most + 1):
        m = max(1, n_reference + n // 2)
        df = max(1, n + m - 2)
        q = t_quantile(1 - ALPHA_CAUSE, df) + t_quantile(PARTIAL_POWER, df)
        if q * sd * math.sqrt(1 / n + 1 / m) <= PARTIAL * regression:
            return max(min(MIN_BUDGET, most), n)
    return most


def changed_runs_futile(reference: list[float], changed: list[float], regression: float | None,
                        lower_is_better: bool, most: int, noise: tuple[list[float], ...] = ()) -> bool:
    """Could more runs of the changed state alone (up to ``most`` in all), against the reference state's runs as they
    are, still decide the experiment? Not when the reference's few runs keep the standard error of the difference of
    the means too wide, even with the noise SD at its FUTILE_Q lower bound: with the improvement at its FUTILE_Q upper
    bound, ``most`` runs could not make it a cause
    (one-sided ALPHA_CAUSE), and with it at its FUTILE_Q lower bound, they could not rule it out (the ALPHA_NOT upper
    bound below NOT_CAUSE_SHARE of the regression). Asked only once the changed state has more runs than the reference
    (which then carries most of the variance): more runs of the reference state would decide it; more of the changed
    state would not. (The H200 lab's slow build: 24 runs of the good build against the reproduce step's 2
    left it at p=0.07, and 5 of them already showed that 24 could not.)"""
    if len(changed) >= most or len(changed) <= len(reference):   # the changed state's own runs still narrow it most
        return False
    e = effect(reference, changed, lower_is_better, noise)
    reach = t_quantile(FUTILE_Q, e.df) * e.se
    df_most = e.df + most - len(changed)
    sd_lo = e.sd * math.sqrt(e.df / float(_sps().chi2.ppf(FUTILE_Q, e.df)))   # the noise as small as the runs allow
    se_most = sd_lo * math.sqrt(1 / len(reference) + 1 / most)
    reg = regression if regression and regression > 0 else None
    relevant = reg if reg is not None else 0.05 * abs(statistics.fmean(reference))
    no_cause = e.improvement + reach < t_quantile(1 - ALPHA_CAUSE, df_most) * se_most
    no_ruling_out = e.improvement - reach + t_quantile(1 - ALPHA_NOT, df_most) * se_most >= NOT_CAUSE_SHARE * relevant
    return no_cause and no_ruling_out


def fresh_reference_runs(sd: float | None, delta: float | None) -> int:
    """Reference runs to take just before a change: 2 when the regression (``delta``) is within 4 noise
    SDs (where a biased reproduce sample could decide), else 1."""
    sd, delta = sd or 0.0, delta or 0.0
    return 2 if sd and delta < 4 * sd else 1


# ---------------------------------------------------------------- the control of a restart
RESTART_PART = 0.5   # the part of a change's recovery that a plain restart may give before the change is doubted
CONTROL_LEVEL = 0.90  # one-sided level of the bounds on that part
ALPHA_CONTROL = 0.01  # one-sided level of "the change beats a plain restart", at each look from CONTROL_DECIDES runs
CONTROL_RUNS = (1, 8)  # the fewest and the most runs of the restarted server as found (one decides when the
# regression is far outside the noise: a plain restart that reads like the reproduce runs again settles it)
CONTROL_DECIDES = 3  # the fewest control runs that overturn or cut a cause ("beats the restarted server", "the
# restart, not the change"): never one, whose own noise is unseen, nor two: two runs of the restarted server that
# read as fast as the change by luck ruled a real cause out in one simulated diagnosis of 40 at 9% noise, where a
# third run reads as slow as the server was
ControlOutcome = Literal["change", "restart", "beyond", "undecided", "more"]


class Control(BaseModel):
    """What a plain restart of the server as found recovers, as a part of what the change recovered."""

    outcome: ControlOutcome
    part: float
    low: float
    high: float
    decision: Decision | None = None   # the change over the restarted server, where that decides
    # the restarted server's shift from the reference, in noise SDs of a difference of means (the runs' SD pooled
    # over the reference, the changed state and the control, each around its own mean): positive = it recovered
    shift_z: float = 0.0


def control(reference: list[float], ctrl: list[float], changed: list[float], regression: float | None,
            lower_is_better: bool, *, final: bool = False, noise: tuple[list[float], ...] = (),
            regression_se: float = 0.0) -> Control:
    """The control of an experiment that restarted the server: ``ctrl`` holds the runs of the server as found,
    restarted. It is also the reference re-measured after the change, so a lucky reproduce sample cannot
    decide alone.

    change: a plain restart surely (one-sided CONTROL_LEVEL) gives less than RESTART_PART of the change's
    recovery; the change keeps its result. beyond: the change beats the restarted server (one-sided p <
    ALPHA_CONTROL from CONTROL_DECIDES control runs on, by at least MIN_SHARE of the regression): a cause by that much. restart: a plain restart
    surely gives more than RESTART_PART and the change does not beat it, so the restart (or the reproduce
    runs' luck), not the change, recovered it (from CONTROL_DECIDES control runs on). more: add
    a control run; undecided at ``final``. ``noise``: as in ``effect``.
    The experiment itself already decided "a cause" at ALPHA_CAUSE against the reproduce runs; the control
    asks a second question of the same change, at its own level.
    """
    gain = effect(reference, changed, lower_is_better, noise).improvement
    e = effect(reference, ctrl, lower_is_better, noise)
    part, lo, hi = share_interval(e.improvement, e.se, e.df, gain if gain > 0 else 1e-12, level=2 * CONTROL_LEVEL - 1)
    sd = _floor(pooled_sd(reference, changed, ctrl)[0], statistics.fmean(reference))
    z = e.improvement / (sd * math.sqrt(1 / len(ctrl) + 1 / len(reference)))
    if hi < RESTART_PART:
        return Control(outcome="change", part=part, low=lo, high=hi, shift_z=z)
    d = decide(ctrl, changed, regression, lower_is_better, final=True, noise=noise, regression_se=regression_se)
    relevant = regression if regression and regression > 0 else 0.05 * abs(statistics.fmean(reference))
    if len(ctrl) >= CONTROL_DECIDES and d.p < ALPHA_CONTROL and d.improvement >= MIN_SHARE * relevant:
        return Control(outcome="beyond", part=part, low=lo, high=hi, decision=d)
    if lo > RESTART_PART and len(ctrl) >= CONTROL_DECIDES:
        return Control(outcome="restart", part=part, low=lo, high=hi, decision=d)
    return Control(outcome="undecided" if final else "more", part=part, low=lo, high=hi, decision=d)


# ---------------------------------------------------------------- a server whose speed changes at restarts
SHIFT_Z = 2.0            # a restart that moved the server this many noise SDs toward the change asks for a second start
ALPHA_RESTARTS = 0.001   # one-sided level of "the change beats the server as found", over the means of its starts


def restart_shift(ctrl: Control) -> bool:
    """Did a plain restart recover a part of what the change did by itself (as much as a cause must recover, and by
    SHIFT_Z noise SDs of the runs or more), though surely less than half of it (``change``)? Then the server's speed
    may change at restarts, which the runs of one start do not show, and one start of the changed state cannot be
    told from that. (Runs alone move that far about one time in twenty; the H200 lab's restarts, by 2.7.) (Where a restart recovers half or more, ``control``
    already asks whether the change beats the restarted server.)"""
    return ctrl.outcome == "change" and ctrl.part >= MIN_SHARE and ctrl.shift_z >= SHIFT_Z


ALPHA_STARTS = 0.01      # level of "the starts of one state differ by more than their runs' noise" (F-test)
ALPHA_WORSE = 0.01       # one-sided level of "a restart experiment's changed state reads worse than the reference":
# below it, "not a cause" waits until the server as found, restarted, is measured again (``reference_restarted``)


def starts_differ(*states: list[list[float]]) -> float:
    """p of "the starts of each state differ by more than their runs' noise": the F-test of a nested analysis of
    variance, the spread of each start's mean around its state's mean against the runs around their start's mean.
    0 where the runs hold no noise of their own (one run a start): the starts then cannot be shown alike."""
    starts = [g for st in states for g in st if g]
    sw, dfw = pooled_sd(*starts)
    ss, dfb = 0.0, 0
    for st in states:
        gs = [g for g in st if g]
        m = statistics.fmean(v for g in gs for v in g)
        ss += sum(len(g) * (statistics.fmean(g) - m) ** 2 for g in gs)
        dfb += len(gs) - 1
    if not dfw or not dfb:
        return 0.0 if not dfw else 1.0
    return float(_sps().f.sf((ss / dfb) / _floor(sw, *(statistics.fmean(g) for g in starts)) ** 2, dfb, dfw))


def across_restarts(changed: list[list[float]], unchanged: list[list[float]], regression: float | None,
                    lower_is_better: bool, regression_se: float = 0.0) -> Decision:
    """The change judged over two or more starts of the server each way: ``changed`` the runs of each start with the
    change, ``unchanged`` those of the server as found (before the change, and after each undo). Where the starts
    of each state differ by no more than their runs' noise (``starts_differ`` p >= ALPHA_STARTS), the runs are
    pooled and decided as any experiment's (``decide``). Where they differ, the server's speed changes at restarts
    and each start's mean is one sample: Student's t over the means, their spread the noise. A cause: one-sided p
    < ALPHA_RESTARTS and at least MIN_SHARE of the regression; else undecided (a few starts cannot bound a share)."""
    p_starts = starts_differ(changed, unchanged)
    if p_starts >= ALPHA_STARTS:
        d = decide([v for g in unchanged for v in g], [v for g in changed for v in g], regression, lower_is_better,
                   regression_se=regression_se, final=True)
        if d.outcome == "not_cause":   # a few starts each way rule nothing out: its words say so, not "not a cause"
            kept = d.text.split(": not a cause", 1)[0]
            d = d.model_copy(update={"outcome": "more", "rule": "", "text": (
                f"{kept}: undecided (the runs alone would say \"not a cause\", but over {len(changed)} starts with the "
                "change a ruling out is not made)")})
        head = (f"the starts of each state differ by no more than their runs' noise (F-test p={p_starts:.2g}), so "
                f"all runs together: ")
        return d.model_copy(update={"text": head + d.text.replace("undecided at the run budget", "undecided")})
    c = [statistics.fmean(x) for x in changed if x]
    u = [statistics.fmean(x) for x in unchanged if x]
    mc, mu = statistics.fmean(c), statistics.fmean(u)
    imp = (mu - mc) if lower_is_better else (mc - mu)
    sd, df = pooled_sd(c, u)
    se = _floor(sd, mc, mu) * math.sqrt(1 / len(c) + 1 / len(u))
    df = max(df, 1)
    p = float(_sps().t.sf(imp / se, df))
    reg = regression if regression and regression > 0 else None
    relevant = reg if reg is not None else 0.05 * abs(mu)
    share = 0.0
    share_ci: tuple[float, float] | None = None
    share_se: float | None = None
    if reg is not None:
        share, lo, hi = share_interval(imp, se, df, reg, regression_se)
        share_ci, share_se = (lo, hi), (hi - share) / t_quantile(0.975, df)
    outcome: Outcome = "cause" if p < ALPHA_RESTARTS and imp >= MIN_SHARE * relevant else "more"
    share_txt = (f", {pct(share)} of the regression (95% CI {pct(share_ci[0])} to {pct(share_ci[1])})"
                 if share_ci is not None else "")
    text = (f"the starts differ by more than their runs' noise (F-test p={p_starts:.2g}), so each start is one "
            f"sample: mean {plain(mc, 4)} with the change ({len(c)} starts: {', '.join(plain(x, 4) for x in c)}) vs "
            f"{plain(mu, 4)} as found ({len(u)} starts: {', '.join(plain(x, 4) for x in u)}): "
            f"{'recovers' if imp > 0 else 'changes'} {plain(imp, sign=True)}{share_txt}; t-test over the starts' "
            f"means p={p:.2g}: " + ("a cause" if outcome == "cause" else "undecided"))
    return Decision(outcome=outcome, improvement=imp, share=share, share_ci=share_ci, share_se=share_se,
                    improvement_se=se, df=df, p=p, n_changed=len(c), n_reference=len(u), text=text, rule="")


# ---------------------------------------------------------------- the reproduce step
MORE_BASELINE_RUNS = "take the baseline snapshot again with more --bench-runs"


def more_runs_advice(runs_needed: int | None) -> str:
    """What an undecided reproduce step tells the user to do: the runs it would take, or (none would do against
    the baseline snapshot's few runs) a baseline of more runs."""
    return f"run with --reproduce-runs {runs_needed}" if runs_needed else MORE_BASELINE_RUNS


ReproOutcome = Literal["regression", "none", "better", "more", "noise"]
NOT_SHOWN = "not shown to be a regression: give a snapshot (--baseline-snapshot) or more baseline runs"


class Reproduction(BaseModel):
    outcome: ReproOutcome
    mean: float
    sd: float
    delta: float            # worse than the baseline by (positive = worse), in the metric's unit
    delta_se: float
    text: str
    runs_needed: int | None = None   # runs that would show the claimed regression, when undecided


def one_reading_p(delta: float, sd: float, n: int, df: int | None = None) -> float:
    """One-sided p of a shift ``delta`` between ``n`` runs and one reading of the same noise ``sd`` (the reading's
    own noise assumed equal to the runs'); t with ``df`` degrees of freedom (those of ``sd``; the runs' own, n - 1,
    by default)."""
    return float(_sps().t.sf(delta / (sd * math.sqrt(1 + 1 / n)), max(df if df is not None else n - 1, 1)))


def reproduce(samples: list[float], baseline: float, lower_is_better: bool, claimed: float | None, *,
              baseline_samples: list[float] | None = None, final: bool = False, most: int | None = None,
              exact_baseline: bool = False, futile_stop: bool = True) -> Reproduction:
    """Is the host worse than ``baseline`` beyond its noise?

    A baseline given as a number (no ``baseline_samples``, not ``exact_baseline``) is one measurement of unknown
    noise: the current state's noise is assumed for it, and a regression must also beat one reading of that noise
    (one-sided p < ALPHA_ONE_READING, t with the runs' degrees of freedom). A shift that stays inside it, and that
    even ``most`` runs (the budget) could not take outside it at the SD's SD_UPPER upper bound, is ``noise``: not
    shown to be a regression. So is a mean on the better side of a number after NO_DROP_RUNS runs (no drop at all
    is shown; the runs would only go on to bound one), and a shift that the budget's runs could not take outside one
    reading's noise even at the drop's FUTILE_Q upper bound and the SD's lower bound (futile: stop at NO_DROP_RUNS;
    ``futile_stop=False`` leaves that stop out, as bench/stats measures the step both ways).

    regression: significantly worse (one-sided p < ALPHA_REPRODUCE) by at least RELEVANT_PCT.
    better: significantly better (symptom and baseline swapped, or the problem is gone).
    none: the upper bound of how much worse is below half the claimed regression.
    more: add runs; at the budget the text says how many runs would show the claim.
    """
    m = statistics.fmean(samples)
    bs = baseline_samples or []
    sd, df = pooled_sd(samples, bs) if bs else pooled_sd(samples)
    sd = _floor(sd, m, baseline)
    se = sd * math.sqrt(1 / len(samples) + (1 / len(bs) if bs else 0.0))
    df = max(df, 1)
    delta = (m - baseline) if lower_is_better else (baseline - m)
    p_worse = float(_sps().t.sf(delta / se, df))
    p_better = float(_sps().t.sf(-delta / se, df))
    upper = delta + t_quantile(0.95, df) * se
    relevant = RELEVANT_PCT / 100 * abs(baseline)
    claim = claimed if claimed and claimed > 0 else None
    if p_worse < ALPHA_REPRODUCE and delta > relevant:
        outcome: ReproOutcome = "regression"
    elif p_better < ALPHA_REPRODUCE and -delta > relevant:
        outcome = "better"
    elif upper < max(relevant, 0.5 * claim if claim else relevant):
        outcome = "none"
    else:
        outcome = "more"
    one = not bs and not exact_baseline and len(samples) >= 2
    futile = False
    # against a number: after NO_DROP_RUNS runs whose mean is on the better side of it, no drop at all is shown,
    # and more runs would only bound a drop the runs do not show: stop, "not shown to be a regression"
    no_drop = not bs and outcome == "more" and delta <= 0 and len(samples) >= NO_DROP_RUNS
    if no_drop:
        outcome = "noise"
    p_one = one_reading_p(delta, sd, len(samples)) if one else 0.0
    if one and delta > 0 and p_one >= ALPHA_ONE_READING and (outcome == "regression" or (outcome == "more" and final)):
        # the shift is inside the noise one reading carries: more runs help only while the budget could show it
        n = len(samples)
        sd_up = sd * math.sqrt((n - 1) / float(_sps().chi2.ppf(1 - SD_UPPER, n - 1)))
        hopeless = final or one_reading_p(delta, sd_up, max(most or n, n)) >= ALPHA_ONE_READING
        outcome = "noise" if hopeless else "more"
    elif futile_stop and one and delta > 0 and outcome == "more" and most and len(samples) >= NO_DROP_RUNS:
        # futile: a drop as large as the runs allow (FUTILE_Q upper bound) against noise as small as they allow (its
        # lower bound) would still be inside one reading's noise after the budget's runs; more runs only narrow it
        n = len(samples)
        sd_lo = sd * math.sqrt((n - 1) / float(_sps().chi2.ppf(FUTILE_Q, n - 1)))
        most = max(most, n)
        # ... and "none" (the drop's bound below half the claim) out of reach too: the runs would not rule it out
        reach = t_quantile(FUTILE_Q, df) * se
        none_near = delta - reach + t_quantile(0.95, most - 1) * sd_lo / math.sqrt(most) \
            < max(relevant, 0.5 * claim if claim else relevant)
        futile = not none_near and one_reading_p(delta + reach, sd_lo, most) >= ALPHA_ONE_READING
        if futile:
            outcome = "noise"
    pct = abs(delta) / abs(baseline) if baseline else 0.0
    text = (f"measured {plain(m, 4)} ± {plain(sd, 2)} over {len(samples)} runs against a baseline of {plain(baseline, 4)}: "
            f"{'worse' if delta > 0 else 'better'} by {plain(abs(delta))} ({pct:.1%}); one-sided p={p_worse:.2g}")
    if one and delta > 0:
        text += (f"; the baseline is one number, so this state's noise (SD {plain(sd, 2)}) is assumed for it: against one "
                 f"reading p={p_one:.2g}")
    if no_drop:
        text += (f"; after {len(samples)} runs the mean is on the better side of the baseline's number: no drop at all "
                 f"is shown; {NOT_SHOWN}")
    elif outcome == "noise":
        text += (f", not below {ALPHA_ONE_READING:g}: the shift ({abs(delta) / sd:.1f} SD) is inside the noise one reading "
                 "carries" + (f", and {most} runs could not take it outside even with the drop at its {FUTILE_Q:.0%} "
                              f"upper bound and the noise SD at its {FUTILE_Q:.0%} lower bound" if futile else "")
                 + f"; {NOT_SHOWN}")
    need = None
    if outcome == "more":
        target = claim or max(abs(delta), relevant)
        z = float(_sps().norm.ppf(1 - ALPHA_REPRODUCE) + _sps().norm.ppf(POWER))
        # se² = sd²·(1/n + 1/m): more runs of this state shrink only the first term; the baseline's m runs stay
        room = (target / (z * sd)) ** 2 - (1 / len(bs) if bs else 0.0)
        need = max(len(samples) + 1, math.ceil(1 / room)) if room > 0 else None
        if final and need is not None:
            text += f"; undecided: a regression this small against this noise needs about {need} runs"
        elif final:
            text += (f"; undecided: no number of runs of this state can show a regression this small against this "
                     f"noise and the baseline's {len(bs)} runs ({MORE_BASELINE_RUNS})")
    return Reproduction(outcome=outcome, mean=m, sd=sd, delta=delta, delta_se=se, text=text, runs_needed=need)


# ---------------------------------------------------------------- bisection
StepOutcome = Literal["good", "bad", "more"]


class Step(BaseModel):
    outcome: StepOutcome
    confidence: float       # posterior probability of the outcome (equal priors), 0.5 when undecided
    mean: float


STEP_ERROR = 0.01


def bisect_step(good: list[float], bad: list[float], step: list[float], final: bool = False) -> Step:
    """Is a commit's benchmark (``step``) like the good end or the bad end?

    A sequential probability ratio between "mean is the good mean" and "mean is the bad
    mean", with the noise pooled from the two ends: decided once the odds pass
    (1 - STEP_ERROR) / STEP_ERROR, so one run decides a clear step and a close one gets more.
    At ``final`` the likelier side is returned with its (lower) confidence.
    """
    mg, mb = statistics.fmean(good), statistics.fmean(bad)
    sd, _ = pooled_sd(good, bad)
    sd = _floor(sd, mg, mb)
    llr = sum(((x - mg) ** 2 - (x - mb) ** 2) / (2 * sd * sd) for x in step)  # log P(bad) / P(good)
    llr = max(-700.0, min(700.0, llr))
    p_bad = 1 / (1 + math.exp(-llr))
    bound = math.log((1 - STEP_ERROR) / STEP_ERROR)
    m = statistics.fmean(step)
    if llr >= bound or (final and llr > 0):
        return Step(outcome="bad", confidence=p_bad, mean=m)
    if llr <= -bound or final:
        return Step(outcome="good", confidence=1 - p_bad, mean=m)
    return Step(outcome="more", confidence=0.5, mean=m)


def culprit_confidence(parent: list[float], culprit: list[float], lower_is_better: bool,
                       noise: tuple[list[float], ...] = ()) -> float:
    """The confidence that the culprit is worse than its parent: 1 - one-sided p of the difference. ``noise``: the
    runs of the bisection's two ends, which estimate the noise when one clear run decided each side."""
    if len(parent) < 1 or len(culprit) < 1 or pooled_sd(parent, culprit, *noise)[1] < 1:
        return 0.5
    e = effect(culprit, parent, lower_is_better, noise)   # improvement going from the culprit back to its parent
    return 1.0 - e.p_better
