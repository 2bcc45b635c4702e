"""``--symptom`` / ``--baseline`` text: ``METRIC VALUE UNIT``; the unit tells the direction.

Times (``us``, ``ms``, ``s``) are better lower, rates (``tok/s``, ``req/s``, ``it/s``,
``GB/s``, ``TFLOPS``, ``samples/s``, …) better higher: any unit whose name ends in ``/s``
(``/sec``, ``/second``; ``tok/s/user`` too) is a rate, never seconds. Any other unit needs
``--higher-is-better`` or ``--lower-is-better``. Metric names match case-insensitively.

Units are compared in one place, ``tools.units``: a benchmark's unit and a symptom's are
of one kind when their families are equal (``same_family``), and ``convert`` scales a
value between two units of one family.
"""

from __future__ import annotations

import re
from typing import Literal

from debugagent.tools.errors import UsageError
from debugagent.tools.units import (  # noqa: F401 - re-exported: the unit tables and their one comparison
    RATE_FAMILIES,
    RATE_UNITS,
    TIME_UNITS,
    convert,
    normalise_unit,
    same_family,
    unit_family,
    unit_kind,
)
from pydantic import BaseModel

__all__ = ["EXAMPLE", "RATE_FAMILIES", "RATE_UNITS", "TIME_UNITS", "Direction", "Symptom", "as_direction", "check_pair", "convert",
           "direction_flag", "normalise_unit", "parse_symptom", "same_family", "unit_family", "unit_kind"]

Direction = Literal["lower", "higher"]
EXAMPLE = "`verify 30ms`, `decode 82 tok/s` or `ttft 1.2 s`"
_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*[:=]?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/%_]*)\s*$")


class Symptom(BaseModel):
    metric: str
    value: float
    unit: str
    direction: Direction  # which is better
    text: str

    def _scale(self, unit: str) -> tuple[str, float] | None:
        return unit_family(unit)

    def in_unit(self, unit: str) -> float:
        """The value in another unit of the same family (``1.2 s`` in ms is 1200); else unchanged."""
        v = convert(self.value, self.unit, unit or self.unit)
        return self.value if v is None else v

    def worse(self, a: float, b: float) -> float:
        """How much worse ``a`` is than ``b`` (positive = worse), in the metric's unit."""
        return a - b if self.direction == "lower" else b - a


def direction_flag(higher: bool, lower: bool) -> Direction | None:
    if higher and lower:
        raise UsageError("--higher-is-better and --lower-is-better both given", fix="give the one that fits the metric")
    return "higher" if higher else "lower" if lower else None


def as_direction(value: object) -> Direction | None:
    """A direction read back from a recording (untyped JSON): ``higher``, ``lower`` or None."""
    return "higher" if value == "higher" else "lower" if value == "lower" else None


_NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_NO_METRIC = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/%_]+)\s*$")        # `1200 tok/s`, `3.1 it/s`
_UNIT_FIRST = re.compile(rf"^\s*([A-Za-zµ/%_]+)\s*[:=]?\s*{_NUMBER}\s*$")  # `TFLOPS 410`
METRIC_EXAMPLE = {"tok/s": "decode", "ms": "verify", "us": "verify", "s": "ttft", "it/s": "step", "req/s": "serve",
                  "tflops": "matmul", "gb/s": "copy"}


def metric_missing(text: str) -> str | None:
    """``1200 tok/s`` or ``TFLOPS 410``: a value and a unit debugagent knows, no metric name; the symptom written
    with one (``decode 1200 tok/s``), else None."""
    m = _NO_METRIC.match(text or "")
    value, unit = (m.group(1), m.group(2)) if m else (None, None)
    if not m:
        m = _UNIT_FIRST.match(text or "")
        value, unit = (m.group(2), m.group(1)) if m else (None, None)
    if value is None or unit is None or unit_kind(normalise_unit(unit)) is None:
        return None
    u = normalise_unit(unit)
    name = METRIC_EXAMPLE.get(u) or ("verify" if unit_kind(u) == "time" else "throughput")
    return f"{name} {value} {unit}"


def parse_symptom(text: str, flag: str = "--symptom", direction: Direction | None = None) -> Symptom:
    m = _RE.match(text or "")
    if not m or not m.group(3) and direction is None:
        hint = metric_missing(text)
        if hint:
            raise UsageError(f"{flag} {text!r} has no metric name: it is `METRIC VALUE UNIT`, METRIC being the name "
                             "the benchmark prints before the number", fix=f"did you mean `{hint}`? (with your "
                             f"benchmark's own metric name: {flag} '{hint}')")
        raise UsageError(f"{flag} {text!r} is not `METRIC VALUE UNIT`", fix=f"write it as {EXAMPLE}")
    metric, value, unit = m.group(1), float(m.group(2)), m.group(3)
    if not 0 < value < float("inf"):
        raise UsageError(f"{flag} {text!r}: the value must be a positive number (shares of the regression are "
                         "relative to it)", fix=f"write it as {EXAMPLE}")
    u = normalise_unit(unit)
    kind = unit_kind(u)
    known: Direction | None = "lower" if kind == "time" else "higher" if kind == "rate" else None
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
    if not same_family(symptom.unit, baseline.unit):
        raise UsageError(f"--symptom is in {symptom.unit} but --baseline in {baseline.unit}", fix="use the same kind of unit")
    if baseline.value <= 0:
        raise UsageError(f"--baseline {baseline.text!r}: a baseline of {baseline.value:g} cannot be compared with "
                         "(a regression is measured as a share of it)", fix="give the value measured when it was good, e.g. 'verify 20ms'")
    b = baseline.in_unit(symptom.unit)
    if symptom.worse(symptom.value, b) < 0:
        raise UsageError(f"--symptom {symptom.text!r} is better than --baseline {baseline.text!r} "
                         f"({'lower' if symptom.direction == 'lower' else 'higher'} is better): were they swapped?",
                         fix="give what it is now as --symptom and what it was when good as --baseline")
