"""``--symptom`` / ``--baseline`` text: ``METRIC VALUE UNIT``; the unit tells the direction.

Times (``us``, ``ms``, ``s``) are better lower, rates (``tok/s``, ``req/s``, ``it/s``,
``GB/s``, ``TFLOPS``, ``samples/s``, …) better higher: any unit whose name ends in ``/s``
(``/sec``, ``/second``; ``tok/s/user`` too) is a rate, never seconds. Any other unit needs
``--higher-is-better`` or ``--lower-is-better``. Metric names match case-insensitively.

Units are compared in one place, ``unit_family``: a benchmark's unit and a symptom's are
of one kind when their families are equal (``same_family``), and ``convert`` scales a
value between two units of one family.
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
_PER_SECOND = re.compile(r"^(?P<what>[^/\s]+)/(?:s|sec|secs|second|seconds)(?P<per>/[^/\s]+)?$")
EXAMPLE = "`verify 30ms`, `decode 82 tok/s` or `ttft 1.2 s`"
_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*[:=]?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/%_]*)\s*$")


def normalise_unit(unit: str | None) -> str:
    """The unit as the tables spell it: lower case, ``/sec`` and ``/second`` as ``/s`` (``tokens/sec`` -> ``tokens/s``)."""
    u = (unit or "").strip().lower()
    if u in ("tps", "tok_s"):
        return "tok/s"
    m = _PER_SECOND.match(u)
    if m:
        return f"{m.group('what')}/s{m.group('per') or ''}"
    return u


def unit_family(unit: str | None) -> tuple[str, float] | None:
    """``(family, scale)`` of a unit: times scale to ms, rates to their family's base; None for a unit of no
    known family. Any ``X/s`` (``X/s/Y``) not in the tables is a rate of its own family ``X/s``: a rate, never
    seconds."""
    u = normalise_unit(unit)
    if u in TIME_UNITS:
        return "time", TIME_UNITS[u]
    if u in RATE_UNITS:
        return RATE_UNITS[u], RATE_FAMILIES[RATE_UNITS[u]][u]
    m = _PER_SECOND.match(u)
    if m:
        return u, 1.0
    return None


def unit_kind(unit: str | None) -> Literal["time", "rate"] | None:
    """``time`` (better lower), ``rate`` (better higher) or None (the unit does not say)."""
    f = unit_family(unit)
    return None if f is None else "time" if f[0] == "time" else "rate"


def same_family(a: str | None, b: str | None) -> bool:
    """Whether two units measure the same thing (ms and s; MB/s and GB/s; tok/s and tokens/sec), so that one
    converts to the other; two units of no known family are the same only when spelled the same."""
    fa, fb = unit_family(a), unit_family(b)
    if fa is None or fb is None:
        return fa is None and fb is None and normalise_unit(a) == normalise_unit(b)
    return fa[0] == fb[0]


def convert(value: float, unit: str | None, to: str | None) -> float | None:
    """``value`` in ``unit`` expressed in ``to`` (1.2 s in ms is 1200); None when the two are not of one family."""
    if not same_family(unit, to):
        return None
    fa, fb = unit_family(unit), unit_family(to)
    return value if fa is None or fb is None else value * fa[1] / fb[1]


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


def parse_symptom(text: str, flag: str = "--symptom", direction: Direction | None = None) -> Symptom:
    m = _RE.match(text or "")
    if not m or not m.group(3) and direction is None:
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
