"""Symptom text and the statistics that decide experiments."""

from __future__ import annotations

import random

import pytest

from agent.stats import decide, regression_is_real
from agent.symptom import check_pair, parse_symptom
from tools.errors import UsageError


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


def test_decide_no_change_is_not_significant():
    """An experiment that changes nothing is decided as not significant once the interval excludes 10%."""
    d = decide(noisy(30, 1, 5, 3), noisy(30, 1, 8, 4), regression=10, lower_is_better=True)
    assert not d.significant and d.decided


def test_decide_direction_for_rates():
    """For a rate, higher after the change is the recovery."""
    d = decide(noisy(82, 1, 5, 5), noisy(89, 1, 3, 6), regression=7, lower_is_better=False)
    assert d.significant and d.improvement > 0


def test_regression_within_noise_is_not_real():
    """A 2% dip inside 2.5% noise is not a regression; a 50% rise is."""
    real, _, why = regression_is_real(noisy(89, 2.5, 5, 7), 89.0, lower_is_better=False)
    assert not real and "noise margin" in why
    real, delta, _ = regression_is_real(noisy(30, 4, 5, 8), 20.0, lower_is_better=True)
    assert real and delta > 8
