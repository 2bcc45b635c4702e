"""Simulated hosts: strict scenario files, honest sandboxes, snapshot/diff equal to the factors."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from debugagent.tools.errors import ScenarioError
from debugagent.tools.registry import Runner
from debugagent.tools.sim import builtin_names, load_scenario, parse_scenario
from debugagent.tools.snapshot import collect, diff

SEED = "eagle3-flashinfer-rebuilt"


def seed_text() -> str:
    from debugagent.tools.sim.scenario import builtin_dir
    return (builtin_dir() / f"{SEED}.yaml").read_text()


def test_builtins_are_many_and_one_has_no_regression():
    """At least 10 built-in scenarios (tests/test_vocabulary.py checks their answers against the playbook); one has none."""
    names = builtin_names()
    assert len(names) >= 10
    assert None in {load_scenario(n).expect.root_cause for n in names}


def test_unknown_key_names_file_and_field():
    """An unknown key is refused with the file and the field path."""
    text = seed_text().replace("  hostname: gpu-node-3", "  hostname: gpu-node-3\n  hostnme: typo")
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text, "bad.yaml")
    assert "bad.yaml" in str(e.value) and "host.hostnme" in str(e.value) and "unknown key" in str(e.value)


def test_factor_path_that_matches_nothing():
    """A factor path outside the vocabulary, or naming a missing package, is refused."""
    text = seed_text().replace("packages.flashinfer-python.build", "packages.flashinfer.build")
    with pytest.raises(ScenarioError, match=r"factors\[0\].path: no package `flashinfer`"):
        parse_scenario(text, "x.yaml")
    text = seed_text().replace("packages.flashinfer-python.build", "gpu.0.clock")
    with pytest.raises(ScenarioError, match="matches nothing"):
        parse_scenario(text, "x.yaml")


def test_factor_bad_value_must_match_host():
    """`host` is the bad state: a factor whose bad value disagrees is refused."""
    text = seed_text().replace("bad: 9f3c", "bad: 7777")
    with pytest.raises(ScenarioError, match=r"factors\[0\].bad"):
        parse_scenario(text, "x.yaml")


def test_malformed_yaml_names_the_line():
    """Broken YAML names the line."""
    with pytest.raises(ScenarioError, match="line"):
        parse_scenario("version: 1\nname: [unclosed\n", "x.yaml")


def test_sandbox_answers_at_scenario_paths(sim_host):
    """The seed's checks answer as on the real host: version, missing __version__, server argv, env."""
    t = sim_host(f"sim:{SEED}")
    r = t.run("/root/ml-env/bin/python3 -c 'import sgl_kernel; print(\"sgl_kernel:\", sgl_kernel.__version__)'")
    assert r.stdout == "sgl_kernel: 0.3.21\n"
    r = t.run("ls /root/sglang; cd /root/sglang && git log --oneline -3; "
              "/root/ml-env/bin/python3 -c 'import sglang; print(sglang.__version__)'")
    assert "sgl-kernel" in r.stdout and "Improve CI for diffusion models" in r.stdout
    assert "AttributeError: module 'sglang' has no attribute '__version__'" in r.stderr
    r = t.run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")
    assert any(ln.startswith("/root/ml-env/bin/python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.5")
               for ln in r.stdout.splitlines())
    assert "/tmp" not in r.stdout


def test_nothing_readable_reveals_the_answer(sim_host):
    """No file under the sandbox's roots names the expected cause, factors or effects."""
    t = sim_host(f"sim:{SEED}")
    r = t.run("grep -rIl -e root_cause -e 'factors:' -e 'effect:' -e compiled_dependency /root /etc 2>/dev/null | "
              "grep -v -e '/\\.git/' || true")
    assert r.stdout.strip() == ""


def test_gpus_idle_unless_benchmark_runs(sim_host):
    """Idle GPUs show 345 MHz, the idle reason and PCIe gen 1; under the benchmark, the scenario's values."""
    t = sim_host("sim:power-capped")
    runner = Runner(t)
    idle = runner.call("gpu_query").output.gpus[0]
    assert (idle.sm_clock, idle.pcie_gen, idle.event_reasons) == (345, 1, ["gpu_idle"])
    load = runner.call("gpu_sample_under_load", {"load": "gpu-bench", "seconds": 1.2}).output.per_gpu()[0]
    assert (load.sm_clock, load.pcie_gen, load.event_reasons, load.power_limit) == (1545, 5, ["sw_power_cap"], 450.0)


def test_benchmark_follows_state_and_is_noisy(sim_host):
    """The benchmark prints METRIC=VALUE UNIT near base + effects, and changes when the state does."""
    t = sim_host("sim:launch-blocking")
    runner = Runner(t)
    vals = [runner.call("bench", {"cmd": "gpu-bench", "metric": "verify"}).output.value for _ in range(4)]
    assert all(25 < v < 35 for v in vals) and len(set(vals)) == 4
    pid = runner.call("find_servers").output.processes[0].pid
    d = runner.call("server_details", {"pid": pid}).output
    r = runner.call("restart_server", {"pid": pid, "argv": d.argv, "cwd": d.cwd, "env_file": f"/tmp/da-{pid}.env",
                                       "unset": ["CUDA_LAUNCH_BLOCKING"], "save_env": True})
    assert r.ok, r.error
    vals = [runner.call("bench", {"cmd": "gpu-bench", "metric": "verify"}).output.value for _ in range(3)]
    assert all(16 < v < 24 for v in vals)
    t.run(f"rm -f /tmp/da-{pid}.env")


def test_the_hosts_speed_in_streaks_whatever_the_server_does(sim_host, tmp_path):
    """``bench.streaks``: every run's value is the speed of its streak times the state's; the streaks last runs in
    runs (seeded, the same for the good state's host), as the H200 lab's virtual CPU did."""
    from debugagent.tools.sim.scenario import builtin_dir
    text = (builtin_dir() / "launch-blocking.yaml").read_text().replace(
        "bench: {metric: verify, unit: ms, base: 20.0, noise_pct: 4}",
        "bench: {metric: verify, unit: ms, base: 20.0, noise_pct: 0, streaks: {speeds: [1.0, 0.5], runs: 3}}")
    assert "streaks" in text
    path = tmp_path / "streaky.yaml"
    path.write_text(text)
    sc = parse_scenario(text, str(path))
    bad = sc.bench.base + sum(f.effect for f in sc.factors)

    def runs(spec: str, n: int) -> list[float]:
        r = Runner(sim_host(spec))
        return [r.call("bench", {"cmd": "gpu-bench", "metric": "verify"}).output.value for _ in range(n)]

    vals = runs(f"sim:{path}", 24)
    speeds = [round(bad / v, 6) for v in vals]   # a time: a slow streak takes longer
    assert set(speeds) == {1.0, 0.5}, speeds
    changes = sum(a != b for a, b in itertools.pairwise(speeds))
    assert 3 <= changes <= 20 and speeds == [sc.bench.streaks.speed(sc.name, n) for n in range(1, 25)], speeds
    assert max(len(list(g)) for _, g in itertools.groupby(speeds)) <= 5
    # the good state's host meets the same speeds, run for run
    assert [round(sc.bench.base / v, 6) for v in runs(f"sim:{path}@good", 24)] == speeds
    for bad_spec, why in (("speeds: [1.0]", "at least 2"), ("speeds: [1.0, 0]", "greater than 0"),
                          ("speeds: [1.0, 0.5], runs: 0", "greater than or equal to 1")):
        with pytest.raises(ScenarioError, match="bench.streaks") as e:
            parse_scenario(text.replace("speeds: [1.0, 0.5], runs: 3", bad_spec), "s.yaml")
        assert why in str(e.value), str(e.value)


def test_old_driver_speaks_throttle_reasons(sim_host):
    """A scenario on a 525 driver prints the older "Clocks Throttle Reasons" names."""
    t = sim_host("sim:thermal-throttle-old-driver")
    assert "Clocks Throttle Reasons" in t.run("nvidia-smi -q").stdout
    assert "clocks_throttle_reasons.active" in t.run(
        "nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv").stdout


def test_command_timeout_on_sim(sim_host):
    """A command that hangs on a simulated host is cut at its timeout."""
    r = sim_host(f"sim:{SEED}").run("sleep 20", timeout=0.5)
    assert r.timed_out and r.exit_code == 124


@pytest.mark.parametrize("name", builtin_names())
def test_snapshot_diff_equals_factors(sim_host, name):
    """snapshot of sim:X@good and sim:X, then diff: exactly the scenario's factors."""
    sc = load_scenario(name)
    good = collect(Runner(sim_host(f"sim:{name}@good")))
    bad = collect(Runner(sim_host(f"sim:{name}")))
    assert good.errors == [] and bad.errors == []
    # a snapshot fingerprints the host; a changed client workload (bench.args) is not on it
    assert sorted(c.path for c in diff(good, bad)) == sorted(f.path for f in sc.factors if not f.path.startswith("bench."))


def test_sandbox_is_removed_and_server_stopped():
    """Closing a simulated host stops its server and removes its folder."""
    from debugagent.tools.sim import SimTransport
    t = SimTransport(f"sim:{SEED}")
    base = t.sim.base
    pids = t.sim._own_pids()
    assert pids
    t.close()
    assert not base.exists()
    out = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True, text=True).stdout
    assert out.strip() == ""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_snapshot_unknown_sim_exits_2():
    """`snapshot --host sim:nope` exits 2 naming the problem and the fix."""
    r = run_cli("snapshot", "--host", "sim:nope", "-o", "/dev/null")
    assert r.returncode == 2
    assert "no built-in scenario" in r.stderr and "debugagent sim list" in r.stderr


def test_cli_bad_flag_exits_2():
    """A misspelt flag exits 2 and suggests the right one."""
    r = run_cli("snapshot", "--hots", "x")
    assert r.returncode == 2 and "--host" in r.stderr


def test_cli_malformed_scenario_exits_2(tmp_path):
    """A malformed scenario file exits 2 naming file and field."""
    p = tmp_path / "s.yaml"
    p.write_text(seed_text().replace("version: 1", "version: 2"))
    r = run_cli("snapshot", "--host", f"sim:{p}", "-o", "/dev/null")
    assert r.returncode == 2 and "s.yaml" in r.stderr and "version" in r.stderr


def test_cli_snapshot_and_diff(tmp_path):
    """The CLI writes two snapshots and diffs them, calling out the changed build."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_cli("snapshot", "--host", f"sim:{SEED}@good", "-o", str(a)).returncode == 0
    assert run_cli("snapshot", "--host", f"sim:{SEED}", "-o", str(b)).returncode == 0
    r = run_cli("diff", str(a), str(b))
    assert r.returncode == 1   # as diff(1): they differ
    assert "compiled_dependency" in r.stdout and "same version 0.5.3, different build" in r.stdout
    assert "hf_live_secret_value" not in a.read_text() + b.read_text()


# the keys of the line `python -m sglang.bench_serving --output-file F` appends, in its order: `benchmark()`'s
# `result` dict in sgl-project/sglang python/sglang/bench_serving.py (commit 0033168)
BENCH_SERVING_KEYS = [
    "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len", "random_input_len",
    "random_output_len", "random_range_ratio", "duration", "completed", "total_input_tokens", "total_output_tokens",
    "total_output_tokens_retokenized", "request_throughput", "input_throughput", "output_throughput",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p99_e2e_latency_ms", "mean_ttft_ms",
    "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length"]


def test_bench_serving_writes_sglangs_result_line_from_the_running_server(sim_host):
    """`python -m sglang.bench_serving … --output-file F` on a simulated SGLang host prints the result table and
    appends SGLang's JSONL line (its keys, in its order), read back as the `sglang` format; its numbers are the
    running server's: the good host's (flashinfer as built before) beat the bad one's by the scenario's effect."""
    import json

    from debugagent.tools.benchfmt import parse_result, parse_table
    cmd = ("cd /root/sglang && /root/ml-env/bin/python3 -m sglang.bench_serving --backend sglang --dataset-name random "
           "--random-input-len 1024 --random-output-len 128 --num-prompts 64 --max-concurrency 16 "
           "--output-file /tmp/b.jsonl")
    got = {}
    for which in ("bad", "good"):
        t = sim_host(f"sim:{SEED}" + ("@good" if which == "good" else ""))
        r = t.run(f"{cmd} && {cmd} && wc -l < /tmp/b.jsonl && tail -n 1 /tmp/b.jsonl")
        assert r.exit_code == 0, r.stderr
        *_, count, line = r.stdout.strip().splitlines()
        assert count == "2"   # appended, one line a run
        obj = json.loads(line)
        assert list(obj) == BENCH_SERVING_KEYS
        assert obj["completed"] == 64 and obj["total_output_tokens"] == 64 * 128 and obj["max_concurrency"] == 16
        res = parse_result(line)
        assert res.format == "sglang"
        assert parse_table(r.stdout).format == "serving-table"
        assert t.run("git -C /root/sglang status --porcelain").stdout == ""   # the client is part of the checkout
        got[which] = obj
    # verify 20 -> 30 ms: each decode step and token gap 1.5x longer, the throughput 1.5x lower (4% noise a run)
    assert 17 < got["good"]["median_itl_ms"] < 23 and 26 < got["bad"]["median_itl_ms"] < 34
    ratio = got["good"]["output_throughput"] / got["bad"]["output_throughput"]
    assert 1.3 < ratio < 1.7, ratio
    for k in ("median_ttft_ms", "mean_tpot_ms", "median_e2e_latency_ms"):
        assert got["bad"][k] > got["good"][k], k
