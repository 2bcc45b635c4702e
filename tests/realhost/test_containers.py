"""A server in a "container" of real namespaces (tests/realhost/container.py), diagnosed from outside it through
``--host nsenter:PID``: every command, the benchmark and the experiment's restart run inside its namespaces; the
server inside, the namespace's /tmp and the machine's as found afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Host, pids_with, proc_state
from .container import Box, bench_in, make_box, start_in, why_not

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(why_not()), reason=why_not() or "-")]


def run_in(box: Box, h: Host, *args: str, out: Path, host: str | None = None, timeout: float = 240) -> dict:
    """``debugagent run --host nsenter:PID …`` from this machine, as a subprocess: its JSON, exit, events."""
    cli = Path(sys.executable).parent / "debugagent"
    argv = [str(cli), "run", "--host", host or f"nsenter:{box.pid}", "--server-pattern", h.pattern, "--bench",
            h.bench_cmd(), "--allow-mutations", "--json", "--out", str(out), "--ready-timeout", "60", *args]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=h.dir)
    wall = time.monotonic() - t0
    assert r.stdout.strip().startswith("{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]}"
    o = json.loads(r.stdout)
    o["exit"] = r.returncode
    o["run_id"] = json.loads((out / "run.json").read_text())["run_id"]
    o["events"] = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    print(f"\n[{host or 'nsenter'}] exit {o['exit']}, {o['commands']} commands, {o['bench_runs']} benchmark runs, {wall:.1f} s")
    return o


def server_in(box: Box, h: Host) -> dict:
    """The server as found: its argv, environment and folder (from this machine's /proc), and that it runs in the box."""
    pids = [p for p in pids_with(h.tag) if "infer.serve" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert len(pids) == 1, pids
    ns = {n: os.readlink(f"/proc/{pids[0]}/ns/{n}") for n in ("mnt", "pid", "net")}
    assert ns == {n: os.readlink(f"/proc/{box.pid}/ns/{n}") for n in ("mnt", "pid", "net")}, "the server left the box"
    return proc_state(pids[0])


@pytest.fixture
def box(tmp_path):
    b = make_box(tmp_path)
    yield b
    b.stop()


def test_flag_regression_inside_namespaces_is_found_through_nsenter(realhost, box, tmp_path):
    """A server started with --disable-cuda-graph in its own mount, pid and net namespaces, its port reachable only
    there: `--host nsenter:PID` reproduces the regression there, restarts the server there without the flag (the
    restart happens inside the namespaces), names the flag by experiment, and leaves the server, the box's /tmp and
    this machine's /tmp as found."""
    h = realhost("boxed")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    start_in(box, h)
    base = min(bench_in(box, h) or 1e9 for _ in range(3))
    subprocess.run(box.enter("pkill", "-f", "--", h.pattern), check=True)
    h.flags = ["--disable-cuda-graph"]
    start_in(box, h)
    assert h.bench_once() is None, "the server's port must not be reachable from this machine's network"
    bad = sorted(bench_in(box, h) or 0 for _ in range(3))[1]
    before, box_tmp, host_tmp = server_in(box, h), box.tmp(), sorted(os.listdir("/tmp"))

    o = run_in(box, h, "--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", "--max-runs", "4", out=tmp_path / "run")

    causes = {c["hypothesis"]: c for c in o["root_causes"] or []}
    assert o["exit"] == 0 and "serving_config" in causes, o["summary"]
    assert causes["serving_config"]["how"] == "experiment"
    restarts = [e for e in o["events"] if e["event"] == "tool_call" and e["tool"] == "restart_server"]
    assert restarts and all("--disable-cuda-graph" not in e["input"]["argv"] for e in restarts[:1])
    deadline = time.monotonic() + 60
    while bench_in(box, h) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    after = server_in(box, h)
    assert after == before and "--disable-cuda-graph" in after["argv"]
    assert box.tmp() == box_tmp and o["run_id"] not in " ".join(os.listdir("/tmp"))
    assert [n for n in os.listdir("/tmp") if n not in host_tmp and o["run_id"] in n] == []
    # each command is recorded as the probe wrote it, shown as the line a person would paste here: nsenter into the box
    calls = [e for e in o["events"] if e["event"] == "tool_call"]
    assert calls and all(e["display"].startswith(f"nsenter --target {box.pid} --mount ") for e in calls)
    assert not any(e["command"].startswith("nsenter") for e in calls)
