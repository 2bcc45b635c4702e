"""`scripts/gpu-lab` on this CPU-only machine: the H200 lab's five cases with its numpy server, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow



def test_the_gpu_lab_on_numpy_diagnoses_every_case_and_leaves_the_host_as_found(tmp_path):
    """A real server (numpy), a real venv with a C extension built twice under one version, a real git history:
    the env, flag, package and code cases confirmed by experiment, the healthy one blamed on nothing, the host as
    found after each (the lab checks the server's command line, folder and environment, HEAD, worktrees, the
    installed files, /tmp and the host journals)."""
    out = tmp_path / "lab"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-lab"), "--backend", "numpy", "--out", str(out)],
                       capture_output=True, text=True, timeout=1200, cwd=ROOT)
    summary = json.loads((out / "summary.json").read_text())
    cases = {c["case"]: c for c in summary["cases"]}
    for name, c in cases.items():
        print(f"[{name}] exit {c['exit']}, {c['root_cause']} by {c['how']}, share {c['explains']} {c['explains_ci']}, "
              f"{c['bench_runs']} runs, {c['wall_s']} s")
    assert set(cases) == {"env", "flag", "package", "healthy", "code"}
    assert all(c["host_as_found"] and not c["differences"] for c in cases.values()), cases
    assert cases["healthy"]["exit"] == 3 and cases["healthy"]["root_cause"] is None
    for name, want in (("env", "env_var"), ("flag", "serving_config"), ("package", "compiled_dependency"),
                       ("code", "code_change")):
        assert cases[name]["root_cause"] == want and cases[name]["how"] == "experiment", (name, cases[name]["summary"])
    assert cases["code"].get("culprit")
    assert r.returncode == 0, r.stderr[-2000:]
