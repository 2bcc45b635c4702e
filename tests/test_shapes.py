"""How the server is run (``server_shape``), the restart of its whole process tree, and restarts through its
supervisor: supervisord's program section (edited byte for byte) and systemd's drop-in (no systemd on the machines
that run these tests: its commands and its undo journal are checked here, through a fake host)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from debugagent.agent.journal import Journal
from debugagent.agent.lab import Lab, Measure
from debugagent.agent.lab.errors import ExperimentError
from debugagent.agent.lab.server import ServerRun
from debugagent.tools import shape, supervise
from debugagent.tools.host import ServerInfo
from debugagent.tools.mutate import RestartServer, parse_server_control
from debugagent.tools.registry import Runner
from debugagent.tools.replay import legacy_command
from debugagent.tools.shadow import parse_gpu_memory
from debugagent.tools.transport import FakeTransport, LocalTransport


# ---------------------------------------------------------------- the shape, from its command's output
def shape_text(cgroup: str = "0::/user.slice", marks: str = "", ancestors: str = "", env: str = "", python: str = "",
               self_cgroup: str = "0::/user.slice", tree: str = "") -> str:
    return (f"== cgroup\n{cgroup}\n== marks\n{marks}\n== self_cgroup\n{self_cgroup}\n== supervisor_env\n{env}\n"
            f"== tree\n{tree}\n== ancestors\n{ancestors}\n" + (f"== python\n{python}\n" if python else "") + "== end\n")


@pytest.mark.parametrize("cgroup, runtime, cid, pod", [
    ("0::/system.slice/docker-4f2a9c8e1b7d3a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f.scope", "docker",
     "4f2a9c8e1b7d3a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f", None),
    ("12:memory:/docker/0123456789ab0123456789ab0123456789ab0123456789ab0123456789abcdef", "docker",
     "0123456789ab0123456789ab0123456789ab0123456789ab0123456789abcdef", None),
    ("0::/machine.slice/libpod-aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899.scope/container",
     "podman", "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899", None),
    ("0::/system.slice/cri-containerd-9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0.scope",
     "containerd", "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0", None),
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/"
     "cri-containerd-aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999.scope", "kubernetes",
     "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999", "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
    ("11:pids:/kubepods/besteffort/pod0a1b2c3d-0000-1111-2222-333344445555/0123456789abcdef0123", "kubernetes",
     None, "0a1b2c3d-0000-1111-2222-333344445555"),
])
def test_a_container_is_told_by_its_cgroup_path(cgroup, runtime, cid, pod):
    s = shape.parse_server_shape(812, shape_text(cgroup=cgroup))
    assert s.container is not None and s.container.runtime == runtime
    assert s.container.id == cid and s.container.pod_uid == pod and not s.container.shared
    assert s.supervisor is None   # a container's unit-like cgroup is not a systemd service of the host
    assert runtime in s.describe()


@pytest.mark.parametrize("mark, runtime", [("/.dockerenv", "docker"), ("/run/.containerenv", "podman")])
def test_a_container_is_told_by_the_mark_in_its_root(mark, runtime):
    s = shape.parse_server_shape(812, shape_text(marks=mark))
    assert s.container is not None and s.container.runtime == runtime and not s.container.shared
    both = shape.parse_server_shape(812, shape_text(marks=f"{mark}\nsame-mnt-ns"))
    assert both.container is not None and both.container.shared   # debugagent's shell runs in it too
    assert shape.parse_server_shape(812, shape_text()).container is None


def test_a_systemd_unit_is_read_from_the_cgroup_and_a_supervisord_from_the_ancestors():
    s = shape.parse_server_shape(812, shape_text(cgroup="0::/system.slice/sglang.service"))
    assert s.supervisor is not None and s.supervisor.kind == "systemd" and s.supervisor.unit == "sglang.service"
    v1 = shape.parse_server_shape(812, shape_text(cgroup="1:name=systemd:/system.slice/vllm@0.service\n0::/"))
    assert v1.supervisor is not None and v1.supervisor.unit == "vllm@0.service"
    user = shape.parse_server_shape(812, shape_text(cgroup="0::/user.slice/user-1000.slice/user@1000.service/app.slice"))
    assert user.supervisor is None   # a user's session manager is not the server's unit
    anc = ("700\tsupervisord\t/usr/bin/python3\x1f/usr/local/bin/supervisord\x1f-c\x1f/etc/sv/supervisord.conf\n"
           "1\tsystemd\t/sbin/init")
    sv = shape.parse_server_shape(812, shape_text(cgroup="0::/system.slice/supervisor.service", ancestors=anc,
                                                  env="SUPERVISOR_PROCESS_NAME=infer\nSUPERVISOR_GROUP_NAME=serving"))
    assert sv.supervisor is not None and sv.supervisor.kind == "supervisord"   # supervisord's own unit is not the server's
    assert (sv.supervisor.pid, sv.supervisor.config, sv.supervisor.program, sv.supervisor.group) == (
        700, "/etc/sv/supervisord.conf", "infer", "serving")
    assert [a.pid for a in sv.ancestors] == [700, 1]


def test_a_line_separator_inside_a_value_stays_in_its_line():
    """The `== section` outputs split on \\n only: U+2028 inside an argument, a comm or a path is part of the value
    (str.splitlines would cut the line there and lose the rest)."""
    s = shape.parse_server_shape(812, shape_text(tree="812\t1\t/srv/bin/python3\x1f--served-model-name\x1fa\u2028b",
                                                 ancestors="1\tsys\u2028temd\t/sbin/init"))
    assert [w.argv for w in s.tree] == [["/srv/bin/python3", "--served-model-name", "a\u2028b"]]
    assert [a.comm for a in s.ancestors] == ["sys\u2028temd"]
    c = parse_server_control(812, "== cgroup\n0::/user.slice\n== self_cgroup\n0::/user.slice\n== parent\n1\n"
                                  "sh\u2028ell\n/bin/sh\n== stdout\n/srv/logs/out\u2028x.log\n== end\n")
    assert c.parent == "sh\u2028ell" and c.stdout == "/srv/logs/out\u2028x.log"
    m = parse_gpu_memory("== gpus\n0, GPU-1, 143771 MiB, 10 MiB\n== apps\nGPU-1\u2028x, 812, 10 MiB\n== end\n")
    assert [a.gpu_uuid for a in m.apps] == ["GPU-1\u2028x"]


def test_the_launcher_layout_and_engine_origin_are_described():
    js = ('{"python": "/usr/bin/python3", "prefix": "/usr", "venv": false, "launcher": "module", "command": '
          '"sglang.launch_server", "module": "sglang.launch_server", "engine": {"module": "sglang", "root": '
          '"/usr/local/lib/python3.10/dist-packages", "how": "dist-packages", "distribution": "sglang", "version": "0.5.5"}}')
    s = shape.parse_server_shape(812, shape_text(python=js, tree="813\t812\t/usr/bin/python3\x1f-c\x1fspawn_main"))
    assert (s.launcher, s.layout, s.engine and s.engine.how) == ("module", "system", "dist-packages")
    assert [w.pid for w in s.tree] == [813]
    text = s.describe()
    assert "`python -m sglang.launch_server`" in text and "by a system Python" in text
    assert "`sglang` (sglang 0.5.5) is imported from dist-packages (a system-Python layout)" in text and "workers: pid 813" in text
    broken = shape.parse_server_shape(812, shape_text(python="Traceback (most recent call last): boom"))
    assert broken.launcher == "unknown" and "could not say how it runs" in broken.errors[0]


# ---------------------------------------------------------------- the shape of real processes
def test_the_shape_of_a_real_script_and_its_worker(tmp_path):
    """A script in its cwd that forks a worker: read for real, the tree holds the worker and the engine is the cwd."""
    (tmp_path / "srv.py").write_text("import multiprocessing as mp, time\ndef w():\n    time.sleep(60)\n"
                                     "if __name__ == '__main__':\n    mp.get_context('fork').Process(target=w).start()\n"
                                     "    print('up', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "srv.py"], cwd=tmp_path, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
        o = Runner(LocalTransport()).call("server_shape", {"pid": p.pid, "python": sys.executable, "cwd": str(tmp_path)})
        assert o.ok, o.error
        s = o.output
        assert s.launcher == "script" and s.engine.how == "cwd" and s.layout == "venv"
        assert len(s.tree) == 1 and s.tree[0].ppid == p.pid and s.ancestors[0].pid == os.getpid()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# ---------------------------------------------------------------- the whole tree is restarted, its port free
LINGER = textwrap.dedent('''
    import multiprocessing as mp, os, socket, sys, time
    def worker():
        time.sleep(120)          # a worker that does not notice its parent is gone, holding the port it inherited
    if __name__ == "__main__":
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
        mp.get_context("fork").Process(target=worker).start()
        print("listening", flush=True)
        while True:
            c, _ = s.accept(); c.close()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_restart_stops_the_whole_tree_and_starts_once_the_port_is_free(tmp_path):
    """The server's forked worker holds its port: the restart stops it too (by pid and start time), checks the port
    is free, and only then starts the new server, which binds it."""
    (tmp_path / "srv.py").write_text(LINGER)
    port = _free_port()
    log = tmp_path / "srv.log"
    argv = [sys.executable, str(tmp_path / "srv.py"), str(port)]
    with open(log, "ab") as f:   # its parent is a shell that waits for it, as a supervisor or a login shell would
        sh = subprocess.Popen(["bash", "-c", f"{shlex.join(argv)} >> {shlex.quote(str(log))} 2>&1 & echo $!; wait"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=f, start_new_session=True)
    assert sh.stdout is not None
    pid = int(sh.stdout.readline())
    deadline = time.monotonic() + 60
    while "listening" not in log.read_text():
        assert time.monotonic() < deadline and sh.poll() is None
        time.sleep(0.05)
    kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    assert len(kids) == 1
    r = Runner(LocalTransport())
    pid_file = tmp_path / "new.pid"
    new = 0
    try:
        o = r.call("restart_server", {"pid": pid, "argv": argv, "cwd": str(tmp_path), "env_file": str(tmp_path / "s.env"),
                                      "save_env": True, "pid_file": str(pid_file), "log": str(log), "ports": [port]})
        assert o.ok, (o.error, log.read_text()[-500:])
        new = o.output.pid
        sh.wait(timeout=30)
        assert not Path(f"/proc/{kids[0]}").exists() or ") Z " in Path(f"/proc/{kids[0]}/stat").read_text()
        deadline = time.monotonic() + 60
        while log.read_text().count("listening") < 2:
            assert time.monotonic() < deadline, log.read_text()[-500:]
            time.sleep(0.05)
        assert _listening(port) and Path(f"/proc/{new}").exists()
        assert "Address already in use" not in log.read_text()
    finally:
        for pid in [new, *[int(x) for x in (Path(f"/proc/{new}/task/{new}/children").read_text().split()
                                             if new and Path(f"/proc/{new}").exists() else [])]]:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_a_port_still_held_stops_the_restart_before_anything_starts(tmp_path):
    """Something else keeps listening on the server's port after the tree is stopped: nothing is started beside it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        inp = RestartServer(pid=0, argv=["sleep", "30"], cwd="/", env_file=str(tmp_path / "e.env"), ports=[port], wait_s=0.3)
        (tmp_path / "e.env").write_bytes(b"PATH=/usr/bin:/bin\0")
        r = LocalTransport().run(inp.command())
        assert r.exit_code == 1 and f"port {port} is still in use" in r.stdout and "started pid" not in r.stdout


def test_recordings_made_before_the_tree_and_port_check_still_replay():
    """The restart script of a kept recording had no tree stop and no port check: both are left out when a new
    command is matched against it."""
    base = {"pid": 812, "argv": ["python", "-m", "sglang.launch_server", "--port", "30000"], "cwd": "/srv",
            "env_file": "/tmp/debugagent-r1-812.env", "save_env": True}
    new = RestartServer(**base, ports=[30000]).command()
    assert "kids 812" not in new and "kids $P" in new and "for pt in 30000" in new
    old = legacy_command(new)
    assert "kids" not in old and "for pt in" not in old and "reap" not in old
    assert old == legacy_command(RestartServer(**base).command())


# ---------------------------------------------------------------- supervisord's config, byte for byte
PROGRAM = """; serving
[program:infer]
command=/srv/venv/bin/python -m infer.serve --port 8000 --disable-cuda-graph
environment=HOME="/srv",CUDA_LAUNCH_BLOCKING="1",NOTE="a,b %% c"
directory=/srv
autorestart=true

[program:other]
command=/bin/true
"""


def test_the_program_section_is_edited_and_every_other_byte_kept():
    env = supervise.parse_environment(supervise.program_value(PROGRAM, "infer", "environment") or "")
    assert env == {"HOME": "/srv", "CUDA_LAUNCH_BLOCKING": "1", "NOTE": "a,b %% c"}
    del env["CUDA_LAUNCH_BLOCKING"]
    new = supervise.edit_program(PROGRAM, "infer", {"command": "/srv/venv/bin/python -m infer.serve --port 8000",
                                                   "environment": supervise.format_environment({"HOME": "/srv"})})
    assert new == PROGRAM.replace(" --disable-cuda-graph", "").replace(
        'environment=HOME="/srv",CUDA_LAUNCH_BLOCKING="1",NOTE="a,b %% c"', 'environment=HOME="/srv"')
    added = supervise.edit_program(PROGRAM, "other", {"environment": 'X="1"'})
    assert added == PROGRAM + 'environment=X="1"\n'
    assert supervise.parse_environment(supervise.format_environment({"A": 'say "50%", ok'})) == {"A": 'say "50%%", ok'}
    with pytest.raises(supervise.SectionError):
        supervise.edit_program(PROGRAM, "missing", {"command": "x"})


# ---------------------------------------------------------------- systemd, through a fake host
def systemd_host(calls: list[str], journal: Journal, systemctl: bool = True, permitted: bool = True):
    def host(command: str) -> str:
        calls.append(command)
        if "== marks" in command:   # server_shape
            return shape_text(cgroup="0::/system.slice/sglang.service")
        if command.startswith("p=/proc/"):   # server_control
            return ("== cgroup\n0::/system.slice/sglang.service\n== self_cgroup\n0::/user.slice\n== parent\n1\nsystemd\n"
                    "/sbin/init\n== container_env\n== stdout\n== end\n")
        if "systemctl" in command:
            if "daemon-reload" in command and "rm -f" not in command:
                assert journal.pending(), "the drop-in was written before its undo was journalled"
            if not systemctl:
                return ("systemctl is not installed here\n", "", 1)
            if not permitted:
                if "DropInPaths" in command:   # the undo of a drop-in never written
                    return "running pid=812\n"
                return ("no permission to write /etc/systemd/system (this session runs as uid 1000): nothing written\n",
                        "", 1)
            return "started pid=4321\n"
        raise AssertionError(command)
    return host


def lab_for(tmp_path, transport) -> tuple[Lab, Journal]:
    j = Journal(tmp_path / "journal.json", "r1", "fake")
    lab = Lab(lambda h: Runner(transport), lambda ev, **kw: None, j, Measure("bench", "latency", None), "r1", True)
    return lab, j


SRV = ServerInfo(pid=812, argv=["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--port", "30000",
                                "--disable-cuda-graph"], cwd="/srv", env={"CUDA_LAUNCH_BLOCKING": "1"})


def test_a_systemd_unit_is_restarted_through_a_drop_in_and_its_undo_removes_it(tmp_path):
    calls: list[str] = []
    lab, j = lab_for(tmp_path, None)
    t = FakeTransport(systemd_host(calls, j))
    lab.runner_for = lambda h: Runner(t)
    run = ServerRun(argv=SRV.argv[:-1], cwd="/srv", unset=["CUDA_LAUNCH_BLOCKING"], set={"NCCL_DEBUG": "WARN $HOME 5%"},
                    unset_flags=["disable-cuda-graph"])
    pid = lab.server.start(Runner(t), SRV, run, "--disable-cuda-graph removed; CUDA_LAUNCH_BLOCKING unset")
    assert pid == 4321
    path = "/etc/systemd/system/sglang.service.d/debugagent-r1.conf"
    write = next(c for c in calls if "daemon-reload" in c)
    content = ("# written by debugagent for one experiment; its undo removes this file\n[Service]\n"
               'Environment="NCCL_DEBUG=WARN $$HOME 5%%"\nUnsetEnvironment="CUDA_LAUNCH_BLOCKING"\nExecStart=\n'
               'ExecStart="/opt/venv/bin/python3" "-m" "sglang.launch_server" "--port" "30000"\n')
    assert write == ("command -v systemctl >/dev/null || { echo 'systemctl is not installed here'; exit 1; }; "
                     "[ -w /etc/systemd/system ] || { echo \"no permission to write /etc/systemd/system (this session "
                     "runs as uid $(id -u)): nothing written\"; exit 1; }; "
                     f"mkdir -p /etc/systemd/system/sglang.service.d && printf %s {shlex.quote(content)} > {path} || exit 1; "
                     "systemctl daemon-reload || exit 1; systemctl restart sglang.service || exit 1; "
                     "echo \"started pid=$(systemctl show -p MainPID --value sglang.service)\"")
    (step,) = j.pending()
    assert step.tool == "systemd_dropin_remove" and step.input["path"] == path and step.input["remove_dir"]
    assert lab.undo.check(step) is None
    left = lab.undo.run(Runner(t))
    assert left == [] and not j.pending()
    assert calls[-1].endswith(f"rm -f {path} || exit 1; rmdir /etc/systemd/system/sglang.service.d 2>/dev/null; "
                              "systemctl daemon-reload || exit 1; systemctl restart sglang.service || exit 1; "
                              "echo \"started pid=$(systemctl show -p MainPID --value sglang.service)\"")


def test_a_drop_in_step_naming_another_file_is_refused(tmp_path):
    lab, j = lab_for(tmp_path, FakeTransport({}))
    j.record("systemd_dropin_remove", {"unit": "sglang.service", "path": "/etc/systemd/system/sglang.service.d/override.conf"},
             "remove it")
    (step,) = j.pending()
    assert "is not the drop-in debugagent writes for run r1" in (lab.undo.check(step) or "")


def test_without_systemctl_the_drop_in_is_not_written(tmp_path):
    """On a host without systemctl (a PATH without it, for real), the command stops before it writes anything."""
    inp = supervise.SystemdDropin(unit="debugagent-test-none.service",
                                  path="/etc/systemd/system/debugagent-test-none.service.d/debugagent-r1.conf", content="x")
    r = subprocess.run(["/bin/bash", "-c", inp.command()], capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert r.returncode == 1 and "systemctl is not installed here" in r.stdout
    assert not Path("/etc/systemd/system/debugagent-test-none.service.d").exists()


def test_a_systemd_restart_that_fails_leaves_its_undo_journalled(tmp_path):
    calls: list[str] = []
    lab, j = lab_for(tmp_path, None)
    t = FakeTransport(systemd_host(calls, j, systemctl=False))
    with pytest.raises(ExperimentError):
        lab.server.start(Runner(t), SRV, ServerRun(argv=SRV.argv, cwd="/srv", unset=["CUDA_LAUNCH_BLOCKING"]), "x")
    (step,) = j.pending()
    assert step.tool == "systemd_dropin_remove"   # the undo removes whatever part was written


FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "{log}"
[ "$1" = show ] && {{ echo 0; exit 0; }}
echo "Failed to $1: Access denied" >&2
exit 1
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").is_file(), reason="needs root and setpriv to "
                    "run the commands as a user who may not write /etc/systemd/system")
def test_no_permission_for_systemd_changes_nothing_and_says_run_as_root(tmp_path, request):
    """As a user who may not write /etc/systemd/system (setpriv to nobody, a `systemctl` that is refused as a real
    one is): the drop-in command stops before it writes or reloads anything, its undo has nothing to do (exit 0, no
    daemon-reload), and the experiment is refused with the fix; nothing is left to undo."""
    import tempfile
    here = Path(tempfile.mkdtemp(prefix="systemctl-perm-"))   # a folder nobody may enter (the test's own is 0700)
    request.addfinalizer(lambda: __import__("shutil").rmtree(here, ignore_errors=True))
    here.chmod(0o777)
    log = here / "systemctl.log"
    bin_ = here / "bin"
    bin_.mkdir()
    bin_.chmod(0o755)
    (bin_ / "systemctl").write_text(FAKE_SYSTEMCTL.format(log=log))
    (bin_ / "systemctl").chmod(0o755)
    unit, path = "debugagent-test-perm.service", "/etc/systemd/system/debugagent-test-perm.service.d/debugagent-r1.conf"

    def as_nobody(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c", command],
                              capture_output=True, text=True, env={"PATH": f"{bin_}:/usr/bin:/bin"}, timeout=60)
    r = as_nobody(supervise.SystemdDropin(unit=unit, path=path, content="[Service]\n").command())
    assert r.returncode == 1 and "no permission to write /etc/systemd/system" in r.stdout and "uid 65534" in r.stdout
    assert not Path(path).parent.exists() and not log.exists()   # nothing written, systemctl never run
    r = as_nobody(supervise.SystemdDropinRemove(unit=unit, path=path, remove_dir=True).command())
    assert r.returncode == 0 and r.stdout.strip() == "running pid=0", r.stdout + r.stderr
    assert "daemon-reload" not in log.read_text() and "restart" not in log.read_text()

    calls: list[str] = []
    lab, j = lab_for(tmp_path, None)
    t = FakeTransport(systemd_host(calls, j, permitted=False))
    with pytest.raises(ExperimentError) as e:
        lab.server.start(Runner(t), SRV, ServerRun(argv=SRV.argv[:-1], cwd="/srv"), "--disable-cuda-graph removed")
    assert "cannot be changed from this session" in str(e.value) and "run it as root" in str(e.value)
    assert "--restart-cmd" in str(e.value)
    assert lab.undo.run(Runner(t)) == [] and not j.pending()   # its undo finds nothing to do


def test_a_python_that_is_no_venv_with_its_engine_in_dist_packages_is_a_system_python():
    """Debian's python3 copied under another prefix (an image's, a test's) keeps its dist-packages: a system Python;
    one under another prefix whose engine is in site-packages is not."""
    js = ('{"python": "/opt/py/bin/python3", "prefix": "/opt/py", "venv": false, "launcher": "module", "command": '
          '"infer.serve", "module": "infer.serve", "engine": {"module": "infer", "root": '
          '"/opt/py/local/lib/python3.11/dist-packages", "how": "%s"}}')
    assert shape.parse_server_shape(812, shape_text(python=js % "dist-packages")).layout == "system"
    assert shape.parse_server_shape(812, shape_text(python=js % "site-packages")).layout == "other"


def test_a_console_script_code_experiment_asks_where_its_entry_point_module_is_imported_from(tmp_path):
    """A console script's entry is a path (VENV/bin/inferd), not a module: the code experiment asks server_shape for the
    module its entry point names and where the interpreter imports it from (an editable checkout: a .pth path), and
    restarts the server from the worktree with it first on PYTHONPATH."""
    from types import SimpleNamespace

    from debugagent.agent.lab.kinds.code import CodeRevert
    js = ('{"python": "/srv/venv/bin/python", "prefix": "/srv/venv", "venv": true, "launcher": "console_script", '
          '"command": "inferd", "module": "inferd.cli", "engine": {"module": "inferd", "root": "/srv/inferd-src", '
          '"how": "editable"}}')
    asked: list[str] = []

    def host(command: str) -> str:
        if "== marks" in command:
            return shape_text(python=js)
        if "find_spec" in command or "importlib.util" in command:
            asked.append(command)
            return ('{"repo": "/srv/inferd-src", "cwd": "/srv", "cwd_in_repo": null, "modules": [{"module": "inferd", '
                    '"origin": "/srv/inferd-src/inferd/__init__.py", "root": "/srv/inferd-src", "rel": "", '
                    '"how": "a .pth path"}]}\n')
        raise KeyError(command)
    lab, _ = lab_for(tmp_path, None)
    srv = ServerInfo(pid=812, argv=["/srv/venv/bin/python", "/srv/venv/bin/inferd", "--port", "8000"], cwd="/srv",
                     python="/srv/venv/bin/python", entry="/srv/venv/bin/inferd")
    lab.server.find_or_none = lambda r: srv   # type: ignore[method-assign]
    _, plan = CodeRevert().plan(lab, Runner(FakeTransport(host)), "/srv/inferd-src", "/tmp/debugagent-wt-r1",
                                SimpleNamespace(packages={}))   # type: ignore[arg-type]
    assert asked and shlex.split(asked[0])[-1] == "inferd"
    assert plan.mode == "server" and plan.run is not None and plan.run.path_first == ["/tmp/debugagent-wt-r1"]


def test_no_permission_for_systemctl_stops_the_run_before_anything_changes():
    """A server under a systemd unit, on a run that may change the host: where this session may not write
    /etc/systemd/system (or has no systemctl), the run stops right after discovery with exit 2 naming the unit and
    the fix (a user allowed to restart it, --restart-cmd, shadow experiments or --read-only); the only command sent is
    the read-only check. With --restart-cmd, --read-only or the right to change the unit, nothing is refused."""
    from types import SimpleNamespace

    from debugagent.agent import steps
    from debugagent.tools.errors import UsageError
    found = {"server": {"pid": 812, "shape": {"supervisor": {"kind": "systemd", "unit": "sglang.service"}}}}

    def ctx_for(answer: str, calls: list[str], **kw) -> SimpleNamespace:
        t = FakeTransport(lambda c: (calls.append(c), answer)[1])
        return SimpleNamespace(runner=lambda h=None: Runner(t), transport=t, allow_mutations=kw.get("allow", True),
                               confirm=None, overrides=SimpleNamespace(restart_cmd=kw.get("hook")))
    for answer, said in (("systemctl=yes\nwritable=no\nuid=1000\n", "no permission to write /etc/systemd/system"),
                         ("systemctl=no\nwritable=no\nuid=0\n", "systemctl is not installed here")):
        calls: list[str] = []
        with pytest.raises(UsageError) as e:
            steps.systemd_check(ctx_for(answer, calls), found)   # type: ignore[arg-type]
        assert e.value.exit_code == 2 and said in e.value.message and "sglang.service" in e.value.message
        assert "Nothing was changed on the host" in e.value.message
        assert "systemctl restart sglang.service" in (e.value.fix or "") and "--restart-cmd" in (e.value.fix or "")
        assert calls == [supervise.SystemdAccess(unit="sglang.service").command()]   # the read-only check alone
        assert not any(w in calls[0] for w in ("mkdir", "daemon-reload", "restart", "printf", "rm "))
    for kw, answer in (({"hook": "systemctl restart x"}, "systemctl=yes\nwritable=no\n"), ({"allow": False}, ""),
                       ({}, "systemctl=yes\nwritable=yes\nuid=0\n")):
        calls = []
        steps.systemd_check(ctx_for(answer, calls, **kw), found)   # type: ignore[arg-type]
        assert len(calls) == (1 if not kw else 0)
    # the check, for real: as a user who may not write /etc/systemd/system it says so
    if os.geteuid() == 0 and Path("/usr/bin/setpriv").is_file():
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c",
                            supervise.SystemdAccess(unit="sglang.service").command()], capture_output=True, text=True,
                           timeout=60)
        a = supervise.parse_systemd_access(r.stdout)
        assert not a.writable and a.uid == 65534
