"""Standard benchmark outputs through the bench probe, the preflight check and a real `debugagent run`.

The bench probe reads with ``benchfmt.read_bench``: on every kept recording it gives what the old
``NAME=VALUE UNIT`` reader gave, and sends the very same command; a benchmark that writes a result file
(SGLang ``--output-file``, vLLM ``--result-dir``/``--result-filename``) has it printed and read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from debugagent.agent.preflight import metric_problem
from debugagent.agent.symptom import parse_symptom
from debugagent.tools.benchfmt import OUTPUT_MARK
from debugagent.tools.errors import ParseError
from debugagent.tools.host import Bench, parse_bench

from debugagent_testing import event_lines

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ROOT / "tests" / "vectors" / "engines"
RECORDINGS = sorted((ROOT / "transcripts").glob("**/events.jsonl"))


def _bench_events() -> list[tuple[str, dict, dict]]:
    out = []
    for path in RECORDINGS:
        calls: dict[tuple, dict] = {}
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("tool") != "bench":
                continue
            key = (e["run_id"], e["call_id"])
            if e["event"] == "tool_call":
                calls[key] = e
            elif e["event"] == "tool_result":
                out.append((f"{path.parent.name}#{e['call_id']}", calls[key], e))
    return out


BENCH_EVENTS = _bench_events()


def test_every_recorded_reading_parses_to_the_same_value():
    """Every bench tool_result of the kept recordings reads to the recorded (value, unit), or fails as it did."""
    assert len(BENCH_EVENTS) >= 100
    for name, call, res in BENCH_EVENTS:
        inp = call["input"]
        try:
            got: tuple | None = parse_bench(res["stdout"], inp["metric"], inp.get("regex"))
        except ParseError:
            got = None
        want = (res["output"]["value"], res["output"]["unit"]) if res["output"] else None
        assert got == want, name


def test_every_recorded_command_and_input_is_unchanged():
    """Every benchmark is sent byte for byte as recorded, and its input dumps as recorded; only one that writes a
    result file (the quick start's `bench_serving --output-file`) has it printed after the marker, and the format
    its reading names is the one the reader finds in the recorded output."""
    from debugagent.tools.benchfmt import read_bench_format
    files = 0
    for name, call, res in BENCH_EVENTS:
        b = Bench(**call["input"])
        assert b.command() == call["command"], name
        assert b.model_dump(mode="json") == call["input"], name
        assert (OUTPUT_MARK in call["command"]) == (b.result_file() is not None), name
        files += b.result_file() is not None
        if (res["output"] or {}).get("format"):
            inp = call["input"]
            assert read_bench_format(res["stdout"], inp["metric"], inp.get("regex"))[2] == res["output"]["format"], name
    assert files >= 3   # the quick start's runs


def test_a_benchmark_writing_a_result_file_has_it_printed_and_read(tmp_path):
    """SGLang's --output-file (JSONL: the last line) is printed after the marker, read, and the exit status kept."""
    res = tmp_path / "res.jsonl"
    fake = tmp_path / "fake_bench.py"
    fake.write_text(textwrap.dedent(f"""
        import shutil, sys
        with open(sys.argv[sys.argv.index("--output-file") + 1], "a") as f:
            f.write(open({str(ENGINES / 'sglang_bench_serving.jsonl')!r}).read())
        print("done")
        sys.exit(int(sys.argv[-1]))
    """))
    for rc in (0, 3):
        b = Bench(cmd=f"{sys.executable} {fake} --output-file {res} {rc}", metric="median_ttft_ms", cwd=str(tmp_path))
        assert b.result_file() == str(res) and OUTPUT_MARK in b.command()
        r = subprocess.run(["bash", "-c", b.command()], capture_output=True, text=True, timeout=60)
        assert r.returncode == rc
        assert parse_bench(r.stdout, b.metric) == (181.94, "ms")
        assert parse_bench(r.stdout, "output_throughput") == (1196.08, "tok/s")
    # an explicit output_file wins; it is kept in the recorded input
    b = Bench(cmd="vllm bench serve --save-result", metric="p99_ttft_ms", output_file="/tmp/x.json")
    assert "cat /tmp/x.json" in b.command() and b.model_dump()["output_file"] == "/tmp/x.json"
    vllm = Bench(cmd="vllm bench serve --save-result --result-dir /r --result-filename a.json", metric="p99_ttft_ms")
    assert vllm.result_file() == "/r/a.json" and "cat /r/a.json" in vllm.command()
    assert "output_file" not in vllm.model_dump()


def _file_output(name: str) -> str:
    return "benchmark finished\n" + OUTPUT_MARK + "\n" + (ENGINES / name).read_text().strip().splitlines()[-1]


def test_preflight_reads_the_result_file_and_compares_unit_families():
    """A symptom on a result file's metric passes; a req/s reading never passes a tok/s symptom (exit 2 naming both)."""
    out = _file_output("sglang_bench_serving.jsonl")
    assert metric_problem(out, 0, "b", parse_symptom("median_ttft_ms 180ms"), None) is None
    assert metric_problem(out, 0, "b", parse_symptom("output_throughput 1200 tok/s"), None) is None
    assert metric_problem(out, 0, "b", parse_symptom("median_ttft_ms 0.18 s"), None) is None
    e = metric_problem(out, 0, "b", parse_symptom("request_throughput 4 tok/s"), None)
    assert e is not None and e.exit_code == 2 and "req/s" in e.message and "tok/s" in e.message
    vllm = _file_output("vllm_bench_serve.json")
    assert metric_problem(vllm, 0, "b", parse_symptom("p99_ttft_ms 300ms"), None) is None


def test_preflight_names_the_metrics_the_result_file_reports():
    """A metric the benchmark did not report: the error names those it did, from the file, and a fitting one."""
    e = metric_problem(_file_output("sglang_bench_serving.jsonl"), 0, "b", parse_symptom("ttft_p50 180ms"), None)
    assert e is not None and e.exit_code == 2
    assert "does not print `ttft_p50`" in e.message and "`duration` in s" in e.message and "`completed`" in e.message
    assert "--symptom 'duration" in (e.fix or "") or "_ms" in (e.fix or "")
    e = metric_problem(_file_output("vllm_bench_serve.json"), 0, "b", parse_symptom("decode 80 tok/s"), None)
    assert e is not None and "_throughput" in (e.fix or "") and "tok/s" in (e.fix or "")


# ---------------------------------------------------------------- a real run on this machine
SERVER = '''
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.002)
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass

s = HTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1] + ".tmp", "w").write(str(s.server_address[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
'''

# a bench_serving stand-in: one request to the server, then the result line appended to --output-file, the
# keys SGLang writes (tests/vectors/engines/sglang_bench_serving.jsonl); nothing readable on stdout
BENCH = '''
import json, random, sys, urllib.request
port = int(sys.argv[sys.argv.index("--port") + 1])
urllib.request.urlopen(f"http://127.0.0.1:{port}/generate", timeout=30).read()
line = json.loads(open(sys.argv[sys.argv.index("--vector") + 1]).read().strip().splitlines()[-1])
line["median_ttft_ms"] = 180.0 + random.uniform(-1.0, 1.0)
with open(sys.argv[sys.argv.index("--output-file") + 1], "a") as f:
    f.write(json.dumps(line) + "\\n")
print("#" * 20 + " benchmark finished " + "#" * 20)
'''


@pytest.fixture
def server(tmp_path):
    token = f"srv-{uuid.uuid4().hex[:10]}"
    (tmp_path / "srv.py").write_text(SERVER)
    ready = tmp_path / "port"
    p = subprocess.Popen([sys.executable, str(tmp_path / "srv.py"), str(ready), token], cwd=tmp_path,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert p.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield token, int(ready.read_text())
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_run_local_reads_the_metric_from_an_output_file(server, tmp_path):
    """`debugagent run --host local --bench 'bench_serving … --output-file F' --symptom 'median_ttft_ms 180ms'`:
    the metric is read from the file (stdout has none); no regression against the baseline: exit 3."""
    token, port = server
    (tmp_path / "bench_serving.py").write_text(BENCH)
    res = tmp_path / "results.jsonl"
    bench = (f"{sys.executable} {tmp_path / 'bench_serving.py'} --port {port} "
             f"--vector {ENGINES / 'sglang_bench_serving.jsonl'} --output-file {res}")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "local", "--server-pattern", token,
                        "--bench", bench, "--symptom", "median_ttft_ms 180ms", "--baseline", "median_ttft_ms 180ms",
                        "--reproduce-runs", "3", "--out", str(out), "--json", "--read-only"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr[-2000:]
    events = event_lines(out / "events.jsonl")
    readings = [e for e in events if e["event"] == "tool_result" and e["tool"] == "bench"]
    assert readings and all(e["error"] is None for e in readings)
    for e in readings:
        assert OUTPUT_MARK in e["command"] and OUTPUT_MARK in e["stdout"]
        assert "median_ttft_ms" not in e["stdout"].split(OUTPUT_MARK)[0]   # only the file holds it
        assert e["output"]["unit"] == "ms" and 179.0 <= e["output"]["value"] <= 181.0
    assert len(res.read_text().splitlines()) >= len(readings)   # (the load under GPU sampling runs it too)
    conc = next(e for e in events if e["event"] == "conclusion")
    assert conc["root_causes"] == [] and conc["regression"]["real"] is False


def test_a_result_file_the_run_did_not_write_is_never_read(tmp_path):
    """A benchmark that fails before writing leaves the previous run's line: it is not read, the error says so."""
    res = tmp_path / "res.jsonl"
    res.write_text((ENGINES / "sglang_bench_serving.jsonl").read_text())
    for cmd in ("sh -c 'echo failed; exit 1'", "echo nothing"):
        b = Bench(cmd=f"{cmd} # --output-file res.jsonl", metric="median_ttft_ms", cwd=str(tmp_path))
        assert b.result_file() == "res.jsonl"
        r = subprocess.run(["bash", "-c", b.command()], capture_output=True, text=True, timeout=60)
        assert r.stderr == ""
        with pytest.raises(ParseError, match="not written by this run"):
            parse_bench(r.stdout, b.metric)
    missing = Bench(cmd="true --output-file gone.jsonl", metric="x", cwd=str(tmp_path / "nowhere"))
    r = subprocess.run(["bash", "-c", missing.command()], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and OUTPUT_MARK not in r.stdout   # the cd failed: nothing ran
    r = subprocess.run(["bash", "-c", Bench(cmd="true --output-file gone.jsonl", metric="x", cwd=str(tmp_path)).command()],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "" and "did not write" in r.stdout
