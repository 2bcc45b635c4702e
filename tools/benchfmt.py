"""Standard benchmark outputs read as metrics: what users already run, not only ``NAME=VALUE UNIT``.

A format is told by its keys, never by the file's name:

=================  =================================================  ===================================
format             told by                                            file
=================  =================================================  ===================================
``genai-perf``     objects with ``unit`` and ``avg`` (``time_to_first_token``)  ``profile_export_genai_perf.json``
``llmperf``        ``results_…_mean`` keys, seconds                   ``*_summary.json``
``sglang``         ``mean_e2e_latency_ms`` / ``total_throughput``     ``bench_serving --output-file`` (JSONL,
                                                                      one line a run: the last is read)
``vllm``           ``total_token_throughput`` / ``mean_e2el_ms``      ``vllm bench serve --save-result``
``serving-table``  the ``Serving Benchmark Result`` table on stdout   (either engine's stdout)
``pairs``          ``NAME=VALUE UNIT`` lines                          (any benchmark's stdout)
=================  =================================================  ===================================

Every metric carries its value as a float, its unit normalised (``ms``, ``s``, ``tok/s``,
``req/s``, …, as ``tools.units`` spells them) and whether lower is better. ``"inf"`` and
numeric strings are read; NaN is left out with a note. ``read_bench`` is what the bench probe
calls: the same ``(value, unit)`` as ``tools.host.parse_bench``, or ``ParseError``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, Field

from .errors import ParseError, parser
from .units import unit_kind

Format = Literal["sglang", "vllm", "serving", "genai-perf", "llmperf", "serving-table", "pairs"]
OUTPUT_MARK = "== debugagent: benchmark output file"
NOT_WRITTEN = "== debugagent: the benchmark did not write its output file"

_STAT_WORDS = {"mean": "mean", "avg": "mean", "median": "median", "p50": "median", "std": "std", "stddev": "std",
               "min": "min", "max": "max"}
# quantities under the names each tool gives them -> one canonical name (aliases: both engines' spellings)
_QUANTITY = {"ttft": ["ttft"], "tpot": ["tpot"], "itl": ["itl"], "e2el": ["e2el", "e2e_latency"],
             "e2e_latency": ["e2e_latency", "e2el"], "time_to_first_token": ["ttft"], "inter_token_latency": ["itl"],
             "request_latency": ["e2el", "e2e_latency"], "time_to_second_token": ["ttst"],
             "ttft_s": ["ttft"], "inter_token_latency_s": ["itl"], "end_to_end_latency_s": ["e2el", "e2e_latency"]}


class Metric(BaseModel):
    """One number a benchmark reported."""

    name: str                      # the key as the tool wrote it (``median_ttft_ms``, ``time_to_first_token.avg``)
    value: float
    unit: str                      # normalised: ms, s, tok/s, req/s, tokens, requests, % or ""
    lower_is_better: bool | None   # None: the unit does not say (counts)
    aliases: list[str] = Field(default_factory=list)  # other names it answers to (``mean_ttft``, ``ttft_mean``)


class BenchResult(BaseModel):
    """The metrics of one benchmark run, the format they were read from and what was left out."""

    format: Format
    metrics: list[Metric]
    notes: list[str] = Field(default_factory=list)

    def names(self) -> list[str]:
        return [m.name for m in self.metrics]


# ---------------------------------------------------------------- values and units
def _number(v: Any) -> float | None:
    """A float from a JSON value: numbers and numeric strings (``"inf"``, ``"1.5e3"``); None for anything else."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        t = v.strip().lower().replace(",", "")
        if t in ("inf", "+inf", "infinity", "+infinity"):
            return math.inf
        if t in ("-inf", "-infinity"):
            return -math.inf
        try:
            return float(t)
        except ValueError:
            return None
    return None


def unit_of(unit: str) -> str:
    """A tool's unit as ``tools.units`` spells it: ``requests/sec`` -> ``req/s``, ``tokens/sec`` -> ``tok/s``."""
    u = unit.strip().lower()
    u = re.sub(r"/(?:sec|secs|second|seconds)\b", "/s", u)
    return {"requests/s": "req/s", "tokens/s": "tok/s", "token/s": "tok/s", "request/s": "req/s",
            "tokens/s/user": "tok/s/user", "msec": "ms", "sec": "s", "secs": "s", "seconds": "s",
            "count": "requests"}.get(u, u)


def _lower_is_better(unit: str, name: str) -> bool | None:
    kind = unit_kind(unit)
    if kind is not None:
        return kind == "time"
    if re.search(r"(fail|error)", name):
        return True
    if re.search(r"(accept|goodput|throughput)", name):
        return False
    return None


def _aliases(stat: str | None, quantity: str | None, unit: str) -> list[str]:
    """``mean_ttft``, ``mean_ttft_ms``, ``ttft_mean`` … for a statistic of a quantity."""
    if not stat or not quantity:
        return []
    suffix = {"ms": "_ms", "s": "_s"}.get(unit, "")
    out: list[str] = []
    for q in _QUANTITY.get(quantity, [quantity]):
        for s in {stat, "median" if stat == "p50" else stat}:
            out += [f"{s}_{q}", f"{s}_{q}{suffix}", f"{q}_{s}"]
    return list(dict.fromkeys(out))


def _metric(name: str, value: float, unit: str, notes: list[str], *, stat: str | None = None,
            quantity: str | None = None, extra: list[str] | None = None) -> Metric | None:
    if math.isnan(value):
        notes.append(f"`{name}` is NaN (no data): left out")
        return None
    aliases = [a for a in _aliases(stat, quantity, unit) + (extra or []) if a != name]
    return Metric(name=name, value=value, unit=unit, lower_is_better=_lower_is_better(unit, name),
                  aliases=list(dict.fromkeys(aliases)))


# ---------------------------------------------------------------- JSON and JSONL
def load_json(text: str) -> Any:
    """The JSON document in ``text``, or the last line of a JSONL file that is a JSON object.

    ``NaN`` and ``Infinity`` (what Python's ``json.dumps`` writes for ``request_rate=inf``) are read.
    """
    t = (text or "").strip()
    if not t:
        raise ParseError("empty: no benchmark result", tool="benchfmt")
    try:
        return json.loads(t)
    except ValueError:
        pass
    if t.startswith("{"):   # one document with something after it (stderr appended to the file's text)
        try:
            obj, _ = json.JSONDecoder().raw_decode(t)
            if isinstance(obj, dict) and not t.splitlines()[0].strip().endswith("}"):
                return obj
        except ValueError:
            pass
    for line in reversed(t.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    raise ParseError("neither JSON nor JSONL with an object on a line", tool="benchfmt", excerpt=t[:80])


def detect(obj: Any) -> Format | None:
    """Which tool wrote this result, told by its keys; None when no known format's keys are there."""
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if any(isinstance(obj.get(k), dict) and "avg" in obj[k] and "unit" in obj[k]
           for k in ("time_to_first_token", "request_latency", "request_throughput", "output_token_throughput",
                     "inter_token_latency")):
        return "genai-perf"
    if any(k.startswith("results_") and (k.endswith("_mean") or k.endswith("_per_s")) for k in keys):
        return "llmperf"
    if "output_throughput" in keys or "request_throughput" in keys:
        if keys & {"mean_e2e_latency_ms", "total_throughput", "accept_length", "total_output_tokens_retokenized"}:
            return "sglang"
        if keys & {"total_token_throughput", "mean_e2el_ms", "max_output_tokens_per_s", "endpoint_type"}:
            return "vllm"
        return "serving"
    return None


_SERVING_KEY = re.compile(r"^(?P<stat>mean|median|std|min|max|p\d+(?:\.\d+)?)_(?P<q>.+?)_ms$")


def _serving(obj: dict[str, Any], notes: list[str]) -> list[Metric]:
    """Flat ``bench_serving`` / ``vllm bench serve`` results: ``*_ms`` statistics, throughputs, counts."""
    out: list[Metric | None] = []
    for key, raw in obj.items():
        if isinstance(raw, (list, dict)) or raw is None:
            continue
        v = _number(raw)
        if v is None:
            continue
        m = _SERVING_KEY.match(key)
        if m:
            stat = _STAT_WORDS.get(m.group("stat"), m.group("stat"))
            out.append(_metric(key, v, "ms", notes, stat=stat, quantity=m.group("q")))
        elif key in ("request_throughput", "request_goodput"):
            out.append(_metric(key, v, "req/s", notes))
        elif key in ("max_output_tokens_per_s",) or key.endswith("_throughput") or key.endswith("_throughput_retokenized"):
            extra = {"total_throughput": ["total_token_throughput"],
                     "total_token_throughput": ["total_throughput"]}.get(key, [])
            out.append(_metric(key, v, "tok/s", notes, extra=extra))
        elif key == "duration":
            out.append(_metric(key, v, "s", notes, extra=["benchmark_duration"]))
        elif key in ("completed", "failed", "max_concurrent_requests"):
            out.append(_metric(key, v, "requests", notes))
        elif key.startswith("total_") and "tokens" in key:
            out.append(_metric(key, v, "tokens", notes))
        elif key in ("accept_length", "spec_decode_acceptance_length", "concurrency", "rtfx"):
            out.append(_metric(key, v, "", notes))
        elif key == "spec_decode_acceptance_rate":
            out.append(_metric(key, v, "%", notes))
    return [m for m in out if m is not None]


_GENAI_STATS = re.compile(r"^(avg|min|max|std|p\d+)$")


def _genai_perf(obj: dict[str, Any], notes: list[str]) -> list[Metric]:
    """``profile_export_genai_perf.json``: one object per quantity, ``unit`` and its statistics."""
    out: list[Metric | None] = []
    for key, stats in obj.items():
        if key in ("input_config", "telemetry_stats", "sessions") or not isinstance(stats, dict):
            continue
        unit = unit_of(str(stats.get("unit", "")))
        for stat, raw in stats.items():
            if not _GENAI_STATS.match(str(stat)):
                continue
            v = _number(raw)
            if v is None:
                continue
            word = _STAT_WORDS.get(stat, stat)
            extra = [f"{key}_{stat}"]
            if key == "output_token_throughput" and stat == "avg":
                extra.append("output_throughput")
            if key == "request_throughput" and stat == "avg":
                extra.append("request_throughput")
            out.append(_metric(f"{key}.{stat}", v, unit, notes, stat=word, quantity=key, extra=extra))
    return [m for m in out if m is not None]


_LLMPERF_KEY = re.compile(r"^results_(?P<q>.+?)_(?:quantiles_(?P<p>p\d+)|(?P<s>mean|min|max|stddev))$")


def _llmperf(obj: dict[str, Any], notes: list[str]) -> list[Metric]:
    """llmperf ``*_summary.json``: ``results_<quantity>_<stat>`` in seconds, tokens and tokens per second."""
    out: list[Metric | None] = []
    for key, raw in obj.items():
        v = _number(raw)
        if v is None or not key.startswith("results_"):
            continue
        m = _LLMPERF_KEY.match(key)
        if key == "results_mean_output_throughput_token_per_s":
            out.append(_metric(key, v, "tok/s", notes, extra=["output_throughput"]))
        elif key == "results_num_completed_requests_per_min":
            out.append(_metric("request_throughput", v / 60.0, "req/s", notes, extra=[key]))
        elif key in ("results_num_completed_requests", "results_num_requests_started", "results_number_errors"):
            out.append(_metric(key, v, "requests", notes))
        elif key == "results_error_rate":
            out.append(_metric(key, v, "", notes))
        elif m:
            q = m.group("q")
            stat = m.group("p") or _STAT_WORDS.get(m.group("s") or "", m.group("s"))
            unit = "tok/s" if q.endswith("_token_per_s") else "s" if q.endswith("_s") else \
                "tokens" if q.startswith("number_") else ""
            out.append(_metric(key, v, unit, notes, stat=stat, quantity=q))
    return [m for m in out if m is not None]


@parser("benchfmt")
def parse_result(text: str) -> BenchResult:
    """A benchmark's result file (or a JSON line on its stdout), read by the keys of its format."""
    obj = load_json(text)
    fmt = detect(obj)
    if fmt is None:
        keys = ", ".join(list(obj)[:6]) if isinstance(obj, dict) else type(obj).__name__
        raise ParseError(f"not a known benchmark result (keys: {keys}); known: SGLang bench_serving, vllm bench "
                         "serve, genai-perf profile_export_genai_perf.json, llmperf *_summary.json", tool="benchfmt")
    notes: list[str] = []
    metrics = {"genai-perf": _genai_perf, "llmperf": _llmperf}.get(fmt, _serving)(obj, notes)
    return BenchResult(format=fmt, metrics=metrics, notes=notes)


# ---------------------------------------------------------------- stdout: the result table and NAME=VALUE pairs
_TABLE_LINE = re.compile(r"^\s*(?P<label>[A-Za-z][^:\n]*?)(?:\s*\((?P<unit>[^()]*)\))?:\s+(?P<value>-?[0-9][0-9.,]*(?:[eE][-+]?\d+)?|inf|nan)\s*$",
                         re.I | re.M)
_TABLE_STAT = re.compile(r"^(?P<stat>Mean|Median|Std|Max|Min|P\d+(?:\.\d+)?) (?P<q>.+)$", re.I)
_TABLE_NAMES = {"successful requests": "completed", "failed requests": "failed",
                "benchmark duration": "duration", "request throughput": "request_throughput",
                "request goodput": "request_goodput", "input token throughput": "input_throughput",
                "output token throughput": "output_throughput", "total token throughput": "total_token_throughput",
                "peak output token throughput": "max_output_tokens_per_s", "concurrency": "concurrency",
                "accept length": "accept_length", "acceptance length": "spec_decode_acceptance_length",
                "acceptance rate": "spec_decode_acceptance_rate", "total input tokens": "total_input_tokens",
                "total generated tokens": "total_output_tokens", "peak concurrent requests": "max_concurrent_requests"}
_TABLE_Q = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2el", "e2e latency": "e2e_latency"}


def parse_table(text: str) -> BenchResult:
    """The ``Serving Benchmark Result`` table both engines print (``Median TTFT (ms):   201.98``); the last
    table wins when the output holds several runs."""
    notes: list[str] = []
    found: dict[str, Metric] = {}
    blocks = re.split(r"=+ Serving Benchmark Result =+", text or "")
    body = blocks[-1] if len(blocks) > 1 else ""
    for m in _TABLE_LINE.finditer(body):
        label, unit_raw, v = m.group("label").strip(), (m.group("unit") or "").strip(), _number(m.group("value"))
        if v is None:
            continue
        unit = unit_of(unit_raw) if unit_raw else ""
        st = _TABLE_STAT.match(label)
        q = _TABLE_Q.get(st.group("q").lower()) if st else None
        if st and q and unit == "ms":
            stat = st.group("stat").lower()
            key = f"{stat}_{q}_ms"
            metric = _metric(key, v, "ms", notes, stat=_STAT_WORDS.get(stat, stat), quantity=q)
        else:
            key = _TABLE_NAMES.get(label.lower()) or re.sub(r"\W+", "_", label.lower()).strip("_")
            if key in ("completed", "failed", "max_concurrent_requests"):
                unit = "requests"
            elif key.startswith("total_") and key.endswith("tokens"):
                unit = "tokens"
            extra = {"total_token_throughput": ["total_throughput"]}.get(key, [])
            metric = _metric(key, v, unit, notes, extra=extra)
        if metric is not None:
            found[key] = metric
    if not found:
        raise ParseError("no `Serving Benchmark Result` table", tool="benchfmt", excerpt=(text or "")[-120:])
    return BenchResult(format="serving-table", metrics=list(found.values()), notes=notes)


# a unit: a time, or any rate whose name ends /s (samples/s is a rate, not s), or %; nothing glued after it
PAIR_UNIT = (r"(?P<unit>[A-Za-zµ]+/s(?:ec)?(?:/[A-Za-z]+)?|msec|usec|ms|us|µs|seconds|secs|sec|s|min|%|(?i:[kmgtp]?flops)|"
             r"tps)?(?![\w/])")
_PAIR = re.compile(r"(?<![\w.])(?P<name>[A-Za-z_][\w.\-]*)\s*[=:]\s*(?P<value>-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
                   rf"[ \t]*{PAIR_UNIT}")


def parse_pairs(text: str) -> BenchResult:
    """``NAME=VALUE UNIT`` (or ``NAME: VALUE UNIT``) pairs in order of first appearance; the last value of each
    name wins (warm-up lines come first)."""
    notes: list[str] = []
    found: dict[str, Metric] = {}
    for m in _PAIR.finditer(text or ""):
        raw_unit = m.group("unit") or ""
        unit = unit_of(raw_unit) if raw_unit else ""
        metric = _metric(m.group("name"), float(m.group("value")), unit, notes)
        if metric is not None:
            found[m.group("name")] = metric
    return BenchResult(format="pairs", metrics=list(found.values()), notes=notes)


# ---------------------------------------------------------------- what the bench probe calls
def _strip_unit_suffix(name: str) -> str:
    return re.sub(r"_(ms|s|us|sec)$", "", name)


def find(result: BenchResult, metric: str) -> Metric | None:
    """The metric named ``metric`` (any case): by its name, then an alias, then without a unit suffix
    (``mean_ttft_ms`` finds llmperf's ``mean_ttft`` in seconds; the unit travels with it)."""
    want = metric.lower()
    for pick in (lambda m: m.name.lower() == want,
                 lambda m: want in (a.lower() for a in m.aliases),
                 lambda m: _strip_unit_suffix(want) in [_strip_unit_suffix(a.lower()) for a in [m.name, *m.aliases]]):
        hits = [m for m in result.metrics if pick(m)]
        if hits:
            return hits[-1]
    return None


def split_output_file(stdout: str) -> tuple[str, str | None]:
    """The benchmark's own stdout and the output file's text that ``with_output_file`` printed after it."""
    head, sep, tail = (stdout or "").rpartition("\n" + OUTPUT_MARK + "\n")
    if not sep:
        if (stdout or "").startswith(OUTPUT_MARK + "\n"):
            return "", stdout[len(OUTPUT_MARK) + 1:]
        return stdout or "", None
    return head, tail


def output_file_of(cmd: str) -> str | None:
    """The result file a benchmark command names: SGLang ``--output-file F``; vLLM ``--result-dir D``
    with ``--result-filename F`` (``--save-result``); None when it names none."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    opts: dict[str, str] = {}
    for i, w in enumerate(words):
        if w.startswith("--") and "=" in w:
            k, v = w.split("=", 1)
            opts[k] = v
        elif w.startswith("--") and i + 1 < len(words):
            opts[w] = words[i + 1]
    if "--output-file" in opts:
        return opts["--output-file"]
    if "--result-filename" in opts:
        d = opts.get("--result-dir")
        return f"{d.rstrip('/')}/{opts['--result-filename']}" if d else opts["--result-filename"]
    return None


def with_output_file(cmd: str, path: str) -> str:
    """``cmd``, then the result file printed after a marker line, keeping the benchmark's exit status.
    A JSONL file (SGLang appends one line a run) prints only its last line; a file this run did not write
    (unchanged, or absent) prints ``NOT_WRITTEN`` instead, so that a failed run never reads the previous result."""
    f = shlex.quote(path)
    show = f"tail -n 1 {f}" if path.endswith(".jsonl") else f"cat {f}"
    return (f"_da_was=$(cksum 2>/dev/null < {f}); {{ {cmd}\n}}; rc=$?; printf '\\n%s\\n' {shlex.quote(OUTPUT_MARK)}; "
            f"if [ \"$(cksum 2>/dev/null < {f})\" != \"$_da_was\" ]; then {show} 2>/dev/null; "
            f"else printf '%s\\n' {shlex.quote(NOT_WRITTEN)}; fi; exit $rc")


def bench_metrics(stdout: str, file_text: str | None = None) -> list[BenchResult]:
    """Every reading of a run, most trusted first: the result file, a result line on stdout, the result
    table, ``NAME=VALUE UNIT`` pairs."""
    out: list[BenchResult] = []
    if file_text is not None and file_text.strip() == NOT_WRITTEN:
        out.append(BenchResult(format="pairs", metrics=[], notes=["the result file: not written by this run"]))
    elif file_text is not None and file_text.strip():
        try:
            out.append(parse_result(file_text))
        except ParseError as exc:   # say why, and read stdout still
            out.append(BenchResult(format="pairs", metrics=[], notes=[f"the result file: {exc.message}"]))
    for line in reversed((stdout or "").splitlines()):
        if line.lstrip().startswith("{"):
            try:
                out.append(parse_result(line))
                break
            except ParseError:
                continue
    try:
        out.append(parse_table(stdout))
    except ParseError:
        pass
    pairs = parse_pairs(stdout)
    if pairs.metrics:
        out.append(pairs)
    return out


# the format a reading came from, as the transcript, the report and --json name it
FORMAT_WORDS = {"sglang": "SGLang bench_serving's result (JSONL)", "vllm": "vllm bench serve's result (JSON)",
                "serving": "a bench_serving / bench serve result (JSON)",
                "genai-perf": "genai-perf's profile_export_genai_perf.json", "llmperf": "llmperf's *_summary.json",
                "serving-table": "the Serving Benchmark Result table on stdout",
                "pairs": "NAME=VALUE UNIT lines on stdout", "regex": "the --bench-regex match on stdout"}


@parser("bench")
def read_bench(text: str, metric: str, regex: str | None = None, file_text: str | None = None) -> tuple[float, str | None]:
    """``(value, unit)`` of ``metric`` in a benchmark's output, the shape ``tools.host.parse_bench`` returns.

    ``regex`` (group 1 the value, last match) wins when given; else the result file (``file_text``, or
    one that ``with_output_file`` appended to ``text``), a JSON result line, the result table, then
    ``NAME=VALUE UNIT`` pairs. The unit is normalised (``tokens/sec`` -> ``tok/s``); None when none was printed.
    """
    value, unit, _ = read_bench_format(text, metric, regex, file_text)
    return value, unit


@parser("bench")
def read_bench_format(text: str, metric: str, regex: str | None = None,
                      file_text: str | None = None) -> tuple[float, str | None, str]:
    """``read_bench``'s ``(value, unit)`` and the format the value was read from (a key of ``FORMAT_WORDS``)."""
    if file_text is None:
        text, file_text = split_output_file(text)
    if regex:
        matches = re.findall(regex, text)
        if not matches:
            raise ParseError(f"the regex {regex!r} matched nothing", tool="bench", excerpt=text[-120:])
        m = matches[-1]
        return float(m if isinstance(m, str) else m[0]), None, "regex"
    readings = bench_metrics(text, file_text)
    for r in readings:
        hit = find(r, metric)
        if hit is not None:
            return hit.value, hit.unit or None, r.format
    named = [n for r in readings for n in r.names()][:8]
    where = f"; it reports {', '.join(f'`{n}`' for n in named)}" if named else ""
    where += "".join(f"; {n}" for r in readings for n in r.notes if n.startswith("the result file"))
    raise ParseError(f"no `{metric}=VALUE UNIT` in the benchmark's output{where}", tool="bench",
                     excerpt=text[-160:])
