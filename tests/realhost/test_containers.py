"""A server in a "container" of real namespaces (tests/realhost/container.py), diagnosed from outside it through
``--host nsenter:PID``: every command, the benchmark and the experiment's restart run inside its namespaces; the
server inside, the namespace's /tmp and the machine's as found afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from debugagent_testing import event_lines

from .conftest import BENCH, Host, pids_with, proc_state
from .container import Box, bench_in, make_box, start_in, why_not

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(why_not()), reason=why_not() or "-")]


def run_in(box: Box, h: Host, *args: str, out: Path, host: str | None = None, timeout: float = 240) -> dict:
    """``debugagent run --host nsenter:PID …`` from this machine, as a subprocess: its JSON, exit, events."""
    cli = Path(sys.executable).parent / "debugagent"
    argv = [str(cli), "run", "--host", host or f"nsenter:{box.pid}", "--server-pattern", h.pattern, "--bench",
            h.bench_cmd(), "--allow-mutations", "--json", "--out", str(out), "--ready-timeout", "60", *args]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=h.dir)
    wall = time.monotonic() - t0
    assert r.stdout.strip().startswith("{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]}"
    o = json.loads(r.stdout)
    o["exit"] = r.returncode
    o["run_id"] = json.loads((out / "run.json").read_text())["run_id"]
    o["events"] = event_lines(out / "events.jsonl")
    print(f"\n[{host or 'nsenter'}] exit {o['exit']}, {o['commands']} commands, {o['bench_runs']} benchmark runs, {wall:.1f} s")
    return o


def server_in(box: Box, h: Host) -> dict:
    """The server as found: its argv, environment and folder (from this machine's /proc), and that it runs in the box."""
    pids = [p for p in pids_with(h.tag) if "infer.serve" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert len(pids) == 1, pids
    ns = {n: os.readlink(f"/proc/{pids[0]}/ns/{n}") for n in ("mnt", "pid", "net")}
    assert ns == {n: os.readlink(f"/proc/{box.pid}/ns/{n}") for n in ("mnt", "pid", "net")}, "the server left the box"
    return proc_state(pids[0])


@pytest.fixture
def box(tmp_path):
    b = make_box(tmp_path)
    yield b
    b.stop()


def test_flag_regression_inside_namespaces_is_found_through_nsenter(realhost, box, tmp_path):
    """A server started with --disable-cuda-graph in its own mount, pid and net namespaces, its port reachable only
    there: `--host nsenter:PID` reproduces the regression there, restarts the server there without the flag (the
    restart happens inside the namespaces), names the flag by experiment, and leaves the server, the box's /tmp and
    this machine's /tmp as found."""
    h = realhost("boxed")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    start_in(box, h)
    base = min(bench_in(box, h) or 1e9 for _ in range(3))
    subprocess.run(box.enter("pkill", "-f", "--", h.pattern), check=True)
    h.flags = ["--disable-cuda-graph"]
    start_in(box, h)
    assert h.bench_once() is None, "the server's port must not be reachable from this machine's network"
    bad = sorted(bench_in(box, h) or 0 for _ in range(3))[1]
    before, box_tmp, host_tmp = server_in(box, h), box.tmp(), sorted(os.listdir("/tmp"))

    o = run_in(box, h, "--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", "--max-runs", "4", out=tmp_path / "run")

    causes = {c["hypothesis"]: c for c in o["root_causes"] or []}
    assert o["exit"] == 0 and "serving_config" in causes, o["summary"]
    assert causes["serving_config"]["how"] == "experiment"
    restarts = [e for e in o["events"] if e["event"] == "tool_call" and e["tool"] == "restart_server"]
    assert restarts and all("--disable-cuda-graph" not in e["input"]["argv"] for e in restarts[:1])
    deadline = time.monotonic() + 60
    while bench_in(box, h) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    after = server_in(box, h)
    assert after == before and "--disable-cuda-graph" in after["argv"]
    assert box.tmp() == box_tmp and o["run_id"] not in " ".join(os.listdir("/tmp"))
    assert [n for n in os.listdir("/tmp") if n not in host_tmp and o["run_id"] in n] == []
    # each command is recorded as the probe wrote it, shown as the line a person would paste here: nsenter into the box
    calls = [e for e in o["events"] if e["event"] == "tool_call"]
    assert calls and all(e["display"].startswith(f"nsenter --target {box.pid} --mount ") for e in calls)
    assert not any(e["command"].startswith("nsenter") for e in calls)


# ---------------------------------------------------------------- a real container (podman with runc)
def podman_env(tmp: Path) -> dict[str, str]:
    """podman's settings for a store of this test's own (vfs, runc, cgroupfs, no default ulimits: this machine's
    RLIMIT_NOFILE is below podman's default)."""
    conf, store = tmp / "containers.conf", tmp / "storage.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
                    'events_logger = "file"\n')
    store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp / "prun"}"\ngraphroot = "{tmp / "graph"}"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(store)}


def mounts(inspect: dict) -> list[dict]:
    """A container's mounts from its inspect, by destination: podman 4.3 lists them in no fixed order (the same
    `podman create` line, run five times here, listed three mounts in two orders)."""
    return sorted(inspect["Mounts"], key=lambda m: m["Destination"])


def podman_image(tmp: Path, env: dict[str, str]) -> str:
    """An image of symlinks into /usr (mounted read-only from this machine), imported: no registry is contacted."""
    root = tmp / "rootfs"
    for d in ("usr", "etc", "tmp", "proc", "dev", "sys", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        os.symlink(f"usr/{link}", root / link)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["podman", "import", "-", "localhost/box:1"], input=tar, env=env, capture_output=True, check=True,
                   timeout=120)
    return "localhost/box:1"


@dataclass
class Podman:
    """podman with a store of this module's own, and the image its containers run."""

    env: dict[str, str]
    image: str


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> Podman:
    """The store and the image made once for the module's podman tests (each test's containers are removed after
    it); skips where podman and runc are missing or cannot start a container."""
    import shutil
    if not shutil.which("podman") or not shutil.which("runc"):
        pytest.skip("needs podman and runc (apt-get install podman runc; ./run-tests installs them)")
    tmp = tmp_path_factory.mktemp("podman")
    env = podman_env(tmp)
    img = podman_image(tmp, env)
    r = subprocess.run(["podman", "run", "--rm", "--network", "none", "-v", "/usr:/usr:ro", img, "true"], env=env,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"podman cannot start a container here: {r.stderr.strip()[-300:]}")
    return Podman(env, img)


@pytest.fixture
def podman_host(podman, tmp_path, monkeypatch):
    """The test server's code and benchmark in a folder of the test's own, to be bind-mounted into a container run
    by the system Python (the image is /usr of this machine); debugagent's podman uses the module's store. Every
    container is removed afterwards."""
    for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"):
        monkeypatch.setenv(k, podman.env[k])
    h = Host(dir=tmp_path / "h", python="/usr/bin/python3")
    h.dir.mkdir()
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    (h.dir / "bench.py").write_text(BENCH)
    yield h
    subprocess.run(["podman", "rm", "-f", "-a"], env=podman.env, capture_output=True, timeout=120)


def test_a_real_podman_container_is_entered_and_its_recreate_commands_work(podman, podman_host):
    """A server that is a real podman container's main process: `--host podman:NAME` runs commands in it; the flag
    experiment is refused with the commands, the container untouched; then the printed commands, run as printed,
    start a container without the flag that serves faster, and the printed undo puts the very container back."""
    from debugagent.agent.hosts import open_transport
    from debugagent.agent.lab.errors import ExperimentError
    from debugagent.agent.lab.server import LabSetup, Server, ServerRun
    from debugagent.tools.discovery import DiscoveryInput
    from debugagent.tools.registry import Runner
    env, h = podman.env, podman_host
    h.flags = ["--disable-cuda-graph"]
    name = f"srv-{h.port}"
    bench = ["podman", "exec", name, "/usr/bin/python3", str(h.dir / "bench.py"), str(h.port)]

    def ready() -> float:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = subprocess.run(bench, env=env, capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return float(r.stdout.split("=")[1].split()[0])
            time.sleep(0.2)
        raise AssertionError("the container's server did not answer")

    def inspect() -> dict:
        return json.loads(subprocess.run(["podman", "inspect", name], env=env, capture_output=True, text=True,
                                         check=True, timeout=60).stdout)[0]

    subprocess.run(["podman", "run", "-d", "--name", name, "--network", "none", "-v", "/usr:/usr:ro", "-v",
                    f"{h.dir}:{h.dir}", "--workdir", str(h.cwd), "-e", "LANG=C.UTF-8", "--shm-size", "256m",
                    "--label", "team=inference", podman.image, *h.argv()],
                   env=env, capture_output=True, check=True, timeout=120)
    slow = ready()
    found = inspect()
    with open_transport(f"podman:{name}") as t:
        assert t.run("cat /proc/1/cmdline | tr '\\0' ' '").stdout.split() == h.argv()
        server = Server(LabSetup(server_pattern=h.pattern), "run1", lambda *a, **k: None, 30.0,
                        DiscoveryInput(server_pattern=h.pattern), lambda *a: pytest.fail("nothing is journalled"),
                        lambda: None)
        r = Runner(t)
        srv = server.find(r)
        with pytest.raises(ExperimentError) as e:
            server.start(r, srv, ServerRun(argv=[a for a in srv.argv if a != "--disable-cuda-graph"], cwd=srv.cwd),
                         "without --disable-cuda-graph")
    assert inspect() == found
    text = str(e.value)
    cmds = [c for c in text.split("`") if c.startswith("podman ")]
    do, undo = cmds[:3], cmds[3:]
    assert [c.split()[1] for c in do] == ["stop", "rename", "run"] and "--disable-cuda-graph" not in do[2]
    for c in do:
        subprocess.run(c, shell=True, env=env, capture_output=True, check=True, timeout=120)
    fast = ready()
    changed = inspect()
    assert changed["Id"] != found["Id"] and fast < slow - 10, (slow, fast)
    assert mounts(changed) == mounts(found)
    for f in ("HostConfig.NetworkMode", "HostConfig.ShmSize", "Config.WorkingDir", "Config.Labels"):
        a, b = changed, found
        for k in f.split("."):
            a, b = a[k], b[k]
        assert a == b, f
    assert changed["HostConfig"]["Ulimits"] == found["HostConfig"]["Ulimits"]
    for c in undo:
        subprocess.run(c, shell=True, env=env, capture_output=True, check=True, timeout=120)
    ready()
    back = inspect()
    assert back["Id"] == found["Id"] and back["Args"] == found["Args"] and back["Name"] == found["Name"]


def test_a_real_podman_container_is_recreated_by_the_experiment_and_put_back(podman, podman_host, tmp_path):
    """`debugagent run --host podman:NAME --allow-container-recreate`: a server that is a real podman container's main
    process, started with --disable-cuda-graph and CUDA_LAUNCH_BLOCKING=1. Each is confirmed by an experiment that
    recreates the container from its own inspect with only that change (journalled first); the undo puts the very
    container back (same id, name, image, command, environment, mounts), and the as-found check reads its inspect."""
    env, image, h = podman.env, podman.image, podman_host
    name = f"srv-{h.port}"
    bench = f"/usr/bin/python3 {h.dir / 'bench.py'} {h.port}"

    def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=check, timeout=120)

    def measure(n: int = 3) -> float:
        deadline, got = time.monotonic() + 60, []
        while len(got) < n and time.monotonic() < deadline:
            r = podman("exec", name, *bench.split(), check=False)
            if r.returncode == 0:
                got.append(float(r.stdout.split("=")[1].split()[0]))
            else:
                time.sleep(0.2)
        assert len(got) == n, "the container's server did not answer"
        return sorted(got)[n // 2]

    def inspect(which: str = name) -> dict:
        return json.loads(podman("inspect", "--type", "container", which).stdout)[0]

    def start(flags: list[str], envs: list[str]) -> None:
        h.flags = flags
        podman("run", "-d", "--name", name, "--network", "none", "-v", "/usr:/usr:ro", "-v", f"{h.dir}:{h.dir}",
               "--workdir", str(h.cwd), "-e", "LANG=C.UTF-8", *envs, "--label", "team=inference",
               image, *h.argv())

    start([], [])
    base = measure(5)
    podman("rm", "-f", name)
    start(["--disable-cuda-graph"], ["-e", "CUDA_LAUNCH_BLOCKING=1"])
    bad = measure(5)
    assert bad > base + 25, (base, bad)
    found = inspect()
    cli = Path(sys.executable).parent / "debugagent"
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = subprocess.run([str(cli), "run", "--host", f"podman:{name}", "--server-pattern", h.pattern, "--bench", bench,
                        "--allow-mutations", "--allow-container-recreate", "--json", "--out", str(out),
                        "--ready-timeout", "60", "--symptom", f"latency {bad:.2f} ms", "--baseline",
                        f"latency {base:.2f} ms", "--max-runs", "4"],   # each benchmark run is a `podman exec`
                       capture_output=True, text=True, timeout=900, cwd=h.dir, env=env)
    wall = time.monotonic() - t0
    assert r.stdout.strip().startswith("{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]}"
    o = json.loads(r.stdout)
    events = event_lines(out / "events.jsonl")
    print(f"\n[podman recreate] exit {r.returncode}, {o['commands']} commands, {o['bench_runs']} benchmark runs, "
          f"{wall:.1f} s")
    causes = {c["hypothesis"]: c for c in o["root_causes"] or []}
    assert r.returncode == 0 and set(causes) == {"serving_config", "env_var"}, o["summary"]
    assert all(c["how"] == "experiment" for c in causes.values())
    recreated = [e for e in events if e["event"] == "tool_call" and e["tool"] == "container_recreate"]
    assert recreated and not any(e["event"] == "tool_call" and e["tool"] == "restart_server" for e in events)
    assert any("--disable-cuda-graph" not in e["input"]["run"] for e in recreated)
    assert any("CUDA_LAUNCH_BLOCKING=1" not in e["input"]["run"] for e in recreated)
    kinds = [(e["event"], e.get("tool")) for e in events if e.get("tool") in ("container_recreate", "container_restore")]
    assert kinds.index(("experiment", "container_restore")) < kinds.index(("tool_call", "container_recreate"))
    assert any("checked after the undo: the host is as it was found" in (e.get("text") or "")
               and f"the podman container {name}" in e["text"] for e in events)
    md = (out / "transcript.md").read_text()
    fixes = md.split("## What to do now", 1)[-1].split("\n## ", 1)[0]
    assert f"podman stop {name} && podman rm {name} && podman run -d --name {name}" in fixes, fixes
    back = inspect()
    for f in ("Id", "Name", "ImageName", "Path", "Args"):
        assert back[f] == found[f], f
    assert mounts(back) == mounts(found)
    for f in ("Env", "WorkingDir", "Labels"):
        assert back["Config"][f] == found["Config"][f], f
    assert back["HostConfig"]["NetworkMode"] == found["HostConfig"]["NetworkMode"] and back["State"]["Running"]
    assert podman("inspect", "--type", "container", f"{name}.debugagent-found", check=False).returncode != 0
    assert [c for c in podman("ps", "-a", "--format", "{{.Names}}").stdout.split() if c.startswith(name)] == [name]
    assert measure() > base + 25   # the container as found, serving as found
