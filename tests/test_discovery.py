"""Server discovery: parsers on real outputs, and real processes found over `--host local` and `sim:`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from debugagent.tools.discovery import (
    Discovery,
    DiscoveryInput,
    ServerProcess,
    bench_ports,
    candidates,
    discover,
    is_debugagent,
    rank,
)
from debugagent.tools.errors import TransportError
from debugagent.tools.gpu import GpuProcess, parse_compute_apps
from debugagent.tools.host import (
    Listener,
    Proc,
    ProcTable,
    parse_fd_sockets,
    parse_proc_net_tcp,
    parse_ss_listen,
    parse_stat,
)
from debugagent.tools.registry import Runner
from debugagent.tools.transport import LocalTransport

from tests.conftest import vector

ROOT = Path(__file__).resolve().parents[1]
DEBIAN = ROOT / "tests" / "vectors" / "debian"


def debian(name: str) -> str:
    lines = (DEBIAN / name).read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith(("$ ", "[exit"))) + "\n"


# ---------------------------------------------------------------- parsers on real outputs
def test_compute_apps_h200_lists_the_workers():
    """nvidia-smi on the H200 lists the two multiprocessing workers (pids 458, 459), not their API parent."""
    procs = parse_compute_apps(vector("compute_apps.txt"))
    assert [(p.pid, p.process_name, p.used_memory_mib) for p in procs] == [
        (459, "/opt/torch/.venv/bin/python3", 1634), (458, "/opt/torch/.venv/bin/python3", 1634)]


def test_proc_net_tcp_h200_and_debian():
    """LISTEN rows only (TIME_WAIT is not a server), IPv4 and IPv6 addresses decoded, ports from hex."""
    h200 = parse_proc_net_tcp(vector("proc_net_tcp.txt"))
    assert h200 == [("127.0.0.1", 18431, 14344), ("0.0.0.0", 2024, 7190)]
    deb = parse_proc_net_tcp(debian("proc_net_tcp.txt"))
    assert ("127.0.0.1", 35951, 66204) in deb and ("::1", 53009, 66205) in deb and ("::1", 37465, 65943) in deb


def test_fd_sockets_map_inodes_to_pids():
    """`find /proc/PID/fd -lname 'socket:*'` lines give each socket inode its owner."""
    assert parse_fd_sockets(vector("fd_sockets.txt")) == {14344: [450]}
    assert parse_fd_sockets(debian("fd_sockets.txt")) == {66204: [1951], 66205: [1951]}


def test_ss_listen_debian():
    """`ss -Hltnp`: address, port and the owner's pid where ss can see it (none for port 2024)."""
    ls = {(x.address, x.port): x.pids for x in parse_ss_listen(debian("ss_listen.txt"))}
    assert ls[("127.0.0.1", 35951)] == [1951] and ls[("::1", 53009)] == [1951]
    assert ls[("0.0.0.0", 2024)] == []


def h200_table() -> tuple[ProcTable, list[GpuProcess]]:
    """The H200 capture as discovery sees it: four processes, the listener on 18431, the GPU workers."""
    text = vector("proc_stat_tree.txt")
    procs = []
    blocks = [b for b in text.split("== ")[1:]]
    for b in blocks:
        lines = b.splitlines()
        pid, ppid, start = parse_stat(lines[1])
        procs.append(Proc(pid=pid, ppid=ppid, start=start, argv=lines[3].split(), exe=lines[4]))
    owners = parse_fd_sockets(vector("fd_sockets.txt"))
    listeners = [Listener(address=a, port=p, pids=owners.get(i, [])) for a, p, i in parse_proc_net_tcp(vector("proc_net_tcp.txt"))]
    return ProcTable(self_pid=None, procs=procs, listeners=listeners), parse_compute_apps(vector("compute_apps.txt"))


def test_stat_line_h200():
    """`/proc/PID/stat`: pid, parent and start time, read after the last parenthesis."""
    line = next(ln for ln in vector("proc_stat_tree.txt").splitlines() if ln.startswith("458 ("))
    assert parse_stat(line) == (458, 450, 2557)
    assert parse_stat("77 (a) b (c) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0") == (77, 1, 4242)


def test_gpu_fallback_climbs_from_workers_to_the_api_process_h200():
    """No pattern matches: the GPU's workers lead to their parent (same executable), which is the server."""
    table, gpu = h200_table()
    found, _ = candidates(table, gpu, DiscoveryInput())
    assert len(found) == 1
    s = found[0]
    assert (s.pid, s.found_by) == (450, "gpu")
    assert s.workers == [457, 458, 459]
    assert s.ports == [18431] and s.gpu_mib == 2 * 1634


def test_port_fallback_needs_the_benchmarks_port_h200():
    """Without GPU processes, the process listening on the port the benchmark names is the server."""
    table, _ = h200_table()
    found, _ = candidates(table, [], DiscoveryInput(bench="python client.py --url http://127.0.0.1:18431/generate"))
    assert [(s.pid, s.found_by) for s in found] == [(450, "port")]
    assert bench_ports("bench --port 9000 -n 3") == {9000}
    assert candidates(table, [], DiscoveryInput(bench="python client.py --url http://127.0.0.1:9999/"))[0] == []


def test_debugagent_command_lines_are_recognised():
    """debugagent's own process is known by its entry point, however it was started."""
    assert is_debugagent(["/x/.venv/bin/python", "/x/.venv/bin/debugagent", "run", "--server-pattern", "srv"])
    assert is_debugagent(["python3", "-m", "debugagent.agent.cli", "snapshot"])
    assert is_debugagent(["python3", "-m", "agent.cli", "snapshot"])   # a checkout older than the debugagent namespace
    assert not is_debugagent(["python3", "-m", "sglang.launch_server", "--served-model-name", "debugagent"])


def test_second_server_ranks_after_the_known_one_and_is_a_tenant_by_pid():
    """Two trees from the same binary: the known command line wins; the other's GPU process is a tenant named by pid."""
    a = ServerProcess(pid=10, ppid=1, argv=["/v/bin/python", "srv.py", "--port", "1"], workers=[11], found_by="pattern",
                      why="", start=5)
    b = ServerProcess(pid=20, ppid=1, argv=["/v/bin/python", "srv.py", "--port", "2"], workers=[21], found_by="pattern",
                      why="", start=1)
    assert rank([a, b], DiscoveryInput())[0].pid == 20  # the oldest, with nothing else to go by
    first, other = rank([a, b], DiscoveryInput(known_argv=a.argv))
    assert first.pid == 10
    gpu = [GpuProcess(gpu_uuid="GPU-0", pid=11, process_name="/v/bin/python", used_memory_mib=9000),
           GpuProcess(gpu_uuid="GPU-0", pid=21, process_name="/v/bin/python", used_memory_mib=9000)]
    d = Discovery(process=first, others=[other], gpu_processes=gpu)
    tenants = d.tenants()
    assert [t["pid"] for t in tenants] == [21]
    assert "pid 20" in tenants[0]["server_like"]


# ---------------------------------------------------------------- real processes on this machine
SERVER = textwrap.dedent('''
    import json, os, socket, sys, time
    args = sys.argv[1:]
    def opt(name, default):
        return args[args.index(name) + 1] if name in args else default
    ready, port, workers, mode = opt("--ready", ""), int(opt("--port", "0")), int(opt("--workers", "0")), opt("--mode", "fork")
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(16)
    kids = []
    for i in range(workers):
        if mode == "fork":
            pid = os.fork()
            if pid == 0:
                time.sleep(600); os._exit(0)
            kids.append(pid)
        else:
            import subprocess
            kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "port": s.getsockname()[1], "workers": kids}, f)
    os.rename(ready + ".tmp", ready)
    while True:
        c, _ = s.accept()
        c.recv(1024); time.sleep(0.002); c.sendall(b"ok"); c.close()
''')

CLIENT = textwrap.dedent('''
    import socket, sys, time
    t = time.perf_counter()
    c = socket.create_connection(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1]))); c.sendall(b"go"); c.recv(16); c.close()
    print(f"latency={(time.perf_counter() - t) * 1000:.3f} ms")
''')


class Servers:
    """Real server processes started by a test; each one's whole session is ended afterwards."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen] = []
        (folder / "srv.py").write_text(SERVER)
        (folder / "client.py").write_text(CLIENT)

    def start(self, *args: str, program: list[str] | None = None) -> dict:
        """Start ``program`` (default: this python running srv.py) with ``args`` (``--workers N``, ``--mode
        fork|spawn``, anything else), on a free port; returns its pid, port and workers' pids."""
        ready = self.folder / f"ready-{uuid.uuid4().hex[:8]}.json"
        argv = [*(program or [sys.executable, str(self.folder / "srv.py")]), *args, "--ready", str(ready)]
        p = subprocess.Popen(argv, cwd=self.folder, start_new_session=True, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"server {argv} did not start (exit {p.poll()})")
            time.sleep(0.05)
        return json.loads(ready.read_text())

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


@pytest.fixture
def servers(tmp_path):
    s = Servers(tmp_path)
    yield s
    s.close()


def token() -> str:
    return f"srv-{uuid.uuid4().hex[:10]}"


def local_discover(**kw) -> Discovery:
    with LocalTransport() as t:
        return discover(Runner(t), DiscoveryInput(**kw))


def test_console_script_in_a_venv_is_found_with_its_python(servers, tmp_path):
    """A `#!python` console script in a temporary venv's bin/ (`vllm serve …`) is the server: by
    --server-pattern, and by the default pattern (the benchmark's port picks it among other servers);
    its python is the venv's."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = venv / "bin" / "vllm"
    script.write_text(f"#!{venv / 'bin' / 'python'}\n" + (tmp_path / "srv.py").read_text())
    script.chmod(0o755)
    name = token()
    info = servers.start("serve", name, "--tensor-parallel-size", "2", program=[str(script)])
    for d in (local_discover(server_pattern=f"vllm serve {name}"),
              local_discover(bench=f"python client.py --port {info['port']}")):
        assert d.server is not None and d.server.pid == info["pid"]
        assert d.server.python == str(venv / "bin" / "python") and d.server.kind == "vllm"
        assert d.server.entry == str(script) and d.server.flags["tensor-parallel-size"] == "2"
        assert d.python == str(venv / "bin" / "python") and d.sources["python"] == "the server's interpreter"
        assert d.process.found_by == "pattern" and d.server.ports == [info["port"]]


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_parent_with_two_workers_is_one_server_restart_the_parent(servers, mode):
    """An API process with two worker children: the parent is the server, both children its workers
    (forked workers share its command line, so the pattern matches all three; spawned ones do not match)."""
    name = token()
    info = servers.start(name, "--workers", "2", "--mode", mode)
    d = local_discover(server_pattern=name)
    assert d.server.pid == info["pid"] and d.others == []
    assert d.server.workers == sorted(info["workers"])
    assert d.process.pids == {info["pid"], *info["workers"]}
    assert f"the parent, pid {info['pid']}, is the one to restart" in d.how


def test_listening_port_fallback_with_proc_and_ss(servers):
    """No pattern matches and no GPU: the process on the benchmark's port is found; both listener readers see it."""
    info = servers.start()
    port = info["port"]
    d = local_discover(server_pattern=token(), bench=f"python client.py {port} --url http://127.0.0.1:{port}/")
    assert d.server is not None and d.server.pid == info["pid"]
    assert d.process.found_by == "port" and port in d.process.ports
    with LocalTransport() as t:
        r = Runner(t)
        for method in ("proc", "ss", "auto"):
            o = r.call("process_table", {"listeners": method})
            assert o.ok, o.error
            assert info["pid"] in next(x.pids for x in o.output.listeners if x.port == port), method


def test_two_servers_from_one_binary_the_benchmarks_port_decides(servers):
    """Two servers started from the same script: the one on the benchmark's port is the server, the other a
    server-like tenant named by its pid."""
    name = token()
    a = servers.start(name)
    b = servers.start(name)
    d = local_discover(server_pattern=name, bench=f"python client.py --port {b['port']}")
    assert d.server.pid == b["pid"]
    assert [o.pid for o in d.others] == [a["pid"]]
    assert f"pid {a['pid']}" in d.how
    d2 = local_discover(server_pattern=name, known_argv=d.others[0].argv, bench=f"python client.py --port {b['port']}")
    assert d2.server.pid == a["pid"]  # an experiment's lookup keeps to the server it restarted


def test_own_processes_are_never_listed_even_when_they_match():
    """The probe's siblings (a concurrent command of the same transport) and their children are left out,
    though the pattern is in their command lines."""
    name = token()
    with LocalTransport() as t:
        holder = threading.Thread(target=t.run, args=(f"sleep 20; : {name}",), kwargs={"timeout": 30}, daemon=True)
        holder.start()
        deadline = time.monotonic() + 20
        def cmdline(p: str) -> str:
            try:
                return Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
            except OSError:   # it ended between the listing and the read
                return ""
        while not any(name in cmdline(p) for p in os.listdir("/proc") if p.isdigit()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        d = discover(Runner(t), DiscoveryInput(server_pattern=name))
    assert d.server is None and d.process is None and d.others == []
    assert len(d.own) >= 2  # the concurrent shell and its sleep, at least


def test_cli_snapshot_local_records_server_and_samples_never_itself(servers, tmp_path):
    """`debugagent snapshot --host local --server-pattern … --bench …` records the real server (not debugagent,
    whose own arguments hold the pattern too) and the benchmark's samples."""
    name = token()
    info = servers.start(name, "--workers", "2", "--mode", "spawn")
    out = tmp_path / "snap.json"
    bench = f"{sys.executable} {servers.folder / 'client.py'} --port {info['port']}"
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "snapshot", "--host", "local", "--server-pattern", name,
                        "--bench", bench, "--metric", "latency", "--bench-runs", "3", "-o", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    snap = json.loads(out.read_text())
    assert snap["server"]["pid"] == info["pid"]
    assert snap["server"]["workers"] == sorted(info["workers"])
    assert snap["discovery"]["others"] == []
    assert snap["bench"]["metric"] == "latency" and snap["bench"]["unit"] == "ms"
    assert len(snap["bench"]["samples"]) == 3 and all(v > 0 for v in snap["bench"]["samples"])
    assert snap["python"] == sys.executable
    assert f"server pid {info['pid']}" in r.stderr and "3 benchmark runs" in r.stderr


def test_local_packages_are_the_servers_not_debugagents_own_path(servers, tmp_path):
    """debugagent started with a PYTHONPATH of its own (as on a host where it runs from a folder of wheels): the
    package listing of `--host local` is what the server imports (it has no PYTHONPATH), not debugagent's path."""
    name = token()
    info = servers.start(name)
    site = tmp_path / "own-site"
    meta = site / "onlyforme-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: onlyforme\nVersion: 1.0\n")
    assert "PYTHONPATH" not in Path(f"/proc/{info['pid']}/environ").read_bytes().decode(errors="replace").split("\0")
    out = tmp_path / "snap.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "snapshot", "--host", "local", "--server-pattern", name,
                        "-o", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    names = {p["name"] for p in json.loads(out.read_text())["packages"]["packages"]}
    assert names and "onlyforme" not in names
    # the shell's view, for contrast: the same Python run by the probe's shell lists it
    seen = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('onlyforme'))"],
                          capture_output=True, text=True, env=env)
    assert seen.stdout.strip() == "1.0"


def test_cli_snapshot_bad_overrides_exit_2():
    """A bad --server-pattern, or --bench without --metric/--bench-regex, is refused before connecting."""
    def cli(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "snapshot", "--host", "local", "-o", "/dev/null", *a],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    r = cli("--server-pattern", "(")
    assert r.returncode == 2 and "--server-pattern `(` is not a regular expression" in r.stderr
    r = cli("--bench", "python b.py")
    assert r.returncode == 2 and "--metric NAME" in r.stderr and "--bench-regex" in r.stderr
    r = cli("--bench", "python b.py", "--bench-regex", "x=[0-9]+")
    assert r.returncode == 2 and "group 1" in r.stderr


# ---------------------------------------------------------------- simulated hosts
def test_sim_pattern_and_gpu_fallback_agree_and_tenant_by_pid(sim_host):
    """On a simulated host, the pattern and nvidia-smi's compute processes lead to the same server pid;
    the other GPU process is a tenant."""
    t = sim_host("sim:gpu-contention")
    by_pattern = discover(Runner(t))
    by_gpu = discover(Runner(t), DiscoveryInput(server_pattern=token()))
    assert by_pattern.process.found_by == "pattern" and by_gpu.process.found_by == "gpu"
    assert by_pattern.server.pid == by_gpu.server.pid
    assert by_gpu.server.argv == by_pattern.server.argv
    assert [p["pid"] for p in by_gpu.tenants()] == [48211]


@pytest.mark.ssh
def test_over_ssh_session_shells_are_own_and_the_server_is_found(servers, tmp_path):
    """Over a real sshd: the connection's other session shells (one running a command that holds the pattern)
    are debugagent's own; the real server with the same pattern is found."""
    import getpass

    from debugagent.tools.sim.serve import SSHD, start_sshd
    from debugagent.tools.ssh import SSHTransport
    if not Path(SSHD).is_file():
        pytest.skip("needs Debian's openssh-server")
    name = token()
    info = servers.start(name, "--workers", "1", "--mode", "spawn")
    sshd = start_sshd(tmp_path / "sshd")
    try:
        t = SSHTransport.from_spec(f"{getpass.getuser()}@127.0.0.1:{sshd.port}", identity_file=str(sshd.identity),
                                   known_hosts=str(sshd.known_hosts))
        try:
            def hold():
                try:
                    t.run(f"bash -c 'sleep 15; : {name}'", timeout=30)
                except TransportError:   # the connection is closed under it at the end of the test
                    pass
            holder = threading.Thread(target=hold, daemon=True)
            holder.start()
            deadline = time.monotonic() + 20
            while t.run(f"pgrep -f -- ': {name}' >/dev/null").exit_code != 0:  # the holder's shell is up
                assert time.monotonic() < deadline
                time.sleep(0.1)
            d = discover(Runner(t), DiscoveryInput(server_pattern=name))
        finally:
            t.close()
    finally:
        sshd.stop()
    holder.join(timeout=30)
    assert not holder.is_alive()
    assert d.server is not None and d.server.pid == info["pid"] and d.server.workers == info["workers"]
    assert d.others == []


def test_experiment_lookup_uses_the_runs_own_pattern(servers):
    """The lookup an experiment makes before a restart uses the run's --server-pattern (the default pattern
    cannot see this server), and prefers the command line found at discovery."""
    from debugagent.agent.context import Overrides
    from debugagent.agent.discovery import find_server, run_input
    name = token()
    info = servers.start(name)
    with LocalTransport() as t:
        r = Runner(t)
        srv = find_server(r, run_input(Overrides(server_pattern=name), "latency"))
        assert srv is not None and srv.pid == info["pid"]
        default = find_server(r, run_input(Overrides(), "latency"))  # other people's simulated servers may match it
        assert default is None or default.pid != info["pid"]
        again = find_server(r, run_input(Overrides(), "latency", known=srv.model_dump()))
        assert again is not None and again.pid == info["pid"] and again.found_by == "known"


def test_cli_run_bad_server_pattern_exit_2_writes_nothing(tmp_path):
    """`run --server-pattern '('` is refused at input (exit 2) and writes no run folder."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "run", "--host", "local", "--symptom", "latency 3 ms",
                        "--baseline", "latency 2 ms", "--server-pattern", "(", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--server-pattern `(`" in r.stderr and "fix:" in r.stderr
    assert not out.exists()
