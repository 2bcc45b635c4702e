"""An offline workload's command line (tools/workload.py): read into what stands for the server, and written back
with an experiment's change; a benchmark that is no python program is no workload."""

from __future__ import annotations

import shlex

import pytest
from debugagent.tools.workload import command, is_workload, parse

BENCH = "cd /root/vllm && CUDA_LAUNCH_BLOCKING=1 HF_TOKEN=hf_secret /root/venv/bin/python3 benchmarks/b.py --batch-size 64"


def test_the_program_stands_for_the_server():
    w = parse(BENCH)
    assert w is not None and is_workload(w) and is_workload(w.model_dump()) and w.pid == 0
    assert (w.python, w.entry, w.cwd) == ("/root/venv/bin/python3", "benchmarks/b.py", "/root/vllm")
    assert w.flags == {"batch-size": "64"} and w.env["CUDA_LAUNCH_BLOCKING"] == "1"
    assert w.env["HF_TOKEN"] != "hf_secret"   # redacted, as a server's environment is
    m = parse("env -u X /opt/py/bin/python -m sglang.bench_offline_throughput --num-prompts 10")
    assert m is not None and m.entry == "sglang.bench_offline_throughput" and m.kind == "sglang" and m.cwd == ""


@pytest.mark.parametrize("bench", [
    "python3 -m sglang.bench_serving --port 30000 | tee out",       # a pipeline
    "/opt/venv/bin/python3 -m sglang.bench_serving --backend sglang --port 30000",   # a client of a server
    "/opt/venv/bin/python3 bench.py --base-url http://127.0.0.1:8000",
    "/usr/local/bin/gpu-bench --metric verify",                     # a binary, a client of a server
    "curl http://127.0.0.1:8000/v1/completions",
    "python3 -c 'print(1)'",                                        # no code of its own
    "", None,
])
def test_a_benchmark_that_is_no_python_program_is_no_workload(bench):
    assert parse(bench) is None


def test_the_change_is_written_on_its_command_line():
    w = parse(BENCH)
    assert w is not None
    cmd = command(BENCH, w.argv, w.cwd, unset=["CUDA_LAUNCH_BLOCKING"])
    assert cmd.startswith("cd /root/vllm && HF_TOKEN=hf_secret env -u CUDA_LAUNCH_BLOCKING /root/venv/bin/python3")
    assert "CUDA_LAUNCH_BLOCKING=1" not in cmd and cmd.endswith("benchmarks/b.py --batch-size 64")
    wt = command(BENCH, w.argv, "/tmp/wt dir", path_first=["/tmp/wt dir"], set_env={"A": "x y"})
    assert wt.startswith("cd '/tmp/wt dir' && CUDA_LAUNCH_BLOCKING=1 HF_TOKEN=hf_secret A='x y' "
                         "PYTHONPATH='/tmp/wt dir'\"${PYTHONPATH:+:$PYTHONPATH}\" /root/venv/bin/python3")
    assert shlex.split(wt)   # one shell command line
