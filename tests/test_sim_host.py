"""Simulated hosts behave like real ones: code and packages change only with a restart, and a
sealed host reveals nothing of its scenario (locally and through `sim serve`'s sshd)."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

import pytest
from debugagent.tools.errors import ScenarioError
from debugagent.tools.registry import Runner
from debugagent.tools.sim import builtin_names, load_scenario, parse_scenario
from debugagent.tools.sim.scenario import builtin_dir
from debugagent.tools.sim.seal import available, why_not
from debugagent.tools.sim.standin import so_bytes

pytestmark = pytest.mark.skipif(not available(), reason=f"a sealed host needs bwrap: {why_not()}")


def bench(runner: Runner, n: int = 3, cwd: str | None = None) -> float:
    """The mean of ``n`` benchmark runs (the host's own benchmark and metric)."""
    args: dict = {"cmd": "gpu-bench", "metric": runner.transport.scenario.bench.metric}
    if cwd:
        args["cwd"] = cwd
    vals = [runner.call("bench", args).output.value for _ in range(n)]
    return statistics.fmean(vals)


def restart(runner: Runner, *, cwd: str | None = None, set_env: dict[str, str] | None = None) -> int:
    """Restart the running server as an experiment does (same argv and environment, changes applied)."""
    pid = runner.call("find_servers").output.processes[0].pid
    d = runner.call("server_details", {"pid": pid}).output
    r = runner.call("restart_server", {"pid": pid, "argv": d.argv, "cwd": cwd or d.cwd, "env_file": f"/tmp/env-{pid}",
                                       "set": set_env or {}, "save_env": True})
    assert r.ok, r.error
    return r.output.pid


def wait_up(t, pid: int) -> None:
    """The restarted server has imported its code and registered (as a readiness check would see)."""
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.pid == pid and p.role == "server" for p in t.sim.controller.procs):
            return
        time.sleep(0.05)
    raise AssertionError(f"server {pid} did not come up: {t.run('tail -5 /tmp/debugagent-server.log').stdout}")


def test_code_revert_needs_a_restart_from_the_worktree(sim_host):
    """With the benchmark merely run in a worktree the regression stays; restarting the server from the
    worktree (first on PYTHONPATH, cwd inside) recovers it, and bisecting that way finds the culprit."""
    t = sim_host("sim:code-regression-bisect")
    r = Runner(t)
    sc = t.scenario
    labels = t.sim.labels
    good, culprit = labels["a2"], labels["a5"]
    wt = "/tmp/wt-revert"
    assert r.call("git_worktree_add", {"repo": "/root/sglang", "path": wt, "commit": good}).ok
    bad_mean = bench(r)
    in_worktree = bench(r, cwd=wt)
    assert abs(in_worktree - bad_mean) < 3, "the benchmark is a client of the server: the worktree alone changes nothing"
    assert in_worktree < sc.bench.base - 4

    def run_at(commit: str) -> float:
        assert r.call("git_worktree_checkout", {"path": wt, "commit": commit}).ok
        wait_up(t, restart(r, cwd=f"{wt}/python", set_env={"PYTHONPATH": f"{wt}/python"}))
        return bench(r)

    assert run_at(good) > sc.bench.base - 3
    commits = [labels[c.sha] for c in sc.host.repo.commits]
    lo, hi = commits.index(good), len(commits) - 1  # lo good, hi bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run_at(commits[mid]) < sc.bench.base - 3.5:
            hi = mid
        else:
            lo = mid
    assert commits[hi] == culprit


def test_package_reinstall_takes_effect_on_restart(sim_host):
    """pip installs the baseline wheel from the wheelhouse; the running server keeps what it imported
    until it is restarted."""
    t = sim_host("sim:flashinfer-wheelhouse")
    r = Runner(t)
    before = bench(r)
    assert before > 27
    pip = t.run("/root/ml-env/bin/pip install -q --no-index --find-links /root/wheelhouse --force-reinstall --no-deps "
                "flashinfer-python==0.5.3 2>&1; echo rc=$?", timeout=180)
    assert "rc=0" in pip.stdout, pip.stdout
    assert bench(r) > 27, "a reinstall without a restart changes nothing in the running server"
    wait_up(t, restart(r))
    assert bench(r) < 23


def test_an_interaction_holds_only_while_both_are_bad(sim_host):
    """A factor `with` another (eager mode and CUDA_LAUNCH_BLOCKING in
    tests/scenarios/eager-launch-blocking-interact.yaml) costs only while both are at their bad value: reverting
    one recovers its own effect and the interaction's."""
    t = sim_host(f"sim:{Path(__file__).parent / 'scenarios' / 'eager-launch-blocking-interact.yaml'}")
    r = Runner(t)
    assert bench(r) == pytest.approx(32, rel=0.05)                   # 20 + 5 + 2 + 5
    wait_up(t, restart(r, set_env={"CUDA_LAUNCH_BLOCKING": "0"}))
    assert bench(r) == pytest.approx(25, rel=0.05), "eager mode alone: its own 5 ms, not the interaction's"


def test_with_names_another_factor():
    """`with` must name another factor's path; anything else is refused naming the field and the choices."""
    text = (Path(__file__).parent / "scenarios" / "eager-launch-blocking-interact.yaml").read_text()
    with pytest.raises(ScenarioError, match=r"(?s)factors\[2\]\.with\[0\].*no other factor.*server\.args\.enforce-eager"):
        parse_scenario(text.replace("with: [server.args.enforce-eager]", "with: [server.args.dtype]"), "x.yaml")


def test_console_script_server_and_worker_environment(sim_host):
    """`vllm serve` runs as a console-script launcher; its worker has its own environment, and the
    benchmark follows the worker's."""
    t = sim_host("sim:vllm-console-worker")
    r = Runner(t)
    procs = r.call("find_servers").output.processes
    assert len(procs) == 1 and procs[0].argv[:3] == ["/opt/venv/bin/python3", "/opt/venv/bin/vllm", "serve"]
    import time
    deadline = time.monotonic() + 60   # the server spawns its worker after it starts: wait for it, on a loaded machine too
    while "multiprocessing.spawn" not in (ps := t.run("ps -eo args").stdout) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "multiprocessing.spawn" in ps
    worker_env = t.run("for p in /proc/[0-9]*; do grep -qa multiprocessing $p/cmdline && tr '\\0' '\\n' < $p/environ; done").stdout
    assert "CUDA_VISIBLE_DEVICES=0" in worker_env and "CUDA_LAUNCH_BLOCKING=1" in worker_env
    assert "Using FlashInfer backend" in t.run("cat /tmp/server.log").stdout
    slow = statistics.fmean(r.call("bench", {"cmd": "gpu-bench", "metric": "itl"}).output.value for _ in range(3))
    pid = r.call("find_servers").output.processes[0].pid
    d = r.call("server_details", {"pid": pid}).output
    ctl = t.sim.controller
    before = max((w.seq for w in ctl.live("worker")), default=0)
    assert r.call("restart_server", {"pid": pid, "argv": d.argv, "cwd": d.cwd, "env_file": f"/tmp/e-{pid}",
                                     "unset": ["CUDA_LAUNCH_BLOCKING"], "save_env": True}).ok
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(w.seq > before for w in ctl.live("worker")):
        time.sleep(0.05)   # the new server's worker (the old one may still be registered for a moment)
    assert any(w.seq > before for w in ctl.live("worker")), "the restarted server's worker never registered"
    fast = statistics.fmean(r.call("bench", {"cmd": "gpu-bench", "metric": "itl"}).output.value for _ in range(3))
    assert slow > 15 and fast < 13


def test_no_host_profile_and_a_large_environment(sim_host):
    """A scenario may omit the host profile; the environment holds 200+ distributions, many sharing one
    install time."""
    t = sim_host("sim:no-host-profile")
    assert t.run("cat /etc/debugagent/host.json").exit_code != 0
    out = t.run("cd /root/ml-env/lib/python3.11/site-packages && ls -d *.dist-info | wc -l; "
                "stat -c %Y *.dist-info | sort | uniq -c | sort -rn | head -1").stdout.split()
    assert int(out[0]) >= 200 and int(out[1]) >= 150


def test_locked_clocks(sim_host):
    """`nvidia-smi -lgc` caps the SM clock under load; `-rgc` resets it; the benchmark follows."""
    t = sim_host(f"sim:{Path(__file__).parent / 'scenarios' / 'clocks-locked.yaml'}")
    r = Runner(t)
    load = r.call("gpu_sample_under_load", {"load": "gpu-bench", "seconds": 0.6}).output
    assert load.loaded and load.per_gpu()[0].sm_clock == 1305
    slow = bench(r)
    assert t.run("nvidia-smi -rgc").exit_code == 0
    assert r.call("gpu_sample_under_load", {"load": "gpu-bench", "seconds": 0.6}).output.per_gpu()[0].sm_clock == 1980
    assert bench(r) > slow + 12


def test_under_load_reading_is_decided_by_the_service(sim_host):
    """While a benchmark is in its work, nvidia-smi reads the loaded values, whatever the machine's load:
    the GPU service runs the workload, so it knows."""
    t = sim_host("sim:power-capped")
    for _ in range(3):
        load = Runner(t).call("gpu_sample_under_load", {"load": "gpu-bench", "seconds": 0.4}).output
        assert load.loaded, "the sampler samples again until it has caught the load"
        assert load.per_gpu()[0].power_limit == 450.0 and load.per_gpu()[0].sm_clock == 1545


# ---------------------------------------------------------------- the seal
LEAK_COMMANDS = [
    'cat "$(command -v nvidia-smi)"', 'cat "$(command -v gpu-bench)"', "ps -eo pid,args", "env",
    "find / -path /proc -prune -o -path /usr -prune -o -path /sys -prune -o -path /dev -prune -o -print", "ls -la /proc/*/root/ 2>/dev/null",
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; tr '\\0' '\\n' < $p/environ; done 2>/dev/null",
    "for p in /proc/[0-9]*; do ls $p/root/ 2>/dev/null; cat $p/root/etc/hostname 2>/dev/null; done",
    "grep -rIl -e root_cause -e compiled_dependency -e 'factors:' -e 'effect:' / --exclude-dir=proc --exclude-dir=sys "
    "--exclude-dir=usr --exclude-dir=dev 2>/dev/null | head -50",
    "cat /proc/mounts /proc/self/mountinfo",
]


def leaks(run, sc_name: str, source: str, salt_free: bytes | None) -> list[str]:
    """What a shell on the host can read that names the scenario's answer."""
    sc = load_scenario(sc_name)
    needles = {"root_cause", "compiled_dependency", "factors:", "effect:", source, str(builtin_dir()), "/work/",
               sc.name + ".yaml", f"expect: {sc.expect.root_cause}"}
    found = []
    for cmd in LEAK_COMMANDS:
        text = run(cmd)
        for n in needles:
            if n and n in text:
                found.append(f"`{cmd}` shows {n!r}")
    if salt_free is not None:
        dump = run("od -An -tx1 -v /root/ml-env/lib/python3.11/site-packages/*/_C.abi3.so 2>/dev/null | tr -d ' \\n'")
        if salt_free.hex() in dump:
            found.append("a compiled file's bytes are the unsalted label's")
    return found


@pytest.mark.parametrize("name", builtin_names())
def test_sealed_host_reveals_nothing(sim_host, name):
    """From a shell on a sealed host: the stand-ins, ps, env, find /, every /proc/*/cmdline and environ,
    /proc/PID/root and the mounts name no factor, effect, expect or scenario path."""
    t = sim_host(f"sim:{name}")
    assert t.sim.sealed
    sc = t.scenario
    first = next(iter(sc.host.packages.items()))
    unsalted = so_bytes(first[0], first[1].version, first[1].build)[64:96]
    assert leaks(lambda c: (lambda r: r.stdout + r.stderr)(t.run(c, timeout=120)), name, sc.source, unsalted) == []
    assert t.run("ps -e | wc -l").stdout.strip() and "python" not in t.run("readlink /proc/1/exe").stdout


@pytest.mark.parametrize("name", builtin_names())
def test_sealed_host_reveals_nothing_over_sshd(tmp_path, name):
    """The same leak hunt through `sim serve`'s OpenSSH server and a real SSH connection."""
    from debugagent.tools.sim import serve
    from debugagent.tools.ssh import SSHTransport
    if not Path(serve.SSHD).is_file():
        pytest.skip("needs Debian's openssh-server")
    with serve.start(f"sim:{name}") as served:
        t = SSHTransport.from_spec(served.target, identity_file=str(served.identity), known_hosts=str(tmp_path / "kh"),
                                   accept_new=True)
        try:
            assert t.run("hostname").stdout.strip() == served.sim.state["hostname"]
            assert leaks(lambda c: (lambda r: r.stdout + r.stderr)(t.run(c, timeout=120)), name,
                         served.sim.scenario.source, None) == []
            assert served.sim.state["server"]["cmd"].split()[-1] in t.run("ps -eo args").stdout
        finally:
            t.close()


def test_nothing_left_on_disk_when_a_host_fails_to_start(tmp_path):
    """A scenario whose server cannot start raises a clear error and leaves no folder behind (validation refuses
    such a file first, tests/test_sim_compat.py; a Scenario changed in code after it reaches the host)."""
    from debugagent.tools.sim.sandbox import SimHost
    sc = parse_scenario((builtin_dir() / "launch-blocking.yaml").read_text(), "x.yaml")
    sc.host.server.cmd = "/root/ml-env/bin/python3 -c pass"
    with pytest.raises(ScenarioError, match="host.server.cmd"):
        SimHost(sc, root=str(tmp_path / "host"))
    assert not (tmp_path / "host").exists()


def test_host_ends_with_every_process():
    """Closing a sealed host ends its namespace (server and all) and removes its folder."""
    from debugagent.tools.sim import SimTransport
    t = SimTransport("sim:launch-blocking")
    base, pid = t.sim.base, t.sim.init_pid
    assert Path(f"/proc/{pid}").exists()
    t.close()
    assert not base.exists() and not Path(f"/proc/{pid}").exists()


# ---------------------------------------------------------------- the format
def test_bare_number_version_says_quote_it():
    """A version written as a bare YAML number is refused with the field and "quote it"."""
    text = (builtin_dir() / "launch-blocking.yaml").read_text().replace("torch: {version: 2.9.1+cu130}", "torch: {version: 2.10}")
    with pytest.raises(ScenarioError, match=r"host\.packages\.torch\.version.*quote it"):
        parse_scenario(text, "x.yaml")


def test_script_server_runs(sim_host, tmp_path):
    """A `cmd` that runs a script (not `python -m`) starts and serves."""
    p = tmp_path / "script.yaml"
    p.write_text((builtin_dir() / "container-torch-layer.yaml").read_text().replace(
        "cmd: /root/ml-env/bin/python3 -m sglang.launch_server", "cmd: /root/ml-env/bin/python3 /root/serve.py"))
    t = sim_host(f"sim:{p}")
    procs = Runner(t).call("find_servers", {"pattern": r"serve\.py"}).output.processes
    assert procs and procs[0].argv[:2] == ["/root/ml-env/bin/python3", "/root/serve.py"]
    assert re.search(r"decode=\d", t.run("gpu-bench").stdout)


def test_schema_lists_the_format():
    """`debugagent sim schema` prints a JSON Schema that names the new fields and forbids unknown keys."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "sim", "schema"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    schema = json.loads(out.stdout)
    host = schema["$defs"]["Host"]["properties"]
    assert {"profile", "environment", "wheelhouse", "gpu_processes"} <= set(host)
    assert "worker" in schema["$defs"]["Server"]["properties"] and "args" in schema["$defs"]["BenchSpec"]["properties"]
    server = schema["$defs"]["Server"]["properties"]
    assert {"engine", "port", "defaults"} <= set(server) and "attention_backend" in server["defaults"]["description"]
    assert schema["$defs"]["Host"]["additionalProperties"] is False


def test_unsealed_host_still_runs(tmp_path):
    """Where a host cannot be sealed it still runs (commands rewritten onto its folder) and says so."""
    from debugagent.tools.sim.sandbox import SimHost
    h = SimHost(load_scenario("launch-blocking"), root=str(tmp_path / "h"), sealed=False)
    try:
        assert not h.sealed
        assert re.search(r"verify=\d", h.exec("gpu-bench").stdout)
        assert h.exec("nvidia-smi --query-gpu=index,clocks.sm --format=csv,noheader").stdout == "0, 345 MHz\n"
        assert "sglang.launch_server" in h.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; done").stdout
    finally:
        h.close()
    assert not (tmp_path / "h").exists()



@pytest.mark.parametrize("sealed", [False, True], ids=["unsealed", "sealed"])
def test_host_pip_never_reaches_an_index(tmp_path, sealed):
    """A simulated host's pip resolves only from what the scenario lays out, sealed or not: a `pip download`
    of a real PyPI project finds nothing (the unsealed host once fetched the real wheel from the index this
    machine's pip is configured with, and the two modes gave different answers)."""
    from debugagent.tools.sim.sandbox import SimHost
    if sealed and not available():
        pytest.skip(f"cannot seal a host here: {why_not()}")
    h = SimHost(load_scenario("eagle3-flashinfer-rebuilt"), root=str(tmp_path / "h"), sealed=sealed)
    try:
        r = h.exec("/root/ml-env/bin/python3 -m pip download --no-deps --only-binary=:all: --timeout 5 "
                   f"-d /tmp/dl-{os.getpid()} six==1.16.0 2>&1; ls /tmp/dl-{os.getpid()}; rm -rf /tmp/dl-{os.getpid()}")
        assert "Saved" not in r.stdout and ".whl" not in r.stdout, r.stdout
        assert "No matching distribution" in r.stdout or "Could not find a version" in r.stdout, r.stdout
    finally:
        h.close()


# ---------------------------------------------------------------- the real machine stays outside
def test_sealed_host_sees_no_listener_of_this_machine(sim_host):
    """A TCP listener of this machine on 127.0.0.1 is not in the sealed host's process table, and the host's
    server and benchmark still work (they talk over the host's own loopback and its bound socket)."""
    import socket
    outside = socket.socket()
    outside.bind(("127.0.0.1", 0))
    outside.listen()
    port = outside.getsockname()[1]
    try:
        t = sim_host("sim:launch-blocking")
        table = Runner(t).call("process_table").output
        assert port not in {ln.port for ln in table.listeners}
        assert f":{port:04X} " not in t.run("cat /proc/net/tcp /proc/net/tcp6").stdout
        assert re.search(r"verify=\d", t.run("gpu-bench").stdout)
        up = t.run("python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); "
                   "c = socket.create_connection(s.getsockname()); print(\"loopback ok\")'")
        assert "loopback ok" in up.stdout, up.stderr
    finally:
        outside.close()


def test_sealed_host_load_average_is_its_own(sim_host):
    """/proc/loadavg on a simulated host is the one the simulator defines (on every host, whatever this
    machine's load), and host_info reads it."""
    from debugagent.tools.sim.sandbox import LOADAVG
    a, b = sim_host("sim:launch-blocking"), sim_host("sim:governor-powersave")
    la, lb = (t.run("cat /proc/loadavg").stdout for t in (a, b))
    assert la == lb == LOADAVG and re.fullmatch(r"[0-9.]+ [0-9.]+ [0-9.]+ \d+/\d+ \d+\n", la)
    assert Runner(a).call("host_info").output.load1 == float(la.split()[0])


def test_package_list_takes_nothing_from_this_python(sim_host):
    """Every distribution a simulated host lists is the scenario's, the image's extras or the host's pip, at
    versions the simulator defines, never one read from the environment debugagent itself runs in."""
    from debugagent.tools.sim.environment import PIP_VERSION, extra_distributions
    t = sim_host("sim:launch-blocking")
    sc = t.scenario
    listed = {p.name: p.version for p in Runner(t).call("python_packages", {"python": sc.host.python}).output.packages}
    want = {d: s.version for d, s in sc.host.packages.items()}
    skip = {re.sub(r"[-_.]+", "_", d).lower() for d in want}
    want |= {d: v for d, v, _c in extra_distributions(sc.host.environment.extra, skip)}
    want["pip"] = PIP_VERSION
    assert listed == want
    assert t.run(f"{sc.host.python} -m pip --version").stdout.startswith(f"pip {PIP_VERSION} ")


def test_build_bytes_name_no_version_or_build(sim_host):
    """A compiled file looks like a shared object and carries no distribution name, version, build label or
    unsalted digest; two builds of one version differ, as real rebuilt files do."""
    t = sim_host("sim:eagle3-flashinfer-rebuilt")
    site = "/root/ml-env/lib/python3.11/site-packages"
    head = t.run(f"od -An -tx1 -N20 -v {site}/flashinfer/_C.abi3.so | tr -d ' \\n'").stdout
    assert head.startswith("7f454c4602010100") and head[32:40] == "03003e00"  # ELF64 LE, ET_DYN, x86-64
    for dist, spec in t.scenario.host.packages.items():
        if spec.editable:
            continue
        module = spec.module or dist.replace("-", "_")
        data = t.run(f"od -An -tx1 -v {site}/{module}/_C.abi3.so | tr -d ' \\n'").stdout
        strings = t.run(f"strings -n 3 {site}/{module}/_C.abi3.so 2>/dev/null || tr -c '[:print:]' '\\n' < "
                        f"{site}/{module}/_C.abi3.so").stdout
        for word in {dist, module, spec.version, spec.build or "", f"v{spec.version}"} - {""}:
            assert word not in strings, (dist, word)
        assert so_bytes(dist, spec.version, spec.build)[64:96].hex() not in data
    from debugagent.tools.sim.sandbox import host_salt
    salt = host_salt("x")
    assert so_bytes("a", "1.0", "b1", salt) != so_bytes("a", "1.0", "b2", salt)
    assert len({len(so_bytes("a", "1.0", b, salt)) for b in ("b1", "b2", "b3", "b4")}) > 1


def test_kernel_cores_cpu_and_memory_are_the_hosts_not_this_machines(sim_host):
    """`uname`, `nproc`, /proc/cpuinfo and /proc/meminfo on a simulated host show the scenario's host (its kernel,
    cores, CPU model and memory), never the machine the simulator runs on, and host_info reads them."""
    t = sim_host("sim:launch-blocking")
    h = t.scenario.host
    assert t.run("uname -r").stdout == f"{h.kernel}\n" != f"{os.uname().release}\n"
    assert t.run("uname -n").stdout == f"{h.hostname}\n"
    assert t.run("uname -s; uname -m").stdout == "Linux\nx86_64\n"
    a = t.run("uname -a").stdout
    assert a.startswith(f"Linux {h.hostname} {h.kernel} ") and os.uname().release not in a
    assert t.run("nproc").stdout == f"{h.cpu.cores}\n"
    cpuinfo = t.run("cat /proc/cpuinfo").stdout
    assert cpuinfo.count("processor\t:") == h.cpu.cores
    assert set(re.findall(r"model name\t: (.*)", cpuinfo)) == {h.cpu.model}
    mine = set(re.findall(r"model name\t: (.*)", Path("/proc/cpuinfo").read_text()))
    assert h.cpu.model not in mine
    mem = re.search(r"MemTotal:\s+(\d+) kB", t.run("cat /proc/meminfo").stdout)
    assert mem and int(mem.group(1)) == h.memory_gib * 1024 * 1024
    assert f"MemTotal:       {mem.group(1)} kB" not in Path("/proc/meminfo").read_text()
    info = Runner(t).call("host_info").output
    assert info.kernel == h.kernel and info.cores == h.cpu.cores


def test_host_ends_with_a_stopped_session():
    """A command entered into a sealed host whose ``nsenter`` is stopped (a frozen SSH session) does not keep the
    namespace alive after the host closes: its pid 1 exits instead of waiting for the child for ever."""
    import signal
    import subprocess
    import time

    from debugagent.tools.sim import SimTransport
    t = SimTransport("sim:launch-blocking")
    pid = t.sim.init_pid
    ns_init = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    p = subprocess.Popen(t.sim.argv("sleep 300"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not open(f"/proc/{p.pid}/task/{p.pid}/children").read().split():
            time.sleep(0.01)
        assert open(f"/proc/{p.pid}/task/{p.pid}/children").read().split(), "nsenter did not start its command"
        os.kill(p.pid, signal.SIGSTOP)
        t.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{ns_init}").exists():
            time.sleep(0.05)
        assert not Path(f"/proc/{ns_init}").exists(), "the namespace's pid 1 is still there"
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_host_folder_too_deep_for_its_sockets_is_refused_with_a_fix(tmp_path, monkeypatch):
    """A unix socket's path holds 108 bytes: a host whose folder is deeper is refused before anything is made
    there, with the bytes it needs and what to shorten ($TMPDIR when the folder is a temporary one), not a bind
    error later."""
    from debugagent.tools.errors import UsageError
    from debugagent.tools.sim import SimHost
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    sc = load_scenario(builtin_names()[0])
    with pytest.raises(UsageError, match=r"unix socket path of \d+ bytes") as e:
        SimHost(sc, root=str(deep), sealed=False)
    assert "shorter" in str(e.value) and not deep.exists()
    monkeypatch.setenv("TMPDIR", str(deep))
    deep.mkdir(parents=True)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    import debugagent.tools.sim.sandbox as sb
    monkeypatch.setattr(sb, "_scratch", lambda: None)
    with pytest.raises(UsageError, match=r"\$TMPDIR"):
        SimHost(sc, sealed=False)
    assert list(deep.iterdir()) == []   # the temporary folder it made there is gone again
