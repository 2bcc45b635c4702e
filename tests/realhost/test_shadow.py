"""Shadow experiments on a real host: copies of a real server started beside it, measured in turn, stopped; the
server itself never stopped, signalled or restarted. No GPU here: ``--shadow-gpus`` is only passed on as
CUDA_VISIBLE_DEVICES, and the memory check says it could not check."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from debugagent.agent.discovery import find_server
from debugagent.agent.lab import shadow
from debugagent.tools.discovery import DiscoveryInput
from debugagent.tools.errors import UsageError
from debugagent.tools.registry import TOOLS, Runner
from debugagent.tools.transport import LocalTransport

from .conftest import Host, free_port, pids_with, tmp_leftovers
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


def test_flag_regression_is_diagnosed_in_shadow_copies_and_the_server_is_never_touched(realhost, tmp_path):
    """--disable-cuda-graph (20 ms a request): the run starts a copy without it and an unchanged copy on other ports,
    measures them in turn, names the flag with the server's own fix, and stops both; the server keeps its pid, start
    time, command line, environment and log, and answers requests all along."""
    h = realhost("shadow")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    h.start()
    base = h.baseline(3)
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
    # measured on a loaded machine: the share, not a fixed answer; its interval reaches full recovery
    assert cause["explains"] > 0.5 and cause["explains_ci"][0] < 1.3, (cause["explains"], cause["explains_ci"])
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
    assert len(benches) >= 3   # the changed copy's warm-up and at least two measured runs (two pairs may decide)
    ports = [int(e["input"]["cmd"].split()[-1]) for e in events if e["event"] == "tool_call" and e["tool"] == "bench"
             and e["input"]["cmd"].split()[-1] in (str(port), str(port + 1)) and "warm-up" not in (e.get("why") or "")]
    assert len(ports) >= 4 and ports == [port + 1, port] * (len(ports) // 2), ports   # interleaved: reference, changed, …
    assert not pids_with(f"--port {port}") and not pids_with(f"--port {port + 1}")
    assert tmp_leftovers(o["run_id"]) == []
    said = " ".join(e.get("text") or "" for e in events if e["event"] == "reasoning")
    assert "could not be checked" in said and any("could not be checked" in n for n in o["notes"])
    # the fix is the server's own change: its port and GPUs, not the copy's
    fix = (tmp_path / "run" / "transcript.md").read_text().split("## What to do now", 1)[1].split("\n## ", 1)[0]
    assert f"--port {h.port} " in fix and str(port) not in fix and "CUDA_VISIBLE_DEVICES" not in fix, fix
    assert "-m infer.serve" in fix and "--disable-cuda-graph" not in fix.split("```")[1], fix


class Calls:
    """The tools a check sent (read-only ones only, or it changed the host)."""

    def __init__(self) -> None:
        self.tools: list[str] = []

    def __call__(self, event: str, data: dict) -> None:
        if event == "tool_call":
            self.tools.append(data["tool"])


def refused(runner: Runner, calls: Calls, *args: object) -> str:
    """``shadow.check(*args)`` is exit 2 with a fix, having sent no tool that changes the host."""
    with pytest.raises(UsageError) as e:
        shadow.check(runner, *args)   # type: ignore[arg-type]
    assert e.value.exit_code == 2 and e.value.fix
    assert not [t for t in calls.tools if TOOLS[t].mutates], calls.tools
    return f"{e.value.message} fix: {e.value.fix}"


def test_bad_shadow_input_is_refused_before_anything_runs(realhost):
    """A port in use, a benchmark that names no port, a server command line with no --port, fewer GPUs than its
    parallelism, half the flags: each exit 2 with the fix, from reads alone; the server as found."""
    h = realhost("shadowbad")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    h.start()
    before = found_state(h)
    calls = Calls()
    r = Runner(LocalTransport(), calls)
    server = {"pid": before["pid"], "argv": before["argv"], "workers": []}
    port = two_free_ports()
    assert shadow.check(r, "0", port, server, shadow_bench(h)).bench.endswith("{port}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        msg = refused(r, calls, "0", taken, server, shadow_bench(h))
    assert f"port {taken} is in use" in msg and "N+1 both free" in msg
    msg = refused(r, calls, "0", port, server, h.bench_cmd())   # the port is a bare argument of the benchmark
    assert "{port}" in msg and "--bench" in msg
    msg = refused(r, calls, "0", None, server, shadow_bench(h))
    assert "--shadow-port is missing" in msg
    msg = refused(r, calls, "0", port, {**server, "argv": [*before["argv"], "--tp", "2"]}, shadow_bench(h))
    assert "needs 2 GPUs" in msg
    msg = refused(r, calls, "0,x y", port, server, shadow_bench(h))
    assert "--shadow-gpus '0,x y'" in msg
    # a server whose port is not in its command line (a positional port): nothing to point a copy at
    other = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(other), "--bind", "127.0.0.1"], cwd=h.dir,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        argv = [sys.executable, "-m", "http.server", str(other), "--bind", "127.0.0.1"]
        msg = refused(r, calls, "0", port, {"pid": srv.pid, "argv": argv}, f"curl -s http://127.0.0.1:{other}/")
        assert "has no --port N, --port=N or -p N" in msg
        assert srv.poll() is None
    finally:
        srv.kill()
        srv.wait(timeout=10)
    assert found_state(h) == before


def test_shadow_gpus_without_the_memory_are_refused_on_a_simulated_host(sim_host):
    """sim:attention-default-changed: its one GPU is held by the server (nvidia-smi's compute apps), so two copies
    do not fit there: exit 2 naming the GPU and the memory, from reads alone."""
    calls = Calls()
    r = Runner(sim_host("attention-default-changed"), calls)
    server = find_server(r, DiscoveryInput())
    assert server is not None and "--port" in server.argv
    msg = refused(r, calls, "0", 31000, server.model_dump(), "gpu-bench --port {port}")
    assert "--shadow-gpus 0: GPU 0 has" in msg and "MiB free" in msg and "twice the" in msg, msg
    assert "fix: name GPUs with that much memory free" in msg, msg
    assert f"pid {server.pid}" in msg and "gpu_memory" in calls.tools
    msg = refused(r, calls, "3", 31000, server.model_dump(), "gpu-bench --port {port}")
    assert "the host has no GPU 3" in msg
