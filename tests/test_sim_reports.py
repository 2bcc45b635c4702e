"""The scenarios written from public reports (tests/scenarios/reports/): every server shape (`-m MODULE` of an
installed distribution of any name, a script, a console script, an offline workload, a multi-process server, an
image's python under /usr/local, a server run by supervisord or by a systemd unit, a docker container). Here each is
validated and started, cheaply: its server runs with its command
line (an offline workload: no server, and its program prints the metric). Their diagnosis, sealed and not, is
`bench/scenarios --reports --seal both` (docs/benchmarks.md); an offline workload is diagnosed end to end on a real
host by tests/realhost/test_offline.py."""

from __future__ import annotations

import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from debugagent.tools.sim import SimTransport, parse_scenario

HERE = Path(__file__).parent / "scenarios" / "reports"
REPORTS = sorted(HERE.glob("*.yaml"))
THREAD = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+")


def load(path: Path):
    return parse_scenario(path.read_text(), str(path))


def shape(sc) -> str:
    srv = sc.host.server
    if srv.offline:
        return "offline"
    words = srv.cmd.split()
    return "module" if "-m" in words else "script" if len(words) > 1 and words[1].endswith(".py") else "console"


def test_fifteen_or_more_each_citing_its_thread():
    assert len(REPORTS) >= 15
    scenarios = [load(p) for p in REPORTS]   # each valid, as `sim validate` reads it
    for p, sc in zip(REPORTS, scenarios, strict=True):
        assert THREAD.search(sc.story), f"{p.name}: its story cites no public thread"
        assert THREAD.search(p.read_text().split("\nversion:")[0]), f"{p.name}: no thread in its header comment"
    assert {shape(sc) for sc in scenarios} == {"offline", "module", "script", "console"}
    assert any(sc.host.server.worker for sc in scenarios), "no multi-process server"
    assert any(sc.host.server.offline and "-m" in sc.host.server.cmd.split() for sc in scenarios), "no -m workload"
    assert {sc.host.supervisor.kind for sc in scenarios if sc.host.supervisor} == {"supervisord", "systemd"}
    assert any(sc.host.container for sc in scenarios), "no container"
    assert any(sc.host.supervisor and sc.host.container for sc in scenarios), "no supervisor inside a container"


def started(path: Path) -> str:
    """Start the host of ``path``, check it runs as its scenario says, close it; its name once it did."""
    sc = load(path)
    srv = sc.host.server
    with SimTransport(f"sim:{path}") as t:
        profile = json.loads(t.run("cat /etc/debugagent/host.json").stdout)
        args = t.run("ps -eo args").stdout
        if srv.offline:
            assert sc.host.python not in args, args   # no server: nothing of the host's python runs
            out = t.run(profile["bench"])
            assert out.exit_code == 0 and re.search(rf"{sc.bench.metric}=[\d.]+ {re.escape(sc.bench.unit)}", out.stdout), out
        else:
            assert srv.cmd.split()[0] in args and srv.cmd.split()[-1] in args, args
        sup = sc.host.supervisor
        if sup is not None and sup.kind == "systemd":   # the unit's process, in the unit's cgroup, restarted by it
            unit = f"{sup.program}.service"
            pid = t.run(f"systemctl show -p MainPID --value {unit}").stdout.strip()
            assert pid.isdigit() and pid != "0", pid
            assert t.run(f"cat /proc/{pid}/cgroup").stdout == f"0::/system.slice/{unit}\n"
            assert srv.cmd.split()[-1] in t.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
            r = t.run(f"systemctl restart {unit} && systemctl show -p MainPID --value {unit}")
            assert r.exit_code == 0 and r.stdout.strip() not in (pid, "0"), r
            assert t.run(f"cat /proc/{r.stdout.strip()}/cgroup").stdout == f"0::/system.slice/{unit}\n"
        elif sup is not None:   # the real supervisord runs the server as its program, and answers for it
            # RUNNING once it has run startsecs (1 s), as supervisorctl says it on any host: waited for, as a user would
            st = t.run(f"for i in $(seq 600); do s=$(/usr/local/bin/supervisorctl -c {sup.config} status {sup.program}); "
                       "case \"$s\" in *RUNNING*) break;; esac; sleep 0.1; done; echo \"$s\"")
            assert re.match(rf"{re.escape(sup.program)}\s+RUNNING\s+pid (\d+),", st.stdout), st
            pid = int(st.stdout.split("pid ")[1].split(",")[0])
            ppid = t.run(f"awk '{{print $4}}' /proc/{pid}/stat").stdout.strip()
            assert t.run(f"cat /proc/{ppid}/comm").stdout.strip() == "supervisord"
            env = t.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
            assert f"SUPERVISOR_PROCESS_NAME={sup.program}" in env, env
        c = sc.host.container
        if c is not None and c.connect == "host":   # the host runs it: its runtime's CLI names it, its cgroup is its scope
            got = t.run(f"{c.runtime} ps --format '{{{{.Names}}}} {{{{.Image}}}}'")
            assert got.stdout == f"{c.name} {c.image}\n", got
            pid = t.run(f"{c.runtime} inspect -f '{{{{.State.Pid}}}}' {c.name}").stdout.strip()
            scope = "/system.slice/docker-" if c.runtime == "docker" else "/machine.slice/libpod-"
            assert t.run(f"cat /proc/{pid}/cgroup").stdout.startswith(f"0::{scope}")
        elif c is not None and c.runtime == "docker" and t.sim.sealed:
            assert t.run("[ -f /.dockerenv ] && [ ! -s /.dockerenv ]").exit_code == 0
    return path.stem


def test_a_server_that_is_its_containers_pid_1(tmp_path):
    """``pid1: true``: sealed, the server is the container's pid 1 (bwrap's --as-pid-1: the namespace's first process
    becomes it), which debugagent reads as the container's main process; not sealed, its cgroup names the
    container's scope, which debugagent reads the same."""
    from debugagent.tools.mutate import ServerControl, parse_server_control
    text = (HERE / "docker-vllm-disable-custom-all-reduce.yaml").read_text()
    f = tmp_path / "pid1.yaml"
    f.write_text(text.replace("container: {runtime: docker}", "container: {runtime: docker, pid1: true}"))
    with SimTransport(f"sim:{f}") as t:
        assert t.sim.controller is not None
        pid = 1 if t.sim.sealed else [p.real_pid for p in t.sim.controller.procs if p.role == "server"][-1]
        assert "vllm.entrypoints.openai.api_server" in t.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        ctl = parse_server_control(pid, t.run(ServerControl(pid=pid).command()).stdout)
        assert ctl.kind == "container", ctl


def test_each_starts():
    """Every one starts (a few at a time: a start mostly waits on its processes)."""
    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(started, REPORTS)) == sorted(p.stem for p in REPORTS)


def test_an_unsealed_host_rewrites_every_path_of_a_restart_check():
    """A restart recognises the server by its command line's arguments joined by \\x1f; on a host that is not
    sealed each path among them moves onto the host's folder, not only the first (a script server's restart was
    refused as "not the server any more")."""
    from debugagent.tools.sim.shell import SimShell
    sh = SimShell("/sb", "/sb/usr/local/bin", ["/opt", "/root"], "root")
    check = "same $P $'/opt/venv/bin/python3\\x1f/opt/app.py\\x1f--port\\x1f80\\x1f'"
    assert sh.rewrite(check) == "same $P $'/sb/opt/venv/bin/python3\\x1f/sb/opt/app.py\\x1f--port\\x1f80\\x1f'"
    assert sh.rewrite("cat /optional/x /opt") == "cat /optional/x /sb/opt"
    # a root that is a file (the system's python, bound at its path) followed by the separator
    py = SimShell("/sb", "/sb/usr/local/bin", ["/usr/bin/python3", "/root"], "root")
    assert py.rewrite("same $P $'/usr/bin/python3\\x1f-m\\x1fvllm\\x1f'") == "same $P $'/sb/usr/bin/python3\\x1f-m\\x1fvllm\\x1f'"


def test_a_supervisor_or_container_the_simulator_cannot_host_is_refused_naming_the_line():
    """host.supervisor and host.container: a wrong value is refused by validation (no host is laid out), naming the
    file, the line and the fix."""
    import pytest
    from debugagent.tools.errors import ScenarioError
    base = (HERE / "supervisord-sglang-nccl-p2p-disabled.yaml").read_text()
    cases = [
        ("supervisor: {kind: supervisord, program: sglang}",
         "supervisor: {kind: systemd, program: sglang, config: /etc/supervisor/supervisord.conf}", "supervisor:",
         "remove `config`"),
        ("supervisor: {kind: supervisord, program: sglang}", "supervisor: {kind: runit, program: sglang}",
         "supervisor:", "supervisord"),
        ("supervisor: {kind: supervisord, program: sglang}", "supervisor: {kind: supervisord, program: 'my prog'}",
         "supervisor:", "program"),
        ("supervisor: {kind: supervisord, program: sglang}",
         "supervisor: {kind: supervisord, program: sglang, config: /opt/sup.conf}", "supervisor:", "/etc/supervisor/"),
        ("supervisor: {kind: supervisord, program: sglang}",
         "supervisor: {kind: supervisord, program: sglang}\n  container: {runtime: lxd}", "container:", "docker"),
    ]
    for old, new, key, fix in cases:
        text = base.replace(old, new)
        assert text != base
        line = f"line {next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(key))}"
        with pytest.raises(ScenarioError) as e:
            parse_scenario(text, "bad.yaml")
        msg = str(e.value)
        assert "bad.yaml" in msg and line in msg and fix in msg, msg


def test_an_unsealed_hosts_proc_folder_made_by_commands_at_once(tmp_path):
    """Commands run at once each sync an unsealed host's /proc: a process's own folder (a unit's cgroup) made by several at once is made once, whole, with no error and nothing left beside it."""
    import os
    import threading

    from debugagent.tools.sim.shell import _proc_folder
    proc = tmp_path / "fs" / "proc"
    proc.mkdir(parents=True)
    folder = proc / str(os.getpid())
    folder.symlink_to(f"/proc/{os.getpid()}")
    errors: list[BaseException] = []

    def make() -> None:
        try:
            _proc_folder(os.getpid(), folder, "0::/system.slice/vllm.service\n")
        except BaseException as exc:  # noqa: BLE001 - collected, then asserted
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert (folder / "cgroup").read_text() == "0::/system.slice/vllm.service\n"
    assert os.readlink(folder / "root") == os.readlink("/proc/self/root") and os.readlink(folder / "cwd") == os.getcwd()
    assert (folder / "cmdline").read_bytes() == open(f"/proc/{os.getpid()}/cmdline", "rb").read()
    assert sorted(p.name for p in proc.iterdir()) == [str(os.getpid())]


def test_an_unsealed_host_shows_only_its_own_container_marks(tmp_path):
    """An unsealed host's container marks are its scenario's, never this machine's: where this machine runs in
    docker (a /.dockerenv in its root) a host of no container once showed "docker" to the host id and to
    server_shape while the same host sealed showed none. Here a host with no container shows none to both
    probes, and the same host in a docker container shows docker."""
    from debugagent.agent.journal import HOST_ID_COMMAND, parse_host_id
    from debugagent.tools.shape import ServerShapeInput, parse_server_shape
    from debugagent.tools.sim import load_scenario
    from debugagent.tools.sim.sandbox import SimHost
    from debugagent.tools.sim.scenario import builtin_dir

    text = (builtin_dir() / "launch-blocking.yaml").read_text()

    def probe(runtime: str | None) -> tuple[str | None, str | None]:
        p = tmp_path / f"{runtime}.yaml"
        p.write_text(text if runtime is None else text.replace("\n  server:\n", f"\n  container: {{runtime: {runtime}}}\n  server:\n", 1))
        # a short folder: the host's service socket lies under it, and a unix socket's path holds 107 bytes (pytest's
        # tmp_path under xdist is deep enough to pass that)
        h = SimHost(load_scenario(str(p)), root=tempfile.mkdtemp(prefix="um-"), sealed=False)
        try:
            host = parse_host_id(h.exec(HOST_ID_COMMAND).stdout)
            pid = int(h.exec("for p in /proc/[0-9]*; do grep -q launch_server $p/cmdline && echo ${p#/proc/}; done").stdout.split()[0])
            server = parse_server_shape(pid, h.exec(ServerShapeInput(pid=pid).command()).stdout)
            return (host.container.split()[0] if host.container else None, server.container.runtime if server.container else None)
        finally:
            h.close()

    with ThreadPoolExecutor(2) as pool:   # the two hosts at once: a start mostly waits on its processes
        none, docker = pool.map(probe, (None, "docker"))
    assert none == (None, None), none
    assert docker == ("docker", "docker"), docker
