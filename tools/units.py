"""Units of measurement, compared in one place: symptoms, baselines and benchmark readings all ask here.

Times scale to ms and are better lower; rates scale to their family's base and are better
higher. Any unit whose name ends in ``/s`` (``/sec``, ``/second``, also ``tok/s/user``) is a
rate of its own family, never seconds.
"""

from __future__ import annotations

import math
import re
from typing import Literal

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


def whole_pct(share: float) -> str:
    """A share as a whole percent, rounded half up, as every output prints one (Python's format rounds half to
    even, and a binary 0.965 down)."""
    return f"{math.floor(share * 100 + 0.5):.0f}%"


def plain(value: float, digits: int = 3, sign: bool = False) -> str:
    """``value`` to ``digits`` significant digits as a person writes it: never ``1.77e+03`` (a number of more
    digits than that is rounded to a whole number, 1770 → ``1770``), with ``+`` in front when ``sign`` asks."""
    s = "+" if sign else ""
    if value != value or value in (float("inf"), float("-inf")):
        return f"{value:{s}}"
    if abs(value) >= 10 ** digits:
        return f"{value:{s}.0f}"
    return f"{value:{s}.{digits}g}"   # below 10**digits this has no exponent but for tiny values (1e-05)
