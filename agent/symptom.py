"""``--symptom`` / ``--baseline`` text: ``METRIC VALUE UNIT``; the unit tells the direction."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from tools.errors import UsageError

TIME_UNITS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0, "secs": 1000.0}
RATE_UNITS = {"tok/s", "tokens/s", "token/s", "req/s", "it/s", "qps", "samples/s", "img/s"}
EXAMPLE = "`verify 30ms`, `decode 82 tok/s` or `ttft 1.2 s`"
_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*[:=]?\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-zµ/]+)\s*$")


class Symptom(BaseModel):
    metric: str
    value: float
    unit: str
    direction: Literal["lower", "higher"]  # which is better
    text: str

    def in_unit(self, unit: str) -> float:
        if self.unit in TIME_UNITS and unit in TIME_UNITS:
            return self.value * TIME_UNITS[self.unit] / TIME_UNITS[unit]
        return self.value

    def worse(self, a: float, b: float) -> float:
        """How much worse ``a`` is than ``b`` (positive = worse), in the metric's unit."""
        return a - b if self.direction == "lower" else b - a


def parse_symptom(text: str, flag: str = "--symptom") -> Symptom:
    m = _RE.match(text or "")
    if not m:
        raise UsageError(f"{flag} {text!r} is not `METRIC VALUE UNIT`", fix=f"write it as {EXAMPLE}")
    metric, value, unit = m.group(1), float(m.group(2)), m.group(3)
    if not 0 < value < float("inf"):
        raise UsageError(f"{flag} {text!r}: the value must be a positive number (shares of the regression are "
                         "relative to it)", fix=f"write it as {EXAMPLE}")
    u = unit.lower()
    if u in ("tps", "tok_s"):
        u = "tok/s"
    if u in TIME_UNITS:
        return Symptom(metric=metric, value=value, unit=u, direction="lower", text=text.strip())
    if u in RATE_UNITS:
        return Symptom(metric=metric, value=value, unit=u, direction="higher", text=text.strip())
    raise UsageError(f"{flag} {text!r}: unknown unit `{unit}`",
                     fix=f"use a time (us, ms, s: lower is better) or a rate (tok/s, req/s, it/s: higher is better), e.g. {EXAMPLE}")


def check_pair(symptom: Symptom, baseline: Symptom) -> None:
    if symptom.metric != baseline.metric:
        raise UsageError(f"--symptom measures `{symptom.metric}` but --baseline measures `{baseline.metric}`",
                         fix="give both for the same metric, e.g. --symptom 'verify 30ms' --baseline 'verify 20ms'")
    if (symptom.unit in TIME_UNITS) != (baseline.unit in TIME_UNITS) or (
            symptom.unit in RATE_UNITS and symptom.unit != baseline.unit):
        raise UsageError(f"--symptom is in {symptom.unit} but --baseline in {baseline.unit}", fix="use the same kind of unit")
