"""An offline workload on a real host (``--host local``): no server at all, the benchmark is the program (a script
with its own ``--batch-size``), and CUDA_LAUNCH_BLOCKING=1 on its command line slows every run. debugagent finds
no server, takes the script for the workload, confirms the variable by running the script without it (nothing to
restart), never touches the script's flags, and leaves the host as found."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.realhost.conftest import tmp_leftovers

SCRIPT = '''"""An offline batch job: its work is --num-prompts requests in batches of --batch-size; a synchronous launch
(CUDA_LAUNCH_BLOCKING=1) costs each batch more."""
import argparse, os, time
ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, required=True)
ap.add_argument("--num-prompts", type=int, required=True)
a = ap.parse_args()
per_batch = 0.004 + (0.004 if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else 0.0)
t0 = time.perf_counter()
for _ in range(a.num_prompts // a.batch_size):
    time.sleep(per_batch)
print(f"throughput={a.num_prompts / (time.perf_counter() - t0):.2f} req/s")
'''


def tree_state(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def bench_value(cmd: str) -> float:
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True)
    return float(r.stdout.split("=")[1].split()[0])


def test_an_offline_script_with_an_env_regression(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "offline.py").write_text(SCRIPT)
    script = f"{sys.executable} offline.py --batch-size 8 --num-prompts 400"
    good = sorted(bench_value(f"cd {job} && {script}") for _ in range(3))[1]
    bench = f"cd {job} && CUDA_LAUNCH_BLOCKING=1 {script}"
    bad = sorted(bench_value(bench) for _ in range(3))[1]
    before = tree_state(job)

    out = tmp_path / "run"
    cli = Path(sys.executable).parent / "debugagent"
    # a pattern no process of this machine matches (other tests' servers run beside this one): no server at all
    argv = [str(cli), "run", "--host", "local", "--server-pattern", f"no-server-{uuid.uuid4().hex}", "--bench", bench,
            "--symptom", f"throughput {bad:.1f} req/s", "--baseline",
            f"throughput {good:.1f} req/s", "--allow-mutations", "--json", "--out", str(out), "--ready-timeout", "30"]
    started = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.stdout.strip().startswith("{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]}"
    o = json.loads(r.stdout)
    wall = time.monotonic() - started
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().split("\n") if x]

    causes = {c["hypothesis"]: c for c in o["root_causes"]}
    assert r.returncode == 0 and "env_var" in causes, o["summary"]
    assert causes["env_var"]["how"] == "experiment" and "CUDA_LAUNCH_BLOCKING" in json.dumps(causes["env_var"])
    assert set(causes) == {"env_var"}, o["summary"]
    said = " ".join(e.get("text") or "" for e in events)
    assert "offline workload" in said
    # the changed runs are the script without the variable, its own flags as they were; nothing was restarted
    cmds = [e["input"]["cmd"] for e in events if e["event"] == "tool_call" and e["tool"] == "bench"]
    changed = [c for c in cmds if "CUDA_LAUNCH_BLOCKING=1" not in c]
    assert changed and all("env -u CUDA_LAUNCH_BLOCKING" in c and "--batch-size 8 --num-prompts 400" in c
                           for c in changed), cmds
    assert not [e for e in events if e["event"] == "tool_call" and e["tool"] in ("restart_server", "server_control")]
    # the host as found: the job's folder byte for byte, nothing left in /tmp
    assert tree_state(job) == before
    assert tmp_leftovers(run_id) == []
    print(f"\n[offline] exit {r.returncode}, {wall:.1f} s wall, {o['commands']} commands, {o['bench_runs']} runs: "
          f"{o['summary'][:300]}")
