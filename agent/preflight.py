"""Fail fast with the fix: run the benchmark once before anything else and check that it
prints the metric the user named, in a unit of the same kind.

A benchmark that prints ``verify=28.5 ms`` while the user said ``latency 30ms`` would
otherwise be noticed only after every experiment failed; here it stops the run at once
(exit 2) with the flags that would work.
"""

from __future__ import annotations

from typing import Any

from debugagent.tools.benchfmt import bench_metrics, read_bench, split_output_file
from debugagent.tools.errors import ParseError, UsageError
from debugagent.tools.units import same_family

from .symptom import TIME_UNITS, Symptom, unit_kind


def reported(text: str, file_text: str | None = None) -> list[tuple[str, float, str | None]]:
    """The metrics a benchmark reported (its result file, a result line, the result table, ``name=value unit``
    pairs), most trusted first, one entry a name."""
    seen: dict[str, tuple[str, float, str | None]] = {}
    for r in bench_metrics(text, file_text):
        for m in r.metrics:
            seen.setdefault(m.name, (m.name, m.value, m.unit or None))
    return list(seen.values())


def _kind(unit: str | None) -> str | None:
    return unit_kind(unit)


def _example(name: str, unit: str | None, symptom: Symptom, baseline: Symptom | None) -> str:
    u = unit or symptom.unit
    same = same_family(u, symptom.unit)
    s = f"--symptom '{name} {symptom.in_unit(u) if same else symptom.value:g}{'' if u in TIME_UNITS else ' '}{u}'"
    if baseline:
        s += f" --baseline '{name} {baseline.in_unit(u) if same else baseline.value:g}{'' if u in TIME_UNITS else ' '}{u}'"
    return s


def metric_problem(text: str, exit_code: int | None, bench: str, symptom: Symptom, baseline: Symptom | None,
                   regex: str | None = None, file_text: str | None = None) -> UsageError | None:
    """None when the benchmark's output (or the result file it wrote) names the metric in a unit of the
    symptom's family (ms and s; tok/s and tokens/sec, never req/s); else the error to stop with."""
    if file_text is None:
        text, file_text = split_output_file(text)
    try:
        _, unit = read_bench(text, symptom.metric, regex, file_text=file_text)
    except ParseError:   # the metric is not there
        unit = "missing"
    if unit != "missing":
        if unit is None or same_family(unit, symptom.unit):
            return None
        return UsageError(f"your benchmark `{bench}` reports `{symptom.metric}` in {unit}, but --symptom is in {symptom.unit}",
                          fix=f"use {_example(symptom.metric, unit, symptom, baseline)}")
    pairs = reported(text, file_text)
    tail = " ".join(text.strip().splitlines()[-2:])[-160:] or "(nothing)"
    if regex:
        return UsageError(f"--bench-regex {regex!r} matched nothing in the output of `{bench}` (exit {exit_code}): {tail}",
                          fix="give a regex whose group 1 is the number, or drop --bench-regex")
    if not pairs:
        return UsageError(f"your benchmark `{bench}` printed no `NAME=VALUE UNIT` line (exit {exit_code}); its output ends: {tail}",
                          fix="make it print e.g. `verify=30.1 ms` (or write a bench_serving / vllm bench serve result "
                              "file with --output-file / --result-filename), give another with --bench, or a regex "
                              "with --bench-regex")
    best = next((p for p in pairs if same_family(p[2], symptom.unit)),
                next((p for p in pairs if _kind(p[2]) == _kind(symptom.unit)), pairs[0]))
    named = ", ".join(f"`{n}`" + (f" in {u}" if u else "") for n, _, u in pairs[:8])
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
    out, file_text = split_output_file(res.stdout)
    problem = metric_problem(out + "\n" + res.stderr, res.exit_code, bench, ctx.symptom, ctx.baseline,
                             ctx.overrides.bench_regex, file_text=file_text)
    if problem is not None:
        raise problem
    return {"value": o.output.value, "unit": o.output.unit} if o.ok else None
