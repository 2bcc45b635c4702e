"""Shadow experiments' pure parts: the port rewritten in a server's command line and a benchmark, the GPUs a
server's parallelism needs, nvidia-smi's memory read. The copies themselves: tests/realhost/test_shadow.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.agent.lab.shadow import bench_template, gpus_needed, port_of, server_bench, with_port
from debugagent.tools.errors import UsageError
from debugagent.tools.mutate import parse_restart
from debugagent.tools.shadow import StartCopy, StopCopy, parse_gpu_memory, parse_ports

SGLANG = ["/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8", "--port", "30000"]


@pytest.mark.parametrize("argv,port,rewritten", [
    (SGLANG, 30000, [*SGLANG[:-1], "31000"]),
    (["vllm", "serve", "m", "--port=8000", "--tensor-parallel-size", "2"], 8000,
     ["vllm", "serve", "m", "--port=31000", "--tensor-parallel-size", "2"]),
    (["text-generation-launcher", "-p", "8080"], 8080, ["text-generation-launcher", "-p", "31000"]),
    (["python", "-m", "http.server", "8000"], None, None),
    (["python", "serve.py", "--port"], None, None),
])
def test_the_port_is_found_and_rewritten_only_where_the_command_line_gives_it(argv, port, rewritten):
    assert port_of(argv) == port
    assert with_port(argv, 31000) == rewritten


def test_the_benchmark_is_pointed_at_a_port_by_its_url_its_flag_or_the_placeholder():
    assert bench_template("curl -s http://127.0.0.1:30000/generate", 30000) == "curl -s http://127.0.0.1:{port}/generate"
    assert bench_template("bench --host 127.0.0.1 --port 30000 --n 8", 30000) == "bench --host 127.0.0.1 --port {port} --n 8"
    assert bench_template("bench --port=30000", 30000) == "bench --port={port}"
    assert bench_template("python bench.py {port} 7", 30000) == "python bench.py {port} 7"
    assert bench_template("python bench.py 30000", 30000) is None            # a bare number: not a port to guess
    assert bench_template("curl http://127.0.0.1:300001/", 30000) is None     # another number that starts alike
    assert server_bench("python bench.py {port}", {"argv": SGLANG}) == "python bench.py 30000"
    assert server_bench("python bench.py {port}", {"argv": ["srv"], "ports": [9000]}) == "python bench.py 9000"
    with pytest.raises(UsageError):
        server_bench("python bench.py {port}", {"argv": ["srv"], "ports": []})


def test_the_gpus_a_server_needs_are_its_parallel_sizes_multiplied():
    assert gpus_needed(SGLANG) == 8
    assert gpus_needed(["vllm", "serve", "m", "--tensor-parallel-size=2", "--pipeline-parallel-size", "2"]) == 4
    assert gpus_needed(["srv", "--tp-size", "2", "--dp", "2"]) == 4
    assert gpus_needed(["srv", "--port", "1"]) == 1


def test_nvidia_smi_memory_and_listening_ports_are_read():
    out = ("== gpus\n0, GPU-5d3e, 143771, 126518\n1, GPU-77aa, 143771, 0\n== apps\nGPU-5d3e, 812, 126500\n"
           "GPU-5d3e, 845, 18\n== end\n")
    m = parse_gpu_memory(out)
    assert m.readable and [g.index for g in m.gpus] == ["0", "1"] and m.gpus[1].used_mib == 0
    assert [(a.pid, a.used_mib) for a in m.apps] == [(812, 126500.0), (845, 18.0)]
    assert not parse_gpu_memory("no nvidia-smi\n").readable
    broken = parse_gpu_memory("== gpus\nNVIDIA-SMI has failed because it couldn't communicate with the driver\n== apps\n")
    assert not broken.readable and "did not list" in broken.why
    assert parse_ports("1F40\n7531\n").ports == [8000, 30001]


def test_every_argument_of_a_copy_is_quoted(tmp_path):
    """A value with shell metacharacters reaches the copy as one argument, never as shell: the commands run for real
    (a copy of /bin/echo, which prints its arguments and exits; then its undo)."""
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); x'y `touch {marker}`"
    files = {k: str(tmp_path / f"copy.{k}") for k in ("env", "pid", "log")}
    start = StartCopy(role="changed", env_pid=os.getpid(), argv=["/bin/echo", "--port", "1", evil], cwd=str(tmp_path),
                      gpus="4,5", env_file=files["env"], pid_file=files["pid"], log=files["log"], set={"X": evil})
    subprocess.run(start.command(), shell=True, capture_output=True, text=True, timeout=30)
    assert Path(files["log"]).read_text() == f"--port 1 {evil}\n"
    assert Path(files["env"]).read_bytes() == Path(f"/proc/{os.getpid()}/environ").read_bytes()   # read on the host
    stop = StopCopy(pid_file=files["pid"], env_file=files["env"], log=files["log"], expect_argv=["/bin/echo", evil],
                    cwd=str(tmp_path))
    r = subprocess.run(stop.command(), shell=True, capture_output=True, text=True, timeout=30)
    assert "removed" in r.stdout and not any(Path(f).exists() for f in files.values())
    assert not marker.exists()


def test_the_undo_stops_a_copy_and_its_workers_by_pid_and_start_time_without_its_pid_file(tmp_path):
    """/tmp cleaned under a crashed run: the journal's pid and start time still name the copy; its whole process
    group (a worker it spawned) is stopped, and a pid whose start time differs is never signalled."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "time.sleep(120)")
    files = {k: str(tmp_path / f"copy.{k}") for k in ("env", "pid", "log")}
    start = StartCopy(role="changed", env_pid=os.getpid(), argv=[sys.executable, "-c", code, "--port", "1"],
                      cwd=str(tmp_path), gpus="0", env_file=files["env"], pid_file=files["pid"], log=files["log"])
    r = subprocess.run(start.command(), shell=True, capture_output=True, text=True, timeout=30)
    got = parse_restart(r.stdout)
    assert got.pid and got.start, r.stdout + r.stderr
    deadline = time.monotonic() + 30
    while not (kids := [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == got.pid]):
        assert time.monotonic() < deadline, "the copy's worker did not start"
        time.sleep(0.1)
    Path(files["pid"]).unlink()
    stop = StopCopy(pid_file=files["pid"], env_file=files["env"], log=files["log"], expect_argv=start.argv,
                    cwd="/nowhere", stop_pid=got.pid, stop_start=got.start + 1)
    r = subprocess.run(stop.command(), shell=True, capture_output=True, text=True, timeout=30)
    assert "no copy running" in r.stdout and Path(f"/proc/{got.pid}").exists()   # another start time: not it
    stop = stop.model_copy(update={"stop_start": got.start})
    r = subprocess.run(stop.command(), shell=True, capture_output=True, text=True, timeout=60)
    assert f"stopped pid={got.pid}" in r.stdout, r.stdout + r.stderr
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in [Path(f"/proc/{got.pid}"), *kids]):
        assert time.monotonic() < deadline, "the copy or its worker is still running"
        time.sleep(0.1)
    assert not any(Path(f).exists() for f in files.values())


def _ppid(p: Path) -> int:
    try:
        return int(p.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(p: Path) -> bool:
    """Running (a zombie waiting for its parent to reap it is stopped)."""
    try:
        return p.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
