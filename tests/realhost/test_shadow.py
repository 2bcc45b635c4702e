"""Shadow experiments on a real host: copies of a real server started beside it, measured in turn, stopped; the
server itself never stopped, signalled or restarted. No GPU here: ``--shadow-gpus`` is only passed on as
CUDA_VISIBLE_DEVICES, and the memory check says it could not check."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import ROOT, Host, free_port, pids_with, tmp_leftovers
from .test_experiments import found_state, report, tools_called

pytestmark = pytest.mark.slow


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def two_free_ports() -> int:
    """N with N and N+1 free (checked by binding both)."""
    for _ in range(50):
        p = free_port()
        if p >= 65535:
            continue
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two free ports in a row")


class Traffic:
    """Requests to the server while a run goes on: it must keep answering every one."""

    def __init__(self, port: int) -> None:
        self.port, self.ok, self.failed = port, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    self.ok += 1
                c.close()
            except OSError as exc:
                self.failed.append(str(exc))
            self.stop.wait(0.3)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=15)


def shadow_bench(h: Host) -> str:
    return f"{sys.executable} {h.dir / 'bench.py'} {{port}}"


def run_cli(h: Host, *args: str, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "local", "--server-pattern", h.pattern,
            "--allow-mutations", "--json", "--out", str(out), "--ready-timeout", "60", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=h.dir)


def test_flag_regression_is_diagnosed_in_shadow_copies_and_the_server_is_never_touched(realhost, tmp_path):
    """--disable-cuda-graph (20 ms a request): the run starts a copy without it and an unchanged copy on other ports,
    measures them in turn, names the flag with the server's own fix, and stops both; the server keeps its pid, start
    time, command line, environment and log, and answers requests all along."""
    h = realhost("shadow")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    h.start()
    base = h.baseline()
    h.flags = ["--disable-cuda-graph"]
    h.restart()
    bad = h.baseline(3)
    before = found_state(h)
    ticks = start_ticks(before["pid"])
    log_before = h.log.read_text()
    port = two_free_ports()

    with Traffic(h.port) as traffic:
        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms",
                  "--shadow-gpus", "0", "--shadow-port", str(port), "--bench", shadow_bench(h), out=tmp_path / "run")
    report(o, "shadow")

    assert o["exit"] == 0, o["summary"]
    cause = o["root_cause"]
    assert cause["hypothesis"] == "serving_config" and cause["how"] == "experiment"
    assert 0.5 < cause["explains"] < 1.6   # measured on a loaded machine: the share, not a fixed answer
    # the server: never restarted, never signalled, answering throughout
    assert not tools_called(o, "restart_server") and not tools_called(o, "restart_hook")
    after = found_state(h)
    assert after == before and start_ticks(after["pid"]) == ticks
    assert "--disable-cuda-graph" in after["argv"]
    assert h.log.read_text() == log_before
    assert traffic.ok >= 3 and not traffic.failed, (traffic.ok, traffic.failed)
    # the copies: journalled before each started, on the shadow GPUs and ports, measured in turn, then gone
    starts = tools_called(o, "start_copy")
    assert {s["role"] for s in starts} == {"reference", "changed"}
    assert all(s["gpus"] == "0" and s["env_pid"] == before["pid"] for s in starts)
    changed = next(s for s in starts if s["role"] == "changed")
    assert f"--port {port}" in " ".join(changed["argv"]) and "--disable-cuda-graph" not in changed["argv"]
    assert f"--port {port + 1}" in " ".join(next(s for s in starts if s["role"] == "reference")["argv"])
    events = o["events"]
    first_start = next(i for i, e in enumerate(events) if e["event"] == "tool_call" and e["tool"] == "start_copy")
    assert any(e["event"] == "experiment" and e.get("phase") == "undo_recorded" and e.get("tool") == "stop_copy"
               for e in events[:first_start])
    benches = [e["input"]["cmd"] for e in events if e["event"] == "tool_call" and e["tool"] == "bench"
               and str(port) in e["input"]["cmd"].split()[-1]]
    assert len(benches) >= 4
    ports = [int(e["input"]["cmd"].split()[-1]) for e in events if e["event"] == "tool_call" and e["tool"] == "bench"
             and e["input"]["cmd"].split()[-1] in (str(port), str(port + 1)) and "warm-up" not in (e.get("why") or "")]
    assert ports[:4] == [port + 1, port, port + 1, port], ports   # interleaved: reference, changed, …
    assert not pids_with(f"--port {port}") and not pids_with(f"--port {port + 1}")
    assert tmp_leftovers(o["run_id"]) == []
    said = " ".join(e.get("text") or "" for e in events if e["event"] == "reasoning")
    assert "could not be checked" in said
    # the fix is the server's own change: its port and GPUs, not the copy's
    fix = (tmp_path / "run" / "transcript.md").read_text().split("## What to do now", 1)[1].split("\n## ", 1)[0]
    assert f"--port {h.port} " in fix and str(port) not in fix and "CUDA_VISIBLE_DEVICES" not in fix, fix
    assert "-m infer.serve" in fix and "--disable-cuda-graph" not in fix.split("```")[1], fix


def test_bad_shadow_input_is_refused_before_anything_runs(realhost, tmp_path):
    """A port in use, a benchmark that names no port, and a server command line with no --port: each exit 2 with the
    fix, before any benchmark run or change."""
    h = realhost("shadowbad")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    h.start()
    before = found_state(h)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        r = run_cli(h, "--symptom", "latency 30 ms", "--baseline", "latency 10 ms", "--bench", shadow_bench(h),
                    "--shadow-gpus", "0", "--shadow-port", str(taken), out=tmp_path / "busy")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"port {taken} is in use" in r.stderr and "N+1 both free" in r.stderr

    port = two_free_ports()
    r = run_cli(h, "--symptom", "latency 30 ms", "--baseline", "latency 10 ms", "--bench", h.bench_cmd(),
                "--shadow-gpus", "0", "--shadow-port", str(port), out=tmp_path / "nobench")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "{port}" in r.stderr and "--bench" in r.stderr

    r = run_cli(h, "--symptom", "latency 30 ms", "--bench", shadow_bench(h), "--shadow-gpus", "0",
                out=tmp_path / "half")
    assert r.returncode == 2 and "--shadow-port is missing" in r.stderr, r.stderr[-2000:]

    for out in ("busy", "nobench", "half"):
        events = [json.loads(x) for x in (tmp_path / out / "events.jsonl").read_text().split("\n") if x] \
            if (tmp_path / out / "events.jsonl").exists() else []
        assert not [e for e in events if e["event"] == "tool_call" and e["tool"] in ("bench", "start_copy")]
    assert found_state(h) == before

    # a server whose port is not in its command line (a positional port): nothing to point a copy at
    other = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(other), "--bind", "127.0.0.1"], cwd=h.dir,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "local", "--server-pattern",
                            rf"-m http\.server {other}", "--allow-mutations", "--json", "--out", str(tmp_path / "noport"),
                            "--symptom", "latency 30 ms", "--bench", f"curl -s http://127.0.0.1:{other}/",
                            "--shadow-gpus", "0", "--shadow-port", str(port)],
                           capture_output=True, text=True, timeout=120, cwd=h.dir)
        assert r.returncode == 2, r.stderr[-2000:]
        assert "has no --port N, --port=N or -p N" in r.stderr
        assert srv.poll() is None
    finally:
        srv.kill()
        srv.wait(timeout=10)


def test_shadow_gpus_without_the_memory_are_refused_on_a_simulated_host(tmp_path):
    """sim:attention-default-changed: its one GPU is held by the server (nvidia-smi's compute apps), so two copies
    do not fit there: exit 2 naming the GPU and the memory, before any benchmark run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if "PYTHONPATH" in os.environ else dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "sim:attention-default-changed",
                        "--symptom", "decode 19ms", "--baseline", "decode 14ms", "--allow-mutations", "--json",
                        "--out", str(tmp_path / "run"), "--bench", "gpu-bench --port {port}",
                        "--shadow-gpus", "0", "--shadow-port", "31000"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, (r.stdout[-1000:], r.stderr[-2000:])
    assert "--shadow-gpus 0: GPU 0 has" in r.stderr and "MiB free" in r.stderr and "twice the" in r.stderr
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().split("\n") if x]
    assert not [e for e in events if e["event"] == "tool_call" and e["tool"] in ("bench", "start_copy")]
    assert any(e["event"] == "tool_call" and e["tool"] == "gpu_memory" for e in events)
