"""Fail fast with the fix: run the benchmark once before anything else and check that it
prints the metric the user named, in a unit of the same kind.

A benchmark that prints ``verify=28.5 ms`` while the user said ``latency 30ms`` would
otherwise be noticed only after every experiment failed; here it stops the run at once
(exit 2) with the flags that would work.
"""

from __future__ import annotations

import re
from typing import Any

from debugagent.tools.errors import UsageError
from debugagent.tools.host import parse_bench

from .symptom import TIME_UNITS, Symptom, unit_kind

PAIR = re.compile(r"(?<![\w.])([A-Za-z_][\w.\-]*)\s*[=:]\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(ms|us|µs|sec|s|tok/s|tokens/s|req/s|it/s)?(?![\w/])")


def reported(text: str) -> list[tuple[str, float, str | None]]:
    """The ``name=value unit`` pairs a benchmark printed, last value of each name, in order of appearance."""
    seen: dict[str, tuple[str, float, str | None]] = {}
    for name, value, unit in PAIR.findall(text):
        seen[name] = (name, float(value), unit or None)
    return list(seen.values())


def _kind(unit: str | None) -> str | None:
    return unit_kind(unit)


def _example(name: str, unit: str | None, symptom: Symptom, baseline: Symptom | None) -> str:
    u = unit or symptom.unit
    same = _kind(u) == _kind(symptom.unit)
    s = f"--symptom '{name} {symptom.in_unit(u) if same else symptom.value:g}{'' if u in TIME_UNITS else ' '}{u}'"
    if baseline:
        s += f" --baseline '{name} {baseline.in_unit(u) if same else baseline.value:g}{'' if u in TIME_UNITS else ' '}{u}'"
    return s


def metric_problem(text: str, exit_code: int | None, bench: str, symptom: Symptom, baseline: Symptom | None,
                   regex: str | None = None) -> UsageError | None:
    """None when the benchmark's output names the metric in a fitting unit; else the error to stop with."""
    try:
        _, unit = parse_bench(text, symptom.metric, regex)
    except Exception:  # noqa: BLE001 - a ParseError: the metric is not there
        unit = "missing"
    if unit != "missing":
        if unit is None or _kind(unit) == _kind(symptom.unit):
            return None
        return UsageError(f"your benchmark `{bench}` reports `{symptom.metric}` in {unit}, but --symptom is in {symptom.unit}",
                          fix=f"use {_example(symptom.metric, unit, symptom, baseline)}")
    pairs = reported(text)
    tail = " ".join(text.strip().splitlines()[-2:])[-160:] or "(nothing)"
    if regex:
        return UsageError(f"--bench-regex {regex!r} matched nothing in the output of `{bench}` (exit {exit_code}): {tail}",
                          fix="give a regex whose group 1 is the number, or drop --bench-regex")
    if not pairs:
        return UsageError(f"your benchmark `{bench}` printed no `NAME=VALUE UNIT` line (exit {exit_code}); its output ends: {tail}",
                          fix="make it print e.g. `verify=30.1 ms`, give another with --bench, or a regex with --bench-regex")
    best = next((p for p in pairs if _kind(p[2]) == _kind(symptom.unit)), pairs[0])
    named = ", ".join(f"`{n}`" + (f" in {u}" if u else "") for n, _, u in pairs[:6])
    return UsageError(f"your benchmark `{bench}` does not print `{symptom.metric}`; it reports {named}",
                      fix=f"use {_example(best[0], best[2], symptom, baseline)}")


def check_benchmark(ctx: Any, discovered: dict[str, Any]) -> dict[str, Any] | None:
    """Run the benchmark once, before anything else; stop (exit 2) when it does not report the named metric.
    Returns the run's reading (``value``, ``unit``): the host as found, measured once (the reproduce step's first run)."""
    bench = discovered.get("bench")
    if not bench:
        return None
    o = ctx.runner(None).call("bench", {"cmd": bench, "metric": ctx.symptom.metric, "cwd": discovered.get("repo"),
                                        "regex": ctx.overrides.bench_regex},
                              why=f"check once that the benchmark prints `{ctx.symptom.metric}`")
    res = o.result
    problem = metric_problem(res.stdout + "\n" + res.stderr, res.exit_code, bench, ctx.symptom, ctx.baseline,
                             ctx.overrides.bench_regex)
    if problem is not None:
        raise problem
    return {"value": o.output.value, "unit": o.output.unit} if o.ok else None
