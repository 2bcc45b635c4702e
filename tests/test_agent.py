"""The agent end to end over simulated hosts: every scenario, both baselines, unseen scenarios,
the transcript, Ctrl-C in the middle of an experiment, and resume."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools.registry import Runner
from debugagent.tools.sim import SimTransport, builtin_names, load_scenario, parse_scenario
from debugagent.tools.sim.serve import SSHD
from debugagent.tools.snapshot import collect, diff, dump
from debugagent.tools.transport import BaseTransport

from debugagent_testing import event_lines

ALL = builtin_names()


# hypotheses the default playbook has no experiment for: only evidence or elimination can point at them,
# and elimination only ranks, so the right answer may be "no confirmed cause, this is the top suspect"
UNTESTABLE = {"compiled_dependency", "driver_cuda", "gpu_contention"}


def check(sc, out) -> None:
    """The run's answer against the scenario's ``expect`` under the verdict contract of --json schema 2."""
    exp = sc.expect
    assert out["schema"] == 2
    blamed = {c["hypothesis"] for c in out["root_causes"]}
    assert blamed <= {exp.root_cause, *exp.also}, f"false blame {blamed}: {out['summary']}"
    assert all(c["how"] in ("experiment", "evidence") for c in out["root_causes"]), "confirmed by elimination"
    if exp.root_cause is None:
        assert out["exit_code"] == 3, out["summary"]
        assert out["root_cause"] is None and out["root_causes"] == [] and out["suspects"] == []
        return
    mentions = [exp.mentions] if isinstance(exp.mentions, str) else (exp.mentions or [])
    rc = out["root_cause"]
    if rc is None:
        assert exp.root_cause in UNTESTABLE, out["summary"]
        assert out["exit_code"] == 3, out["summary"]
        top = out["suspects"][0]
        assert top["hypothesis"] == exp.root_cause and top["next"], out["summary"]
        for m in mentions:
            assert m.lower() in json.dumps(top).lower(), (m, top)
    else:
        assert out["exit_code"] == 0, out["summary"]
        assert rc["hypothesis"] == exp.root_cause, out["summary"]
        for m in mentions:
            assert m.lower() in json.dumps(rc).lower(), (m, rc)
        assert set(exp.also) <= blamed, out["summary"]
        if rc["how"] == "experiment":
            lo, hi = rc["explains_ci"]
            assert lo <= rc["explains"] <= hi
            assert 0.5 <= rc["explains"] <= 1.3 or exp.also, out["summary"]
        else:
            assert rc["explains"] is None and rc["explains_ci"] is None
    top = out["root_cause"] or out["suspects"][0]
    assert top["hypothesis"] not in {r["hypothesis"] for r in out["ruled_out"]}
    assert out["commands"] > 0 and Path(out["transcript"], "transcript.md").is_file()


def given_bench(sc) -> str | None:
    """The --bench a user gives where the host has no profile naming its benchmark."""
    return None if sc.host.profile else sc.bench.command()


@pytest.mark.skipif(Path(SSHD).is_file(), reason="with sshd, each scenario is diagnosed from numbers over SSH, "
                    "under this same check (tests/test_ssh.py::test_scenario_over_ssh_matches_sim)")
@pytest.mark.parametrize("name", ALL)
def test_scenario_with_numbers(name, tmp_path):
    """Each built-in scenario is diagnosed from `--baseline METRIC VALUE UNIT` (here over `sim:` where this
    machine has no sshd; tests/test_ssh.py runs the same check over SSH)."""
    sc = load_scenario(name)
    out = investigate(RunOptions(host=f"sim:{name}", symptom=sc.symptom, baseline=sc.baseline, as_json=True,
                                 out=str(tmp_path / "run"), bench=given_bench(sc)))
    check(sc, out)


@pytest.mark.parametrize("name", ALL)
def test_scenario_with_baseline_snapshot(name, tmp_path):
    """Each built-in scenario is diagnosed from a snapshot of its good state."""
    sc = load_scenario(name)
    snap = tmp_path / "good.json"
    with SimTransport(f"sim:{name}@good") as t:
        snap.write_text(dump(collect(Runner(t), bench_runs=3, bench=given_bench(sc),
                                     metric=None if sc.host.profile else sc.bench.metric)))
    out = investigate(RunOptions(host=f"sim:{name}", symptom=sc.symptom, baseline_snapshot=str(snap), as_json=True,
                                 out=str(tmp_path / "run"), bench=given_bench(sc)))
    check(sc, out)


UNSEEN = """
version: 1
name: vllm-eager-p2p
story: A vLLM host in /srv with --enforce-eager left on and NCCL P2P disabled.
symptom: tpot 31ms
baseline: tpot 24ms
expect: {root_cause: serving_config, mentions: enforce-eager, also: [env_var]}
host:
  hostname: inference-b7
  user: svc
  driver: {version: 570.86.15, cuda: "12.8"}
  gpus: [{name: NVIDIA H100 80GB HBM3, memory_mib: 81559, sm_clock_max: 1980}, {name: NVIDIA H100 80GB HBM3, memory_mib: 81559}]
  python: /srv/py/bin/python3
  packages:
    vllm: {version: 0.10.1}
    torch: {version: 2.7.1+cu128}
  server:
    cmd: /srv/py/bin/python3 -m vllm.entrypoints.openai.api_server
    args: {model: Qwen/Qwen2.5-72B-Instruct, tensor-parallel-size: 2, enforce-eager: true}
    env: {NCCL_P2P_DISABLE: "1", OPENAI_API_KEY: sk-abcdefghijklmnopqrstuvwx}
    cwd: /srv/app
  cpu: {governor: performance, cores: 48}
bench: {metric: tpot, unit: ms, base: 24.0, noise_pct: 2, cmd: bench-serving}
factors:
  - {path: server.args.enforce-eager, good: null, bad: true, effect: +5.0}
  - {path: server.env.NCCL_P2P_DISABLE, good: null, bad: "1", effect: +2.0}
"""


def test_unseen_scenario_is_diagnosed(tmp_path):
    """A scenario no test has seen (other paths, user, tool, two causes) is diagnosed too."""
    p = tmp_path / "unseen.yaml"
    p.write_text(UNSEEN)
    sc = parse_scenario(UNSEEN, str(p))
    out = investigate(RunOptions(host=f"sim:{p}", symptom=sc.symptom, baseline=sc.baseline, as_json=True,
                                 out=str(tmp_path / "run")))
    check(sc, out)
    assert "sk-abcdefghijklmnop" not in (Path(out["transcript"]) / "events.jsonl").read_text()


def test_agent_and_playbook_name_no_scenario():
    """Nothing in the agent or the playbook names a built-in scenario or reads scenario files."""
    root = Path(__file__).resolve().parents[1]
    files = [p for p in (root / "agent").glob("*.py") if p.name != "cli.py"]  # cli.py fronts `sim list|serve`
    text = "\n".join(p.read_text() for p in files + list((root / "playbooks").glob("*.yaml")))
    for name in ALL:
        assert name not in text
    assert "load_scenario" not in text and "factors" not in text


@pytest.fixture(scope="module")
def seeds_run(module_isolated) -> dict:
    """One run of the seeds' story (`sim:eagle3-flashinfer-rebuilt`, verify 30ms against 20ms), read by the tests
    below: each asks something else of the same run (isolated as a test is: tests/conftest.py)."""
    return investigate(RunOptions(host="sim:eagle3-flashinfer-rebuilt", symptom="verify 30ms", baseline="verify 20ms",
                                  as_json=True, out=str(module_isolated / "run")))


def test_seed_transcript_reads_like_the_seeds(seeds_run):
    """The seeds' story gives numbered messages with pasteable ssh lines, outputs, and a verdict table."""
    out = seeds_run
    md = (Path(out["transcript"]) / "transcript.md").read_text()
    assert "[msg 1] [assistant]" in md
    assert "[assistant] [bash] `ssh root@gpu-node-3 \"nvidia-smi --query-gpu=" in md
    assert "Output:" in md
    assert "-C /root/sglang worktree add --detach" in md and "worktree remove" in md
    for h in ["code_change", "gpu_clocks", "pcie_link", "serving_config", "compiled_dependency", "driver_cuda",
              "env_var", "gpu_contention", "host_cpu"]:
        assert f"| {h} |" in md
    assert "| code_change | ruled out | experiment |" in md
    assert "| serving_config | ruled out | experiment |" in md
    assert "speculative-attention-mode decode" in md
    assert "| compiled_dependency | suspect |" in md and "CONFIRMED" not in md
    assert out["exit_code"] == 3 and out["suspects"][0]["hypothesis"] == "compiled_dependency"
    assert out["suspects"][0]["next"] and out["root_cause"] is None
    events = (Path(out["transcript"]) / "events.jsonl").read_text()
    assert "hf_live_secret_value" not in events and "hf_live_secret_value" not in md
    names = {json.loads(line)["event"] for line in events.splitlines()}
    assert {"run_started", "tool_call", "tool_result", "verdict", "experiment", "conclusion"} <= names


class InterruptAt(BaseTransport):
    """Wraps a transport; raises KeyboardInterrupt (what SIGINT raises) at the Nth benchmark of an experiment."""

    def __init__(self, inner: BaseTransport, marker: str, nth: int) -> None:
        self.inner, self.marker, self.nth = inner, marker, nth
        self.host, self.sandbox, self.instance = inner.host, inner.sandbox, inner.instance
        self.seen = 0
        self.armed = True

    def run(self, command, **kw):
        r = self.inner.run(command, **kw)
        if self.armed and self.marker in command:
            self.seen += 1
            if self.seen == self.nth:
                self.armed = False
                raise KeyboardInterrupt
        return r

    def display(self, command):
        return self.inner.display(command)


def test_sigint_mid_experiment_restores_host_and_resume_finishes(tmp_path):
    """Ctrl-C during an experiment leaves the host exactly as found; `resume` then finishes the run."""
    name = "launch-blocking"
    sc = load_scenario(name)
    with SimTransport(f"sim:{name}") as sim:
        before = collect(Runner(sim))
        # the 8th benchmark is the second one after the server was restarted without the variable (the first
        # checks the metric, the second samples the GPUs, five reproduce)
        t = InterruptAt(sim, "gpu-bench", 8)
        opts = RunOptions(host=f"sim:{name}", symptom=sc.symptom, baseline=sc.baseline, as_json=True, out=str(tmp_path / "run"))
        out = investigate(opts, transport=t)
        assert out.get("interrupted")
        after = collect(Runner(sim))
        assert diff(before, after) == []
        assert before.server.flags == after.server.flags and before.server.env == after.server.env
        events = event_lines(tmp_path / "run" / "events.jsonl")
        phases = [e.get("phase") for e in events if e["event"] == "experiment"]
        assert "undo_recorded" in phases and "undo" in phases
        assert events[-1]["event"] == "interrupted"
        assert not list(Path("/tmp").glob(f"debugagent-{events[0]['run_id']}-*.env"))
        n_before = len(events)
        out = investigate(opts, folder=tmp_path / "run", resume=True, transport=sim)
        check(sc, out)
        events = event_lines(tmp_path / "run" / "events.jsonl")[n_before:]
        assert events[0]["event"] == "resumed"
        redone = [e["tool"] for e in events if e["event"] == "tool_call"]
        assert "python_packages" not in redone and "process_table" in redone  # evidence kept, experiment redone
        final = collect(Runner(sim))
        assert diff(before, final) == []


def test_cli_sigint_exit_130_and_resume(tmp_path):
    """A real SIGINT to `debugagent run` mid-experiment exits 130 and `debugagent resume` finishes (exit 0)."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "sim:cuda-graph-disabled", "--symptom",
                          "decode 62 tok/s", "--baseline", "decode 89 tok/s", "--out", str(run), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ev = run / "events.jsonl"
        if ev.exists() and '"phase": "measure"' in ev.read_text() or (ev.exists() and '"tool": "restart_server"' in ev.read_text()):
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "debugagent resume" in err
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "resume", str(run), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["root_cause"]["hypothesis"] == "serving_config"


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_run_json_and_exit_codes(tmp_path):
    """`run --json` prints one object with the contract's keys; exit 0 on a cause, 3 on none."""
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s",
            "--json", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert {"root_cause", "root_causes", "suspects", "ruled_out", "commands", "transcript"} <= set(o)
    rc = o["root_cause"]
    assert o["schema"] == 2 and rc["hypothesis"] == "gpu_clocks" and rc["how"] == "experiment"
    assert rc["explains"] > 0.5 and rc["explains_ci"][0] < rc["explains"] < rc["explains_ci"][1] and rc["explains_ci"][1] > 0.8
    r = cli("run", "--host", "sim:no-regression", "--symptom", "decode 87 tok/s", "--baseline", "decode 89 tok/s",
            "--json", "--out", str(tmp_path / "b"))
    assert r.returncode == 3 and json.loads(r.stdout)["root_cause"] is None


def test_cli_bad_inputs_exit_2(tmp_path):
    """Bad symptom, unknown playbook, both baselines: exit 2 with the flag and a fix."""
    r = cli("run", "--host", "sim:power-capped", "--symptom", "slow", "--baseline", "decode 89 tok/s")
    assert r.returncode == 2 and "--symptom" in r.stderr and "decode 82 tok/s" in r.stderr
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--playbook", "gpu-inference")
    assert r.returncode == 2 and "gpu-inference-regression" in r.stderr
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s",
            "--baseline-snapshot", str(tmp_path / "x.json"))
    assert r.returncode == 2


def bench_calls(out: dict) -> list[tuple[dict, dict]]:
    evs = event_lines(Path(out["transcript"]) / "events.jsonl")
    results = {e["call_id"]: e for e in evs if e["event"] == "tool_result"}
    return [(e, results[e["call_id"]]) for e in evs if e["event"] == "tool_call" and e["tool"] == "bench"]


def test_the_benchmarks_check_run_is_the_first_reproduce_run_and_every_run_is_counted(tmp_path):
    """The run that checks the benchmark prints the metric measures the host as found: it is the reproduce
    step's first sample (no run wasted), and `bench_runs` counts every benchmark run the host saw."""
    out = investigate(RunOptions(host="sim:launch-blocking", symptom="verify 30ms", baseline="verify 20ms",
                                 as_json=True, out=str(tmp_path / "run")))
    calls = bench_calls(out)
    assert calls[0][0]["why"].startswith("check once") and calls[1][0]["why"] == "reproduce, run 2"
    first = [r["output"]["value"] for c, r in calls if c.get("hypothesis") is None]
    # 3 when the first runs decide; more while the noise leaves it unclear (the simulated noise is drawn anew)
    assert 3 <= len(first) <= 12 and out["regression"]["mean"] == pytest.approx(statistics.fmean(first), abs=1e-3)
    assert f"over {len(first)} runs" in out["regression"]["why"]
    assert out["bench_runs"] == len(calls)


def test_a_package_experiment_with_no_build_to_install_spends_no_benchmark_run(seeds_run):
    """No wheel of the installed version's other build on the host: the package experiment stops before the
    reference is re-measured."""
    out = seeds_run
    assert not [c for c, _ in bench_calls(out) if c.get("hypothesis") == "compiled_dependency"]
    assert any(s["hypothesis"] == "compiled_dependency" for s in out["suspects"])
