"""Host parsers: pip list, server command lines, git, host info, benchmark lines."""

from __future__ import annotations

import pytest
from debugagent.tools.errors import ParseError
from debugagent.tools.host import (
    Bench,
    PythonPackages,
    parse_bench,
    parse_find_servers,
    parse_flags,
    parse_git_range,
    parse_git_state,
    parse_host_info,
    parse_python_packages,
    parse_server_details,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import vector


def test_bench_vector_reads_metric_with_unit_in_name():
    """The launch-bound benchmark prints `eager_step_ms=1.355`: the last match is read."""
    text = vector("bench.txt")
    value, unit = parse_bench(text, "graph_step_ms")
    assert value == pytest.approx(0.514) and unit is None
    value, _ = parse_bench(text.splitlines()[1], "eager_step_ms")
    assert value == pytest.approx(2.647)


def test_bench_metric_value_unit_and_regex():
    """`verify=30.1 ms` gives value and unit; a user regex takes group 1."""
    assert parse_bench("[bench] warmup\nverify=30.125 ms\n", "verify") == (30.125, "ms")
    assert parse_bench("decode: 82.3 tok/s", "decode") == (82.3, "tok/s")
    assert parse_bench("Output token throughput (tok/s): 1234.5", "x", regex=r"throughput \(tok/s\):\s+([0-9.]+)")[0] == 1234.5
    with pytest.raises(ParseError, match="no `verify=VALUE UNIT`"):
        parse_bench("nothing here", "verify")


def test_bench_command_quotes_cwd_and_env():
    """The working directory and environment reach the shell quoted."""
    cmd = Bench(cmd="gpu-bench", metric="x", cwd="/tmp/a b", env={"A": "x y"}).command()
    assert cmd == "cd '/tmp/a b' && env A='x y' gpu-bench"


def test_flags_and_server_details_redact_secrets():
    """A server's command line parses into flags; secret-named variables are redacted."""
    assert parse_flags(["--tp", "8", "--disable-cuda-graph", "--x=y", "--mem_fraction", "0.8"]) == {
        "tp": "8", "disable-cuda-graph": True, "x": "y", "mem-fraction": "0.8"}
    text = ("== cmdline\n+/root/ml-env/bin/python3\n+-m\n+sglang.launch_server\n+--tp\n+8\n\n== environ\n"
            "+HF_TOKEN=hf_abcdefghijkl\n+CUDA_LAUNCH_BLOCKING=1\n\n== cwd\n/root/sglang\n== end\n")
    info = parse_server_details(42, text)
    assert info.python == "/root/ml-env/bin/python3" and info.entry == "sglang.launch_server"
    assert info.kind == "sglang" and info.cwd == "/root/sglang"
    assert info.env == {"HF_TOKEN": "[REDACTED]", "CUDA_LAUNCH_BLOCKING": "1"}


def test_find_servers_splits_argv():
    """Processes come back sorted, with argv split on the unit separator."""
    out = parse_find_servers("12\tpython3\x1f-m\x1fvllm.entrypoints.openai.api_server\x1f\n7\ta\x1fb\n")
    assert [p.pid for p in out] == [7, 12]
    assert out[1].argv == ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def test_git_state_previous_head():
    """The reflog tells where HEAD was before it last moved."""
    sep = "\x1f"
    text = "\n".join([
        "== head", "b" * 40, "== branch", "main", "== status", " M python/x.py", "== log",
        sep.join(["b" * 40, "bbbbbbb", "2026-11-28T18:45:00+00:00", "Improve CI"]), "== reflog",
        sep.join(["b" * 40, "HEAD@{2026-11-29T08:00:00+00:00}", "merge: Fast-forward"]),
        sep.join(["a" * 40, "HEAD@{2026-11-29T07:59:00+00:00}", "reset: moving to a"]), "== end"])
    g = parse_git_state("/r", text)
    assert g.previous_head() == "a" * 40
    assert g.dirty == ["python/x.py"]
    assert g.reflog[0].when == "2026-11-29T08:00:00+00:00"


def test_a_subject_holding_the_field_separator_keeps_its_commit():
    """git's field separator inside a commit subject (or a reflog line) stays in that text: the commit is read,
    with its sha, in the state and in a bisection's range."""
    sep = "\x1f"
    subject = f'say "done" {sep}-field{sep}'
    text = "\n".join([
        "== head", "b" * 40, "== branch", "main", "== status", "== log",
        sep.join(["b" * 40, "bbbbbbb", "2026-11-28T18:45:00+00:00", subject]), "== reflog",
        sep.join(["b" * 40, "HEAD@{2026-11-29T08:00:00+00:00}", f"commit: {subject}"]), "== end"])
    g = parse_git_state("/r", text)
    assert g.commits[0].sha == "b" * 40 and g.commits[0].subject == subject
    assert g.reflog[0].action == f"commit: {subject}"
    r = parse_git_range(sep.join(["c" * 40, "ccccccc", "2026-11-28T18:45:00+00:00", subject]) + "\n")
    assert r.commits[0].sha == "c" * 40 and r.commits[0].subject == subject


def test_host_info():
    """Host facts: governors counted, the host profile read as JSON."""
    text = ("== hostname\ngpu-node-3\n== kernel\n6.1.0\n== cores\n64\n== loadavg\n0.42 0.3 0.2 1/2 3\n"
            "== governor\n     64 powersave\n== profile\n{\"bench\": \"b\"}\n\n== end\n")
    h = parse_host_info(text)
    assert h.governor == "powersave" and h.cores == 64 and h.profile == {"bench": "b"}


def test_packages_command_quotes_python():
    """The interpreter path and names are quoted; the display form is short."""
    inp = PythonPackages(python="/root/my env/bin/python3", import_check=["sgl_kernel"])
    assert inp.command().startswith("'/root/my env/bin/python3' -c ")
    assert inp.command().endswith(" sgl_kernel")
    with pytest.raises(ParseError):
        parse_python_packages("Traceback: no")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_host_parsers_never_crash(text):
    """Any text into the host parsers: a result or ParseError, never a traceback."""
    for fn in (lambda t: parse_git_state("/r", t), parse_host_info, parse_python_packages,
               parse_find_servers, lambda t: parse_server_details(1, t), lambda t: parse_bench(t, "verify")):
        try:
            fn(text)
        except ParseError:
            pass
