"""An offline workload (`host.server.offline`): no server at all, the benchmark is the program. The host profile
names it with its folder and environment; it imports its code each time it runs, so its number follows its own
command line, environment and checkout at once, with nothing to restart."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from debugagent.tools.errors import ScenarioError
from debugagent.tools.sim.scenario import parse_scenario

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "offline-workload.yaml"


def number(out: str) -> float:
    m = re.search(r"throughput=([\d.]+) req/s", out)
    assert m, out
    return float(m.group(1))


def test_the_workload_is_the_benchmark(sim_host):
    t = sim_host(f"sim:{SCENARIO}")
    bench = json.loads(t.run("cat /etc/debugagent/host.json").stdout)["bench"]
    assert bench.startswith("cd /root/vllm && CUDA_LAUNCH_BLOCKING=1 /root/venv/bin/python3 benchmarks/benchmark_throughput.py")
    assert "--input-len 1024" in bench
    # no server: no process but the host's own, no GPU tenant, no benchmark client beside the workload
    assert "/root/venv/bin/python3" not in t.run("ps -eo args").stdout
    assert t.run("nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout.strip() == ""
    assert t.run("command -v gpu-bench").exit_code != 0
    bad = number(t.run(bench).stdout)
    assert 24 <= bad <= 28.5, bad                       # 41 - 11 - 4, 2% noise
    no_env = number(t.run(bench.replace("CUDA_LAUNCH_BLOCKING=1 ", "")).stdout)
    assert 35 <= no_env <= 39.5, no_env                 # the environment of this run only
    head = t.run("git -C /root/vllm rev-parse HEAD").stdout.strip()
    t.run("git -C /root/vllm checkout -q HEAD~1")
    try:
        both = number(t.run(bench.replace("CUDA_LAUNCH_BLOCKING=1 ", "")).stdout)
        assert 39 <= both <= 43.5, both                  # the checkout, at once: nothing to restart
    finally:
        t.run(f"git -C /root/vllm checkout -q {shlex.quote(head)}")


@pytest.mark.parametrize("edit, field", [
    ("    cwd: /root/vllm\n", "    cwd: /root/vllm\n    worker: {env: {}}\n"),
    ("    cwd: /root/vllm\n", "    cwd: /root/vllm\n    port: 8000\n"),
])
def test_an_offline_workload_is_no_server(edit, field):
    text = SCENARIO.read_text().replace(edit, field, 1)
    with pytest.raises(ScenarioError) as e:
        parse_scenario(text, "w.yaml")
    assert "an offline workload has no" in str(e.value) and "host.server." in str(e.value) and "fix:" in str(e.value)
