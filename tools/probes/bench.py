"""The benchmark: one run of the user's command, its metric read from what it prints.

A snapshot with ``bench_runs`` > 0 runs it that many times after its second wave: snapshot field ``bench``
(the command, metric, unit and the samples: a baseline snapshot's own baseline numbers).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .. import benchfmt, host
from ..transport import CommandResult
from .base import Gathering, Probe, Tool


class BenchValue(BaseModel):
    value: float
    unit: str | None = None
    format: str | None = None   # where the value was read from: benchfmt.FORMAT_WORDS' keys (None in older recordings)


class Fields(BaseModel):
    bench: dict[str, Any] = Field(default_factory=dict)


def _bench_value(i: host.Bench, r: CommandResult) -> BenchValue:
    value, unit, fmt = benchfmt.read_bench_format(r.stdout, i.metric, i.regex)
    return BenchValue(value=value, unit=unit, format=fmt)


def _after(g: Gathering) -> None:
    samples: list[float] = []
    unit: str | None = None
    if g.bench and (g.metric or g.bench_regex) and g.bench_runs > 0:
        for i in range(g.bench_runs):
            b = g.runner.call("bench", {"cmd": g.bench, "metric": g.metric or "", "cwd": g.repo, "regex": g.bench_regex},
                              why=f"the benchmark in this state, run {i + 1} of {g.bench_runs}")
            if b.ok:
                samples.append(b.output.value)
                unit = b.output.unit or unit
            else:
                g.errors.append(b.error or "")
    g.kept["bench"] = (samples, unit)


def _fill(g: Gathering) -> dict[str, Any]:
    samples, unit = g.kept.get("bench", ([], None))
    return {"bench": {"cmd": g.bench, "metric": g.metric, "regex": g.bench_regex, "unit": unit, "runs": g.bench_runs,
                      "samples": samples} if g.bench else {}}


PROBE = Probe("bench", tools=(Tool("bench", host.Bench, _bench_value, timeout=900.0),), after=_after, fill=_fill)
