"""Scenario authoring: `sim new --like NAME` starts a file that validates and runs; `sim validate` names the
file, the line and the field of a mistake, and the fix, in well under 2 s, and starts nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_new_then_validate_then_run(tmp_path):
    f = tmp_path / "My Capped Box.yaml"
    r = cli("sim", "new", "--like", "power-capped", str(f))
    assert r.returncode == 0, r.stderr
    assert "name: my-capped-box" in f.read_text()
    v = cli("sim", "validate", str(f))
    assert v.returncode == 0, v.stderr
    assert "ok: my-capped-box" in v.stdout and "gpus.0.power_limit" in v.stdout and "expects gpu_clocks" in v.stdout
    again = cli("sim", "new", "--like", "power-capped", str(f))
    assert again.returncode == 2 and "exists" in again.stderr
    run = cli("run", "--host", f"sim:{f}", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s", "--json")
    assert run.returncode == 0, run.stderr


def test_validate_names_the_line_and_field(tmp_path):
    f = tmp_path / "bad.yaml"
    cli("sim", "new", "--like", "power-capped", str(f))
    text = f.read_text().replace("power_limit: 450", "power_limit: lots")
    f.write_text(text)
    want = next(n for n, line in enumerate(text.splitlines(), 1) if "power_limit: lots" in line)
    t0 = time.monotonic()
    v = cli("sim", "validate", str(f))
    took = time.monotonic() - t0
    assert v.returncode == 2
    assert f"line {want}: host.gpus.0.power_limit" in v.stderr, v.stderr
    assert "fix:" in v.stderr and "Traceback" not in v.stderr
    assert took < 30   # a process start and a parse; the 2 s of the issue are measured in-process below


def test_validate_in_process_is_fast_and_names_the_line(tmp_path):
    from debugagent.tools.errors import ScenarioError
    from debugagent.tools.sim.scenario import builtin_dir, parse_scenario
    text = (builtin_dir() / "launch-blocking.yaml").read_text().replace("  hostname:", "  hostnme:", 1)
    t0 = time.perf_counter()
    try:
        parse_scenario(text, "x.yaml")
        raise AssertionError("accepted")
    except ScenarioError as exc:
        took = time.perf_counter() - t0
        want = next(n for n, line in enumerate(text.splitlines(), 1) if line == "host:")   # a missing key: its parent
        assert f"line {want}: host.hostname" in exc.message, exc.message
    assert took < 2.0


def test_validate_bad_input(tmp_path):
    r = cli("sim", "validate", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr
    b = tmp_path / "bin.yaml"
    b.write_bytes(b"\xff\xfe\x00")
    r = cli("sim", "validate", str(b))
    assert r.returncode == 2 and "not text" in r.stderr
