"""Standard benchmark outputs (SGLang, vLLM, genai-perf, llmperf) read as metrics by their keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from debugagent.agent.symptom import parse_symptom
from debugagent.tools.benchfmt import (
    OUTPUT_MARK,
    detect,
    find,
    output_file_of,
    parse_pairs,
    parse_result,
    parse_table,
    read_bench,
    split_output_file,
    with_output_file,
)
from debugagent.tools.errors import ParseError
from debugagent.tools.units import convert, same_family
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

V = Path(__file__).parent / "vectors" / "engines"


def text(name: str) -> str:
    return (V / name).read_text()


@pytest.mark.parametrize("name,fmt", [
    ("sglang_bench_serving.jsonl", "sglang"), ("vllm_bench_serve.json", "vllm"),
    ("genai_perf_profile_export_genai_perf.json", "genai-perf"), ("llmperf_summary.json", "llmperf"),
])
def test_each_format_is_told_by_its_keys(name, fmt):
    """The format is told by the keys in the file, whatever the file is called."""
    assert parse_result(text(name)).format == fmt


def test_sglang_jsonl_reads_the_last_run():
    """bench_serving appends one line a run: the last line is the run; `Infinity` request rates are read."""
    r = parse_result(text("sglang_bench_serving.jsonl"))
    m = find(r, "median_ttft_ms")
    assert m is not None and (m.value, m.unit, m.lower_is_better) == (181.94, "ms", True)
    tp = find(r, "output_throughput")
    assert tp is not None and (tp.value, tp.unit, tp.lower_is_better) == (1196.08, "tok/s", False)
    assert find(r, "request_throughput").unit == "req/s"
    assert find(r, "accept_length") is None   # null: no value, no metric
    assert find(r, "p99_e2e_latency_ms").value == 3520.7 and find(r, "p99_e2el").value == 3520.7


def test_vllm_json_reads_p999_numeric_strings_and_drops_nan_with_a_note():
    """`p99.9_…` percentiles are metrics; `"inf"` strings are read; NaN is left out and said."""
    r = parse_result(text("vllm_bench_serve.json"))
    assert find(r, "p99.9_ttft_ms").value == 352.6
    assert find(r, "total_token_throughput").unit == "tok/s" and find(r, "total_throughput").value == 6381.0
    assert find(r, "std_itl_ms") is None and any("std_itl_ms" in n and "NaN" in n for n in r.notes)
    assert find(r, "latencies") is None       # per-request arrays are not metrics
    assert find(r, "mean_e2el") is None       # not in this file: the e2el percentiles were not asked for


def test_inf_is_a_value():
    """`"inf"` and `Infinity` are values (inf), not errors; numeric strings are numbers."""
    r = parse_result(json.dumps({"output_throughput": "1.5e3", "request_throughput": 2, "total_token_throughput": 9,
                                 "p99_ttft_ms": "inf"}))
    assert find(r, "p99_ttft_ms").value == math.inf and find(r, "output_throughput").value == 1500.0


def test_genai_perf_nested_statistics_and_units():
    """genai-perf's `time_to_first_token.avg` is in ms; `requests/sec` and `tokens/sec` become req/s and tok/s."""
    r = parse_result(text("genai_perf_profile_export_genai_perf.json"))
    ttft = find(r, "time_to_first_token.avg")
    assert ttft is not None and (ttft.unit, ttft.lower_is_better) == ("ms", True)
    assert find(r, "mean_ttft_ms") is ttft or find(r, "mean_ttft_ms").value == ttft.value
    assert find(r, "time_to_first_token.p99").name == "time_to_first_token.p99"
    assert (find(r, "request_throughput").value, find(r, "request_throughput").unit) == (4.41, "req/s")
    assert find(r, "output_token_throughput.avg").unit == "tok/s"
    assert find(r, "output_token_throughput_per_user.avg").unit == "tok/s/user"
    assert find(r, "output_token_throughput_per_user.avg").lower_is_better is False
    assert not any(m.name.startswith(("telemetry", "input_config")) for m in r.metrics)


def test_llmperf_seconds_match_a_symptom_in_ms():
    """llmperf reports seconds; `--symptom 'mean_ttft_ms 180ms'` finds its TTFT mean and converts."""
    r = parse_result(text("llmperf_summary.json"))
    m = find(r, "results_ttft_s_mean")
    assert (m.value, m.unit, m.lower_is_better) == (0.1824, "s", True)
    assert find(r, "mean_ttft_ms") is m and find(r, "ttft_mean") is m
    assert find(r, "median_ttft").name == "results_ttft_s_quantiles_p50"
    assert find(r, "results_mean_output_throughput_token_per_s").unit == "tok/s"
    rps = find(r, "request_throughput")
    assert rps.unit == "req/s" and rps.value == pytest.approx(253.9 / 60)
    s = parse_symptom("mean_ttft_ms 180ms")
    assert same_family(m.unit, s.unit) and convert(m.value, m.unit, s.unit) == pytest.approx(182.4)


# ---------------------------------------------------------------- what the bench probe calls
@pytest.mark.parametrize("symptom,stdout,file,value,unit", [
    ("median_ttft_ms 180ms", "", "sglang_bench_serving.jsonl", 181.94, "ms"),
    ("output_throughput 1200 tok/s", "", "sglang_bench_serving.jsonl", 1196.08, "tok/s"),
    ("p99_ttft_ms 300ms", "", "vllm_bench_serve.json", 301.2, "ms"),
    ("output_throughput 1100 tok/s", "", "genai_perf_profile_export_genai_perf.json", 1129.4, "tok/s"),
    ("mean_ttft_ms 180ms", "", "llmperf_summary.json", 0.1824, "s"),
    ("median_ttft_ms 180ms", "sglang_bench_serving_stdout.txt", None, 181.94, "ms"),
    ("output_throughput 1200 tok/s", "sglang_bench_serving_stdout.txt", None, 1196.08, "tok/s"),
    ("p99.9_ttft_ms 350ms", "vllm_bench_serve_stdout.txt", None, 352.6, "ms"),
    ("total_throughput 6000 tok/s", "vllm_bench_serve_stdout.txt", None, 6381.0, "tok/s"),
])
def test_a_symptom_matches_a_metric_of_a_standard_benchmark(symptom, stdout, file, value, unit):
    """`--symptom` names read from the result file or from the result table on stdout, in a unit of its kind."""
    s = parse_symptom(symptom)
    v, u = read_bench(text(stdout) if stdout else "", s.metric, file_text=text(file) if file else None)
    assert (v, u) == (value, unit) and same_family(u, s.unit)


def test_the_result_file_wins_over_the_table_and_pairs():
    """A result file is trusted over stdout; a result line printed on stdout is read too."""
    stdout = text("sglang_bench_serving_stdout.txt").replace("181.94", "999.00") + "\nmedian_ttft_ms=5 ms\n"
    assert read_bench(stdout, "median_ttft_ms", file_text=text("sglang_bench_serving.jsonl")) == (181.94, "ms")
    line = text("vllm_bench_serve.json")
    assert read_bench("warm-up\n" + line + "\n", "median_ttft_ms") == (150.8, "ms")


def test_the_output_file_travels_after_a_marker():
    """`with_output_file` prints the file after the benchmark; `read_bench` splits it off by itself."""
    cmd = with_output_file("python3 -m sglang.bench_serving --output-file 'r f.jsonl'", "r f.jsonl")
    assert "tail -n 1 'r f.jsonl'" in cmd and cmd.endswith("exit $rc") and OUTPUT_MARK in cmd
    assert "cat out.json" in with_output_file("vllm bench serve", "out.json")
    out = text("sglang_bench_serving_stdout.txt") + "\n" + OUTPUT_MARK + "\n" + text("sglang_bench_serving.jsonl").splitlines()[-1]
    head, file = split_output_file(out)
    assert "Serving Benchmark Result" in head and file is not None and file.startswith("{")
    assert read_bench(out, "median_ttft_ms") == (181.94, "ms")


@pytest.mark.parametrize("cmd,path", [
    ("python -m sglang.bench_serving --backend sglang --num-prompts 200 --output-file /tmp/run.jsonl", "/tmp/run.jsonl"),
    ("vllm bench serve --save-result --result-dir /tmp/res --result-filename a.json", "/tmp/res/a.json"),
    ("vllm bench serve --save-result --result-filename=a.json", "a.json"),
    ("python bench.py --n 3", None), ("python 'unclosed", None),
])
def test_the_output_file_a_command_names(cmd, path):
    """SGLang's `--output-file` and vLLM's `--result-dir`/`--result-filename` name the result file."""
    assert output_file_of(cmd) == path


# ---------------------------------------------------------------- NAME=VALUE UNIT, as before, and rate units
@pytest.mark.parametrize("out,metric,expected", [
    ("warmup verify=40.0 ms\nverify=30.1 ms\n", "verify", (30.1, "ms")),
    ("throughput=4667.2 tok/s\n", "throughput", (4667.2, "tok/s")),
    ("graph_step_ms=0.512\n", "graph_step_ms", (0.512, None)),
    ("train=1200 samples/s\n", "train", (1200.0, "samples/s")),
    ("vision: 300 img/s\n", "vision", (300.0, "img/s")),
    ("serve=12 req/s\n", "serve", (12.0, "req/s")),
    ("ttft=1.2 s\n", "ttft", (1.2, "s")),
    ("decode=82 tokens/sec\n", "decode", (82.0, "tok/s")),
    ("gemm=700 TFLOPS\n", "gemm", (700.0, "tflops")),
    ("latency: 30 over 10 iters\n", "latency", (30.0, None)),
    ("verify=30 samples\n", "verify", (30.0, None)),
])
def test_name_value_unit_pairs(out, metric, expected):
    """`NAME=VALUE UNIT`, last match wins; a unit ending `/s` is a rate (`samples/s` is not seconds)."""
    assert read_bench(out, metric) == expected


def test_a_missing_metric_names_what_the_benchmark_reports():
    """The error names the metrics the benchmark did report, to pick from."""
    with pytest.raises(ParseError, match="no `p50_ttft_ms=VALUE UNIT`.*`completed`") as e:
        read_bench(text("vllm_bench_serve_stdout.txt"), "p50_ttft_ms")
    assert e.value.tool == "bench"
    with pytest.raises(ParseError, match="matched nothing"):
        read_bench("x=1", "x", regex=r"y=(\d+)")
    assert read_bench("lat 1\nlat 7\n", "x", regex=r"lat (\d+)") == (7.0, None)


def test_unknown_json_is_a_parse_error():
    """A JSON file of no known format is refused with the formats it knows."""
    with pytest.raises(ParseError, match="not a known benchmark result"):
        parse_result('{"a": 1}')
    with pytest.raises(ParseError):
        parse_result("not json at all")
    assert detect([1, 2]) is None


def test_table_and_pairs_parsers_on_their_own():
    """The stdout table is read alone; pairs keep the last value of each name."""
    t = parse_table(text("sglang_bench_serving_stdout.txt"))
    assert find(t, "max_itl_ms").value == 88.31 and find(t, "completed").unit == "requests"
    assert find(t, "mean_e2e_latency_ms").value == 3391.2 and find(t, "mean_e2el").value == 3391.2
    p = parse_pairs("a=1 ms\na=2 ms\nb=3 %\n")
    assert [(m.name, m.value, m.unit) for m in p.metrics] == [("a", 2.0, "ms"), ("b", 3.0, "%")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400), st.sampled_from(["median_ttft_ms", "output_throughput", "x"]))
def test_readers_never_crash_on_arbitrary_text(blob, metric):
    """Any text gives a result or a ParseError, never another exception."""
    for fn in (parse_result, parse_table):
        try:
            fn(blob)
        except ParseError:
            pass
    parse_pairs(blob)
    try:
        read_bench(blob, metric)
    except ParseError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["output_throughput", "request_throughput", "mean_ttft_ms", "p99.9_itl_ms",
                                        "time_to_first_token", "results_ttft_s_mean", "total_throughput", "x"]),
                       st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=8),
                                 st.dictionaries(st.sampled_from(["unit", "avg", "p99"]),
                                                 st.one_of(st.floats(), st.text(max_size=5))))))
def test_result_parser_never_crashes_on_odd_values(obj):
    """Odd JSON values (NaN, strings, nested objects, booleans) give a result or a ParseError."""
    try:
        r = parse_result(json.dumps(obj))
    except ParseError:
        return
    assert all(not math.isnan(m.value) for m in r.metrics)


def test_a_result_file_followed_by_stderr_or_broken_still_reads():
    """An indented JSON file with stderr after it is read; an unreadable one is named and stdout is read instead."""
    g = text("genai_perf_profile_export_genai_perf.json") + "\nWARNING something on stderr\n"
    assert read_bench("", "time_to_first_token.avg", file_text=g) == (171.2, "ms")
    assert read_bench("ttft=5 ms\n", "ttft", file_text="<html>") == (5.0, "ms")
    with pytest.raises(ParseError, match="the result file: .*neither JSON"):
        read_bench("nothing\n", "ttft", file_text="<html>")
