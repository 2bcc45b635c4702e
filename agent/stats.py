"""Statistics for deciding experiments: Welch's t-test with a small table, no SciPy.

Pure functions over lists of floats.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# two-sided critical t at alpha = 0.01, by degrees of freedom
_T01 = {1: 63.66, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
        12: 3.055, 15: 2.947, 20: 2.845, 30: 2.750, 60: 2.660}


def t_critical(df: float) -> float:
    d = max(1, int(df))
    keys = sorted(_T01)
    for k in keys:
        if d <= k:
            return _T01[k]
    return 2.576


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """(t, df) of Welch's test for mean(a) - mean(b)."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va = statistics.variance(a) if len(a) > 1 else 0.0
    vb = statistics.variance(b) if len(b) > 1 else 0.0
    se2 = va / len(a) + vb / len(b)
    floor = (1e-6 * max(abs(ma), abs(mb), 1e-9)) ** 2
    se2 = max(se2, floor)
    t = (ma - mb) / math.sqrt(se2)
    num = se2 ** 2
    den = 0.0
    if len(a) > 1:
        den += (va / len(a)) ** 2 / (len(a) - 1)
    if len(b) > 1:
        den += (vb / len(b)) ** 2 / (len(b) - 1)
    df = num / den if den > 0 else max(1, len(a) + len(b) - 2)
    return t, df


@dataclass
class Decision:
    decided: bool
    significant: bool
    improvement: float  # in the metric's unit, positive = better
    share: float        # of the regression recovered
    t: float
    df: float
    text: str


def decide(bad: list[float], after: list[float], regression: float, lower_is_better: bool, min_share: float = 0.1) -> Decision:
    """Compare the benchmark after an experiment with the regressed samples.

    Decided when the difference is significant (p < 0.01, Welch) or when it is not and
    the confidence interval already excludes ``min_share`` of the regression.
    """
    mb, ma = statistics.fmean(bad), statistics.fmean(after)
    improvement = (mb - ma) if lower_is_better else (ma - mb)
    share = improvement / regression if regression > 0 else 0.0
    t, df = welch(bad, after)
    tc = t_critical(df)
    significant = abs(t) > tc and improvement > 0
    se = abs(mb - ma) / abs(t) if t else 0.0
    ci_upper = improvement + tc * se
    excludes = ci_upper < min_share * regression
    decided = significant or excludes
    text = (f"mean {ma:.4g} vs {mb:.4g} before ({len(after)} vs {len(bad)} runs): "
            f"{'recovers' if improvement > 0 else 'changes'} {improvement:+.3g}, {share:.0%} of the regression; "
            f"Welch t={t:.2f}, df={df:.1f}, {'p<0.01' if abs(t) > tc else 'not significant'}")
    return Decision(decided, significant and share >= min_share, improvement, share, t, df, text)


def regression_is_real(samples: list[float], baseline: float, lower_is_better: bool, noise_floor_pct: float = 3.0) -> tuple[bool, float, str]:
    """Is the measured value worse than ``baseline`` beyond noise? (real, delta, reason)."""
    m = statistics.fmean(samples)
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    delta = (m - baseline) if lower_is_better else (baseline - m)
    se = sd / math.sqrt(len(samples))
    margin = max(t_critical(len(samples) - 1) * se, noise_floor_pct / 100 * abs(baseline))
    real = delta > margin
    why = (f"measured {m:.4g} ± {sd:.2g} over {len(samples)} runs against a baseline of {baseline:.4g}: "
           f"{'worse' if delta > 0 else 'not worse'} by {abs(delta):.3g} ({abs(delta) / abs(baseline):.1%}); "
           f"noise margin {margin:.3g}")
    return real, delta, why
