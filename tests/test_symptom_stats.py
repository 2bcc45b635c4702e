"""Symptom text and the statistics that decide experiments."""

from __future__ import annotations

import random

import pytest
from debugagent.agent.stats import decide
from debugagent.agent.symptom import check_pair, parse_symptom
from debugagent.tools.errors import UsageError


@pytest.mark.parametrize("text,metric,value,unit,direction", [
    ("verify 30ms", "verify", 30.0, "ms", "lower"),
    ("decode 82 tok/s", "decode", 82.0, "tok/s", "higher"),
    ("ttft 1.2 s", "ttft", 1.2, "s", "lower"),
    ("itl=17 ms", "itl", 17.0, "ms", "lower"),
    ("throughput 3.5 req/s", "throughput", 3.5, "req/s", "higher"),
])
def test_parse_symptom(text, metric, value, unit, direction):
    """METRIC VALUE UNIT parses; the unit tells which direction is better."""
    s = parse_symptom(text)
    assert (s.metric, s.value, s.unit, s.direction) == (metric, value, unit, direction)


@pytest.mark.parametrize("text", ["slow", "verify thirty ms", "verify 30 parsecs", ""])
def test_bad_symptom_shows_an_example(text):
    """Bad text names the flag and shows an accepted example."""
    with pytest.raises(UsageError) as e:
        parse_symptom(text, "--symptom")
    assert "--symptom" in str(e.value) and "verify 30ms" in str(e.value)


def test_pair_must_share_metric_and_unit_kind():
    """Symptom and baseline must measure the same metric in the same kind of unit."""
    with pytest.raises(UsageError, match="measures `verify` but --baseline measures `decode`"):
        check_pair(parse_symptom("verify 30ms"), parse_symptom("decode 20ms"))
    with pytest.raises(UsageError, match="same kind of unit"):
        check_pair(parse_symptom("decode 30ms"), parse_symptom("decode 20 tok/s"))
    check_pair(parse_symptom("ttft 1900ms"), parse_symptom("ttft 1.2 s"))
    assert parse_symptom("ttft 1.2 s").in_unit("ms") == pytest.approx(1200)


def noisy(mean: float, pct: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, pct / 100)) for _ in range(n)]


def test_decide_recovery_is_significant():
    """An experiment that brings 30 ms back to 20 ms recovers ~100% and is significant."""
    d = decide(noisy(30, 4, 5, 1), noisy(20, 4, 3, 2), regression=10, lower_is_better=True)
    assert d.significant and d.decided and 0.85 < d.share < 1.15


def test_decide_direction_for_rates():
    """For a rate, higher after the change is the recovery."""
    d = decide(noisy(82, 1, 5, 5), noisy(89, 1, 3, 6), regression=7, lower_is_better=False)
    assert d.significant and d.improvement > 0


# ---------------------------------------------------------------- units and directions
@pytest.mark.parametrize("text,direction", [
    ("bw 410 GB/s", "higher"), ("gemm 700 TFLOPS", "higher"), ("train 1200 samples/s", "higher"),
    ("step 3.1 it/s", "higher"), ("serve 12 req/s", "higher"), ("kernel 85 us", "lower"), ("load 2.5 s", "lower"),
])
def test_units_people_use(text, direction):
    """Rates and times in the units people use parse with the right direction."""
    assert parse_symptom(text).direction == direction


def test_unknown_unit_asks_for_a_direction():
    """An unknown unit names the two flags instead of refusing outright; with one it parses."""
    with pytest.raises(UsageError) as e:
        parse_symptom("acc 71 points")
    assert "--higher-is-better" in str(e.value) and "--lower-is-better" in str(e.value)
    s = parse_symptom("acc 71 points", direction="higher")
    assert s.direction == "higher" and s.unit == "points"
    with pytest.raises(UsageError, match="is a time"):
        parse_symptom("verify 30ms", direction="higher")


def test_metric_names_match_case_insensitively_and_rates_convert():
    """`Decode` and `decode` are one metric; MB/s and GB/s are one family of unit."""
    check_pair(parse_symptom("Decode 80 tok/s"), parse_symptom("decode 89 tok/s"))
    check_pair(parse_symptom("bw 300 GB/s"), parse_symptom("bw 410000 MB/s"))
    assert parse_symptom("bw 410000 MB/s").in_unit("GB/s") == pytest.approx(410)


def test_zero_baseline_and_swapped_pair_are_bad_input():
    """`--baseline 'verify 0ms'` and a symptom better than its baseline are exit-2 errors with a fix."""
    with pytest.raises(UsageError, match="--baseline 'verify 0ms': the value must be a positive number") as e:
        check_pair(parse_symptom("verify 30ms"), parse_symptom("verify 0ms", "--baseline"))
    assert e.value.exit_code == 2
    with pytest.raises(UsageError, match="swapped"):
        check_pair(parse_symptom("verify 20ms"), parse_symptom("verify 30ms", "--baseline"))


# ---------------------------------------------------------------- sequential decisions
def test_three_outcomes():
    """A full recovery is a cause, an unchanged state is not a cause, a coin-flip amount of data is 'more'."""
    ref = noisy(30, 2, 5, 11)
    assert decide(ref, noisy(20, 2, 2, 12), 10, True).outcome == "cause"
    assert decide(ref, noisy(30, 2, 3, 13), 10, True).outcome == "not_cause"
    assert decide(noisy(30, 8, 3, 14), noisy(29, 8, 2, 15), 2.0, True).outcome == "more"


def test_partial_cause_is_found_with_its_interval():
    """A suspect recovering 30% of a large regression is a cause whose interval holds 30%, not 'ruled out'."""
    ref = noisy(150, 1, 6, 21)
    d = decide(ref, noisy(135, 1, 4, 22), 50, True)
    assert d.outcome == "cause" and d.share_ci[0] < 0.3 < d.share_ci[1] and 0.15 < d.share < 0.45


def test_no_regression_number_gives_no_share():
    """Without a measured regression the decision carries no share interval (explains stays null)."""
    d = decide(noisy(30, 2, 5, 31), noisy(20, 2, 3, 32), None, True)
    assert d.outcome == "cause" and d.share_ci is None


def test_a_cause_must_beat_the_fresh_reference():
    """Reproduce runs that happened to be high cannot make an unchanged state look like a recovery."""
    lucky = [31.0, 31.02, 30.98, 31.01, 30.99, 31.0, 31.02, 30.98, 31.0, 31.01, 30.99, 31.0,  # reproduce runs
             30.0, 30.02]                                                                         # fresh reference
    changed = [30.0, 30.02, 29.98, 30.01, 29.99, 30.0, 30.02, 29.98, 30.0, 30.01]
    assert decide(lucky, changed, 3.0, True).outcome == "cause"
    assert decide(lucky, changed, 3.0, True, fresh=2).outcome != "cause"


def test_run_budget_grows_with_noise_and_respects_the_cap():
    """More noise or a smaller regression needs more runs; --max-runs caps it."""
    from debugagent.agent.stats import AUTO_CAP, run_budget
    small, big = run_budget(1.0, 10.0, 5), run_budget(1.0, 2.0, 5)
    assert 2 <= small < big <= AUTO_CAP
    assert run_budget(1.0, 0.5, 5, cap=8) == 8


def test_reproduce_is_sequential_and_detects_a_swap():
    """Far outside the noise 3 runs decide; within it the answer is 'more' with the runs it would need; better is said."""
    from debugagent.agent.stats import reproduce
    assert reproduce(noisy(30, 2, 3, 41), 20, True, 10).outcome == "regression"
    thin = reproduce(noisy(20.3, 8, 3, 43), 20, True, 1.0, final=True, exact_baseline=True)
    assert thin.outcome == "more" and thin.runs_needed > 3 and "needs about" in thin.text
    # the same runs against one reading of unknown noise: inside that noise, not "more runs"
    assert reproduce(noisy(20.3, 8, 3, 43), 20, True, 1.0, final=True).outcome == "noise"
    assert reproduce(noisy(20, 1, 3, 43), 30, True, 10).outcome == "better"
    assert reproduce(noisy(89, 2, 8, 44), 89, False, 5.0).outcome == "none"


def test_bisect_step_one_run_when_clear_more_when_close():
    """A step at the bad mean decides in one run; a step halfway asks for more; at the end it picks a side."""
    from debugagent.agent.stats import bisect_step, culprit_confidence
    good, bad = noisy(20, 2, 4, 51), noisy(30, 2, 5, 52)
    assert bisect_step(good, bad, [30.1]).outcome == "bad"
    assert bisect_step(good, bad, [19.9]).outcome == "good"
    halfway = (sum(good) / len(good) + sum(bad) / len(bad)) / 2
    assert bisect_step(good, bad, [halfway]).outcome == "more"
    assert bisect_step(good, bad, [halfway + 0.2], final=True).outcome == "bad"
    assert culprit_confidence(good, bad, True) > 0.99


def test_mann_whitney_when_the_noise_is_not_normal():
    """Heavy-tailed noise (one huge outlier) is tested with Mann-Whitney as well."""
    from debugagent.agent.stats import effect
    ref = [30.0, 30.1, 29.9, 30.2, 30.0, 29.8, 30.1, 90.0]
    e = effect(ref, [20.0, 20.1, 19.9, 20.2, 20.0, 19.8], True)
    assert not e.normal and e.p_better < 0.01


def test_a_culprit_and_parent_decided_by_one_clear_run_each_are_confident():
    """A bisection whose last two steps each took one clear run (673 and 1793 tok/s on an H200, the ends around
    600 and 1900) has a confident culprit: the ends' runs estimate the noise. Without them it is a coin toss."""
    from debugagent.agent.stats import culprit_confidence
    ends = ([1924.0, 1900.0, 1950.0], [608.0, 600.0, 620.0])
    assert culprit_confidence([1793.0], [673.2], False, ends) > 0.99
    assert culprit_confidence([1793.0], [673.2], False) == 0.5
    assert culprit_confidence([1793.0], [1790.0], False, ends) < 0.9   # no real step: no confidence


def test_runs_needed_counts_the_baseline_snapshots_own_runs():
    """Against a baseline of a few runs, more runs of this state shrink only part of the uncertainty: the runs it
    would take count that, and where no number of runs can show the regression, the answer says to take the
    baseline again with more runs instead of naming a number that could not show it (values of an H200 run)."""
    from debugagent.agent.stats import reproduce
    bad = [1135.0, 1577.0, 1549.0, 1338.0, 1038.0, 1421.0, 1194.0, 1550.0, 1228.0, 1009.0, 1540.0, 1197.0]
    base = [1672.33, 2051.58, 1580.48]
    never = reproduce(bad, 1768.0, False, 450.0, baseline_samples=base, final=True)
    assert never.outcome == "more" and never.runs_needed is None
    assert "no number of runs" in never.text and "--bench-runs" in never.text and "needs about" not in never.text
    with_base = reproduce(bad[:4], 1768.0, False, 450.0, baseline_samples=base * 3, final=True)
    against_number = reproduce(bad[:4], 1768.0, False, 450.0, final=True, exact_baseline=True)
    assert with_base.outcome == against_number.outcome == "more"
    assert with_base.runs_needed == 10 and against_number.runs_needed == 5


# ---------------------------------------------------------------- rate units of any name
@pytest.mark.parametrize("text,unit", [
    ("train 1200 seq/s", "seq/s"), ("vision 300 img/s", "img/s"), ("video 24 frames/s", "frames/s"),
    ("serve 1200 tokens/sec", "tokens/s"), ("user 41 tok/s/user", "tok/s/user"), ("rows 9 rows/second", "rows/s"),
])
def test_any_unit_ending_per_second_is_a_rate(text, unit):
    """A unit of any name ending `/s` (`/sec`, `/second`, `tok/s/user`) is a rate, better higher, never seconds."""
    s = parse_symptom(text)
    assert (s.unit, s.direction) == (unit, "higher")


def test_units_are_compared_in_one_place():
    """`same_family` and `convert` answer for symptom, baseline and benchmark alike: rates never meet seconds."""
    from debugagent.agent.symptom import convert, same_family, unit_kind
    assert unit_kind("samples/s") == unit_kind("frames/s") == unit_kind("tokens/sec") == "rate"
    assert unit_kind("s") == unit_kind("ms") == "time" and unit_kind("points") is None
    assert same_family("tokens/sec", "tok/s") and same_family("ms", "s") and not same_family("samples/s", "s")
    assert not same_family("frames/s", "img/s") and same_family("points", "points") and not same_family("points", "ms")
    assert convert(1.2, "s", "ms") == pytest.approx(1200) and convert(3, "frames/s", "s") is None
    check_pair(parse_symptom("video 20 frames/s"), parse_symptom("video 24 frames/s"))
    with pytest.raises(UsageError, match="same kind of unit"):
        check_pair(parse_symptom("video 20 frames/s"), parse_symptom("video 2 s"))


def test_a_baseline_number_is_one_reading_whose_noise_is_assumed():
    """A healthy bimodal server (3800-5500 tok/s) read 4510 ± 430 over 6 runs against a user's one reading of 5426:
    the shift is inside the noise one reading carries, so it is not shown to be a regression (no more runs, since
    the budget could not show it either); the same runs against the baseline as an exact mean, or against a
    snapshot's runs, still read a regression; a regression far outside the noise is real after 3 runs."""
    from debugagent.agent.stats import NOT_SHOWN, reproduce
    bimodal = [4020.0, 4950.0, 4110.0, 5010.0, 4230.0, 4740.0]
    one = reproduce(bimodal, 5426.0, False, 916.0, most=12)
    assert one.outcome == "noise" and NOT_SHOWN in one.text and "assumed" in one.text
    assert reproduce(bimodal, 5426.0, False, 916.0, most=12, exact_baseline=True).outcome == "regression"
    assert reproduce(bimodal, 5426.0, False, 916.0, baseline_samples=[5426.0, 5380.0, 5470.0, 5410.0]).outcome == "regression"
    assert reproduce(noisy(30, 2, 3, 41), 20, True, 10, most=12).outcome == "regression"


def test_a_number_baseline_the_runs_are_not_even_below_stops_after_three_runs():
    """Against the user's number, 3 runs whose mean is already on the better side show no drop at all: "not shown
    to be a regression" then, not more runs until a drop of half the claim is excluded (the H200 healthy case ran
    6); 2 runs are not enough, and a snapshot's runs as the baseline are tested as before."""
    from debugagent.agent.stats import NOT_SHOWN, reproduce
    healthy = [2400.0, 1750.0, 2010.0]   # a rate, higher is better; the user read 1924 before and claims 1901.9 now
    r = reproduce(healthy, 1924.0, False, 22.4, most=12)
    assert r.outcome == "noise" and NOT_SHOWN in r.text and "better side" in r.text, r.text
    assert reproduce(healthy[:2], 1924.0, False, 22.4, most=12).outcome == "more"
    assert reproduce(healthy, 1924.0, False, 22.4, baseline_samples=[1924.0, 2300.0, 1700.0]).outcome == "more"
    # a time (lower is better) measured below the number: the same
    assert reproduce([19.0, 19.5, 21.0], 20.0, True, 1.0, most=12).outcome == "noise"


def test_a_number_baseline_stops_when_the_budget_could_not_show_the_shift():
    """The H200 healthy case (recorded 2026-12-03): 1388, 1715 and 2300 tok/s against the user's one reading of 2289.
    Even with the drop at its 80% upper bound and the noise at its lower bound, 12 runs could not take the shift
    outside the noise one reading carries: "not shown to be a regression" after 3 runs, not after 12 as before.
    Where a drop of half the claim could still be ruled out ("none") or the claim shown, the runs go on; a snapshot's
    runs as the baseline are tested as before."""
    from debugagent.agent.stats import FUTILE_Q, NOT_SHOWN, reproduce
    h200 = [1388.39, 1714.66, 2299.52]
    r = reproduce(h200, 2288.6, False, 249.7, most=12)
    assert r.outcome == "noise" and NOT_SHOWN in r.text and f"{FUTILE_Q:.0%} upper bound" in r.text, r.text
    # even 200 runs could not: the shift (1.1 SD) is below what any number of runs shows against one reading
    assert reproduce(h200, 2288.6, False, 249.7, most=200).outcome == "noise"
    # the budget decides: 89 -> 85 ± 2 could be shown by 12 runs at its bounds, not by 4
    assert reproduce([83.0, 87.0, 85.0], 89.0, False, 7.0, most=12).outcome == "more"
    assert reproduce([83.0, 87.0, 85.0], 89.0, False, 7.0, most=4).outcome == "noise"
    # against an exact mean or a snapshot's runs, no one-reading noise: more runs
    assert reproduce(h200, 2288.6, False, 249.7, most=12, exact_baseline=True).outcome == "more"
    assert reproduce(h200, 2288.6, False, 249.7, baseline_samples=[2288.6, 2100.0, 2400.0], most=12).outcome == "more"
    # a healthy server whose runs could still rule out a drop of half the claim (89 -> 82 claimed, SD ~1.5): more runs
    assert reproduce([86.0, 89.0, 88.0], 89.0, False, 7.0, most=12).outcome == "more"
    assert reproduce([86.0, 89.0, 88.0], 89.0, False, 0.5, most=12).outcome == "noise"   # no "none" to reach
    # a real regression of ~5 SDs is never stopped as futile: shown after 3 runs
    assert reproduce([71.0, 72.5, 69.8], 89.0, False, 17.0, most=12).outcome == "regression"
