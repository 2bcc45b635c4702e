"""``--symptom`` / ``--baseline`` text: ``METRIC VALUE UNIT``; the unit tells the direction.

Times (``us``, ``ms``, ``s``) are better lower, rates (``tok/s``, ``req/s``, ``it/s``,
``GB/s``, ``TFLOPS``, ``samples/s``, …) better higher; any other unit needs
``--higher-is-better`` or ``--lower-is-better``. Metric names match case-insensitively.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from tools.errors import UsageError

Direction = Literal["lower", "higher"]
# scale to a common unit within each family (times to ms; rates to their family's base)
TIME_UNITS = {"us": 1e-3, "µs": 1e-3, "usec": 1e-3, "ms": 1.0, "msec": 1.0, "s": 1000.0, "sec": 1000.0,
              "secs": 1000.0, "min": 60000.0}
RATE_FAMILIES: dict[str, dict[str, float]] = {
    "tokens": {"tok/s": 1.0, "tokens/s": 1.0, "token/s": 1.0, "tps": 1.0, "tok_s": 1.0, "ktok/s": 1e3},
    "requests": {"req/s": 1.0, "requests/s": 1.0, "qps": 1.0, "rps": 1.0},
    "iterations": {"it/s": 1.0, "iter/s": 1.0, "steps/s": 1.0},
    "samples": {"samples/s": 1.0, "sample/s": 1.0, "img/s": 1.0, "images/s": 1.0, "seq/s": 1.0},
    "bytes": {"b/s": 1e-9, "kb/s": 1e-6, "mb/s": 1e-3, "gb/s": 1.0, "tb/s": 1e3, "gib/s": 1.073741824,
              "mib/s": 1.073741824e-3},
    "flops": {"gflops": 1e-3, "tflops": 1.0, "pflops": 1e3, "gflop/s": 1e-3, "tflop/s": 1.0},
}
RATE_UNITS = {u: fam for fam, us in RATE_FAMILIES.items() for u in us}
EXAMPLE = "`verify 30ms`, `decode 82 tok/s` or `ttft 1.2 s`"
_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*[:=]?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/%_]*)\s*$")


class Symptom(BaseModel):
    metric: str
    value: float
    unit: str
    direction: Direction  # which is better
    text: str

    def _scale(self, unit: str) -> tuple[str, float] | None:
        u = unit.lower()
        if u in TIME_UNITS:
            return "time", TIME_UNITS[u]
        if u in RATE_UNITS:
            return RATE_UNITS[u], RATE_FAMILIES[RATE_UNITS[u]][u]
        return None

    def in_unit(self, unit: str) -> float:
        """The value in another unit of the same family (``1.2 s`` in ms is 1200); else unchanged."""
        a, b = self._scale(self.unit), self._scale(unit or self.unit)
        if a and b and a[0] == b[0]:
            return self.value * a[1] / b[1]
        return self.value

    def worse(self, a: float, b: float) -> float:
        """How much worse ``a`` is than ``b`` (positive = worse), in the metric's unit."""
        return a - b if self.direction == "lower" else b - a


def direction_flag(higher: bool, lower: bool) -> Direction | None:
    if higher and lower:
        raise UsageError("--higher-is-better and --lower-is-better both given", fix="give the one that fits the metric")
    return "higher" if higher else "lower" if lower else None


def parse_symptom(text: str, flag: str = "--symptom", direction: Direction | None = None) -> Symptom:
    m = _RE.match(text or "")
    if not m or not m.group(3) and direction is None:
        raise UsageError(f"{flag} {text!r} is not `METRIC VALUE UNIT`", fix=f"write it as {EXAMPLE}")
    metric, value, unit = m.group(1), float(m.group(2)), m.group(3)
    if not 0 < value < float("inf"):
        raise UsageError(f"{flag} {text!r}: the value must be a positive number (shares of the regression are "
                         "relative to it)", fix=f"write it as {EXAMPLE}")
    u = unit.lower()
    if u in ("tps", "tok_s"):
        u = "tok/s"
    known: Direction | None = "lower" if u in TIME_UNITS else "higher" if u in RATE_UNITS else None
    if direction is not None and known is not None and direction != known:
        raise UsageError(f"{flag} {text!r}: `{unit}` is a {'time' if known == 'lower' else 'rate'}, which is better "
                         f"{known}, but --{direction}-is-better was given", fix="drop the flag, or use another unit")
    d = direction or known
    if d is None:
        raise UsageError(f"{flag} {text!r}: debugagent does not know whether `{unit}` is better higher or lower",
                         fix=f"add --higher-is-better or --lower-is-better, or use a time (us, ms, s) or a rate "
                             f"(tok/s, req/s, it/s, GB/s, TFLOPS, samples/s), e.g. {EXAMPLE}")
    return Symptom(metric=metric, value=value, unit=u if known else unit, direction=d, text=text.strip())


def check_pair(symptom: Symptom, baseline: Symptom) -> None:
    """Same metric (any case), same family of unit, a usable baseline, and the symptom worse than it."""
    if symptom.metric.lower() != baseline.metric.lower():
        raise UsageError(f"--symptom measures `{symptom.metric}` but --baseline measures `{baseline.metric}`",
                         fix="give both for the same metric, e.g. --symptom 'verify 30ms' --baseline 'verify 20ms'")
    fa, fb = symptom._scale(symptom.unit), baseline._scale(baseline.unit)
    if (fa is None) != (fb is None) or (fa and fb and fa[0] != fb[0]) or (fa is None and symptom.unit != baseline.unit):
        raise UsageError(f"--symptom is in {symptom.unit} but --baseline in {baseline.unit}", fix="use the same kind of unit")
    if baseline.value <= 0:
        raise UsageError(f"--baseline {baseline.text!r}: a baseline of {baseline.value:g} cannot be compared with "
                         "(a regression is measured as a share of it)", fix="give the value measured when it was good, e.g. 'verify 20ms'")
    b = baseline.in_unit(symptom.unit)
    if symptom.worse(symptom.value, b) < 0:
        raise UsageError(f"--symptom {symptom.text!r} is better than --baseline {baseline.text!r} "
                         f"({'lower' if symptom.direction == 'lower' else 'higher'} is better): were they swapped?",
                         fix="give what it is now as --symptom and what it was when good as --baseline")
