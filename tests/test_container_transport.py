"""Transports into a container (tools/container.py): a "container" of real namespaces (tests/realhost/container.py)
entered by nsenter from this machine and over a real sshd; docker and kubectl stood in for by executables on PATH that
really enter it; and each way it can fail (no such container, no CLI, no daemon, no permission): exit 2 or 4 with the
fix, nothing changed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from debugagent.agent.hosts import SSHOptions, check_container, check_host, open_transport
from debugagent.tools.container import ContainerTransport, Target, parse_target
from debugagent.tools.errors import TransportError, UsageError
from debugagent.tools.sim.serve import SSHD, start_sshd
from debugagent.tools.transport import LocalTransport

from tests.realhost.container import make_box, why_not

NS = pytest.mark.skipif(bool(why_not()), reason=why_not() or "-")


@pytest.fixture
def box(tmp_path):
    b = make_box(tmp_path, hostname="inside-box")
    yield b
    b.stop()


# ---------------------------------------------------------------- the command line each runtime gets
@pytest.mark.parametrize("value,argv", [
    ("docker:vllm-0", ["docker", "exec", "-i", "vllm-0"]),
    ("podman:sglang.1", ["podman", "exec", "-i", "sglang.1"]),
    ("k8s:serving/vllm-0", ["kubectl", "exec", "-i", "-n", "serving", "vllm-0", "--"]),
    ("k8s:serving/vllm-0/engine", ["kubectl", "exec", "-i", "-n", "serving", "vllm-0", "-c", "engine", "--"]),
    ("nsenter:4242", ["nsenter", "--target", "4242", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd", "--"]),
])
def test_each_runtime_execs_a_shell_with_the_command_as_one_quoted_argument(value, argv):
    import shlex
    t = parse_target(value)
    command = "echo 'a b' \"$HOME\"; cat /etc/os-release | head -1 && echo $(id -u)"
    words = shlex.split(t.wrap(command))
    assert words[:len(argv)] == argv and words[len(argv):len(argv) + 2] == ["sh", "-c"]
    assert words[-1] == command and words[-2] == "sh"   # $1 of the shell: never pasted into its script
    assert t.label == value


@pytest.mark.parametrize("host,says", [
    ("k8s:Serving/pod", "not NAMESPACE/POD"), ("k8s:serving", "not NAMESPACE/POD"), ("k8s:a/b/c/d", "not NAMESPACE/POD"),
    ("nsenter:x", "not a process id"), ("nsenter:0", "not a process id"), ("docker:-it", "not a container name"),
    ("docker:", "not a container name"), ("podman:a b", "not a container name"), ("docker:a;rm -rf /", "not a container name"),
])
def test_a_container_that_can_never_be_named_so_is_exit_2_with_the_fix(host, says):
    with pytest.raises(UsageError) as e:
        check_host(host)
    assert says in e.value.message and e.value.fix


@pytest.mark.parametrize("host,container,says", [
    ("sim:power-capped", "vllm", "not on a sim: host"), ("docker:a", "b", "not on a docker: host"),
    ("gpu-box", "nsenter:x", "not a process id"),
])
def test_container_with_a_host_it_cannot_go_with_is_exit_2(host, container, says):
    with pytest.raises(UsageError) as e:
        check_container(host, container)
    assert says in e.value.message and e.value.fix
    assert check_container("gpu-box", "vllm") == Target("docker", name="vllm")
    assert check_container("local", "k8s:ns/p") == Target("k8s", name="p", namespace="ns")


# ---------------------------------------------------------------- into real namespaces
@NS
def test_nsenter_runs_each_command_inside_the_namespaces(box, tmp_path):
    """hostname, pid 1 and the network are the box's; the result names the command as written; a command past its
    timeout is cut, and the process it left in the box is killed with it."""
    with open_transport(f"nsenter:{box.pid}") as t:
        r = t.run("hostname; cat /proc/1/comm; awk 'NR > 2 {print $1}' /proc/net/dev; echo \"$1\" 'a  b'")
        assert r.ok, r.stderr
        assert r.stdout.splitlines() == ["inside-box", "bwrap", "lo:", " a  b"]
        assert r.command.startswith("hostname;") and r.host == f"nsenter:{box.pid}"
        assert t.display("true").startswith(f"nsenter --target {box.pid} ") and t.display("true").endswith(" true")
        mark = f"sleep 3{os.getpid() % 1000}"
        cut = t.run(f"exec {mark}", timeout=1)
        assert cut.timed_out and cut.exit_code == 124
        deadline = time.monotonic() + 30
        while mark.encode() in b" ".join(box_cmdlines(box)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.encode() not in b" ".join(box_cmdlines(box))


def box_cmdlines(box) -> list[bytes]:
    """The command lines of every process in the box's pid namespace, read from this machine's /proc."""
    ns = os.readlink(f"/proc/{box.pid}/ns/pid")
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.readlink(p / "ns" / "pid") == ns:
                out.append(p.joinpath("cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            pass
    return out


@NS
@pytest.mark.ssh
@pytest.mark.skipif(not Path(SSHD).is_file(), reason="needs Debian's openssh-server")
def test_container_on_an_ssh_host_runs_the_exec_there(box, tmp_path):
    """`--host user@host --container nsenter:PID`: the exec is sent over SSH and runs on the SSH host."""
    import getpass
    s = start_sshd(tmp_path / "sshd")
    try:
        o = SSHOptions(identity_file=str(s.identity), known_hosts=str(s.known_hosts), container=f"nsenter:{box.pid}")
        host = f"{getpass.getuser()}@127.0.0.1:{s.port}"
        with open_transport(host, o) as t:
            r = t.run("hostname; echo $SSH_CONNECTION | wc -w")
            assert r.ok and r.stdout.split() == ["inside-box", "4"], (r.stdout, r.stderr)
            assert t.host == f"{host}/nsenter:{box.pid}" and t.supports_retry
            assert t.display("true").startswith(f"ssh -p {s.port} ") and "nsenter --target" in t.display("true")
    finally:
        s.stop()


STAND_IN = r"""#!/bin/sh
# {cli}, standing in for the real one: `exec` into a container of this test, by entering its namespaces
set -e
[ "$1" = exec ] && [ "$2" = -i ] || {{ echo "{cli}: only exec -i here" >&2; exit 64; }}
shift 2
{parse}
pid=$(cat "{names}/$name")
exec nsenter --target "$pid" --mount --uts --ipc --net --pid --root --wd -- "$@"
"""
PARSE = {"docker": 'name=$1; shift',
         "kubectl": '[ "$1" = -n ] || exit 64; ns=$2; shift 2; name="$ns.$1"; shift; '
                    'if [ "$1" = -c ]; then name="$name.$2"; shift 2; fi; [ "$1" = -- ] || exit 64; shift'}


@NS
@pytest.mark.parametrize("cli,host,key", [("docker", "docker:vllm-0", "vllm-0"),
                                          ("kubectl", "k8s:serving/vllm-0/engine", "serving.vllm-0.engine")])
def test_docker_and_kubectl_forms_reach_the_container_through_their_cli(box, tmp_path, monkeypatch, cli, host, key):
    """An executable named as the runtime's CLI, first on PATH, that enters the box by the name it is given: the
    argv debugagent sends is one it parses, and the command runs inside."""
    bin_ = tmp_path / "bin"
    names = tmp_path / "names"
    bin_.mkdir()
    names.mkdir()
    (names / key).write_text(str(box.pid))
    (bin_ / cli).write_text(STAND_IN.format(cli=cli, parse=PARSE[cli], names=names))
    (bin_ / cli).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    with open_transport(host) as t:
        r = t.run("hostname")
        assert r.stdout == "inside-box\n" and r.host == host


# ---------------------------------------------------------------- each way in that fails, with its fix
class AsNobody(LocalTransport):
    """This machine, each command run as the user `nobody` (setpriv): a session that may not enter the box."""

    def run(self, command: str, **kw):
        return super().run(f"exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c {shlex.quote(command)}", **kw)


@NS
def test_no_such_process_is_exit_2_and_no_permission_exit_4(box, tmp_path):
    """nsenter into a pid that is gone: exit 2 naming it; as a user who may not enter the box: exit 4, run as root.
    The box is as found (its /tmp, its processes)."""
    before = (box.tmp(), sorted(box_cmdlines(box)))
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(UsageError) as e:
        open_transport(f"nsenter:{gone.pid}")
    assert e.value.exit_code == 2 and "no such process" in e.value.message and e.value.fix
    with pytest.raises(TransportError) as e4:
        ContainerTransport(parse_target(f"nsenter:{box.pid}"), AsNobody())
    assert e4.value.exit_code == 4 and "no permission" in e4.value.message, e4.value.message
    assert "run debugagent as root" in str(e4.value.fix)
    assert (box.tmp(), sorted(box_cmdlines(box))) == before


def test_a_runtime_cli_not_installed_is_exit_4_naming_it(tmp_path, monkeypatch):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "sh", "env"):   # a PATH with a shell and nothing of any runtime
        os.symlink(shutil.which(tool) or f"/bin/{tool}", bare / tool)
    monkeypatch.setenv("PATH", str(bare))
    for host, cli in (("podman:vllm", "podman"), ("k8s:serving/vllm-0", "kubectl"), ("docker:vllm", "docker")):
        with pytest.raises(TransportError) as e:
            open_transport(host)
        assert e.value.exit_code == 4 and f"`{cli}` is not installed on this machine" in e.value.message
        assert "install" in str(e.value.fix)


@pytest.mark.skipif(not shutil.which("docker"), reason="needs Docker's CLI (its daemon is not needed)")
def test_docker_without_its_daemon_is_exit_4_saying_start_it(tmp_path):
    """Docker's real CLI with no daemon behind it (this machine's case)."""
    if subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True).returncode == 0:
        pytest.skip("a Docker daemon answers here")
    with pytest.raises(TransportError) as e:
        open_transport("docker:vllm")
    assert e.value.exit_code == 4 and "cannot reach its daemon" in e.value.message and "systemctl start docker" in str(e.value.fix)


@pytest.mark.skipif(not shutil.which("podman"), reason="needs podman's CLI")
def test_podman_no_such_container_is_exit_2_naming_how_to_list_them(tmp_path, monkeypatch):
    """podman's real CLI, in a store of this test's own: the container does not exist (exit 2 with the fix, before
    the run does anything on the host)."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    store = tmp_path / "storage.conf"
    store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path / "run"}"\ngraphroot = "{tmp_path / "graph"}"\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(store))
    with pytest.raises(UsageError) as e:
        open_transport("podman:no-such-server")
    assert e.value.exit_code == 2 and "no such running container" in e.value.message
    assert "podman ps --format" in str(e.value.fix)


# ---------------------------------------------------------------- an experiment on a container's main process
PODMAN_STAND_IN = r"""#!/bin/sh
# podman: `exec` enters this test's box (its pid 1 is the server); anything else is the real podman, in a store of the
# test's own that holds a container of the same name and command line (created, not started)
if [ "$1" = exec ]; then
    shift 2; name=$1; shift
    exec nsenter --target "$(cat "{names}/$name")" --mount --uts --ipc --net --pid --root --wd -- "$@"
fi
exec /usr/bin/podman "$@"
"""


@NS
@pytest.mark.parametrize("runtime", ["podman", "k8s"])
def test_a_changed_flag_of_a_container_main_process_is_refused_with_the_commands(tmp_path, monkeypatch, runtime):
    """The server is its container's pid 1 (a box of real namespaces, entered by the runtime's exec): the experiment that
    restarts it without --disable-cuda-graph is refused before anything changes, with the commands that would test it:
    for podman a new container from the real `podman inspect` with only the flag gone, and the undo that puts the very
    container back; for a pod, its Deployment's patch and rollout. The server is as found."""
    if runtime == "podman" and not Path("/usr/bin/podman").is_file():
        pytest.skip("needs podman's CLI (for `podman inspect`; creating a container needs no runtime)")
    from debugagent.agent.lab.server import LabSetup, Server, ServerRun
    from debugagent.tools.discovery import DiscoveryInput
    from debugagent.tools.registry import Runner

    from tests.realhost.conftest import Host
    from tests.realhost.container import server_box
    h = Host(dir=tmp_path / "h")
    h.dir.mkdir()
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    h.flags = ["--disable-cuda-graph"]
    b = server_box(tmp_path, h)
    try:
        bin_, names = tmp_path / "bin", tmp_path / "names"
        bin_.mkdir()
        names.mkdir()
        if runtime == "podman":
            (names / "srv").write_text(str(b.pid))
            (bin_ / "podman").write_text(PODMAN_STAND_IN.format(names=names))
            (bin_ / "podman").chmod(0o755)
            conf, store = tmp_path / "containers.conf", tmp_path / "storage.conf"
            conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
            store.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path / "prun"}"\ngraphroot = "{tmp_path / "graph"}"\n')
            monkeypatch.setenv("CONTAINERS_CONF", str(conf))
            monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(store))
            (tmp_path / "rootfs").mkdir()
            tar = subprocess.run(["tar", "-C", str(tmp_path / "rootfs"), "-c", "."], capture_output=True, check=True).stdout
            subprocess.run(["podman", "import", "-", "localhost/infer:1"], input=tar, capture_output=True, check=True,
                           timeout=120)
            subprocess.run(["podman", "create", "--name", "srv", "--network", "host", "--entrypoint", h.argv()[0],
                            "localhost/infer:1", *h.argv()[1:]], capture_output=True, check=True, timeout=120)
            host = "podman:srv"
        else:
            (names / "serving.vllm-7d9f8b6c5-x2kqp.engine").write_text(str(b.pid))
            (bin_ / "kubectl").write_text(STAND_IN.format(cli="kubectl", parse=PARSE["kubectl"], names=names))
            (bin_ / "kubectl").chmod(0o755)
            host = "k8s:serving/vllm-7d9f8b6c5-x2kqp/engine"
        monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
        before = proc_state_of(b.pid)
        undo: list = []
        with open_transport(host) as t:
            r = Runner(t)
            server = Server(LabSetup(server_pattern=h.pattern), "run1", lambda *a, **k: None, 30.0,
                            DiscoveryInput(server_pattern=h.pattern), lambda *a: undo.append(a), lambda: None)
            srv = server.find(r)
            assert srv.pid == 1
            run = ServerRun(argv=[a for a in srv.argv if a != "--disable-cuda-graph"], cwd=srv.cwd)
            from debugagent.agent.lab.errors import ExperimentError
            with pytest.raises(ExperimentError) as e:
                server.start(r, srv, run, "without --disable-cuda-graph")
        text = str(e.value)
        assert undo == [] and proc_state_of(b.pid) == before and b.proc.poll() is None
        if runtime == "podman":
            run_cmd = next(c for c in text.split("`") if c.startswith("podman run -d"))
            words = shlex.split(run_cmd)
            assert words[:5] == ["podman", "run", "-d", "--name", "srv"] and "--disable-cuda-graph" not in words
            assert words[words.index("localhost/infer:1") + 1:] == h.argv()[1:-1] and "--network" in words
            assert "`podman stop srv`; `podman rename srv srv.debugagent-found`" in text
            assert "`podman rm -f srv`; `podman rename srv.debugagent-found srv`; `podman start srv`" in text
        else:
            assert "never changed by debugagent" in text and "patch deployment/vllm" in text
            assert "--disable-cuda-graph" not in text.split("patch deployment/vllm")[1].split("`")[0]
            assert "`kubectl -n serving rollout undo deployment/vllm`" in text
    finally:
        b.stop()


def proc_state_of(pid: int) -> tuple:
    p = Path(f"/proc/{pid}")
    return p.joinpath("cmdline").read_bytes(), p.joinpath("environ").read_bytes(), os.readlink(p / "cwd")


class APIServer:
    """A Kubernetes API server of one empty namespace on 127.0.0.1 (plain HTTP, any port): discovery answers, and
    every pod is NotFound, as the real API server says it (a `Status` object, 404)."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.paths: list[str] = []
        paths = self.paths

        class H(BaseHTTPRequestHandler):
            def do_GET(self):   # noqa: N802
                paths.append(self.path)
                p = self.path.split("?")[0]
                if p == "/api":
                    code, body = 200, {"kind": "APIVersions", "versions": ["v1"],
                                       "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}
                elif p == "/api/v1":
                    code, body = 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
                         "verbs": ["get", "list"], "shortNames": ["po"]},
                        {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions",
                         "verbs": ["create", "get"]}]}
                elif p == "/apis":
                    code, body = 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
                else:
                    name = p.rsplit("/", 1)[-1]
                    code, body = 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": f'pods "{name}" not found', "reason": "NotFound",
                                       "details": {"name": name, "kind": "pods"}, "code": 404}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET   # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.skipif(not shutil.which("kubectl"), reason="needs kubectl")
def test_a_pod_that_does_not_exist_is_exit_2_naming_how_to_list_the_pods(tmp_path, monkeypatch):
    """The real kubectl, its kubeconfig pointing at an API server on 127.0.0.1 where the pod does not exist: exit 2
    with `kubectl get pods -n NS` as the fix, before anything runs; and with no API server answering, exit 4."""
    api = APIServer()
    try:
        conf = tmp_path / "kubeconfig"
        conf.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{api.port}\n"
                        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\n"
                        "current-context: c\n")
        monkeypatch.setenv("KUBECONFIG", str(conf))
        monkeypatch.setenv("HOME", str(tmp_path))   # kubectl's discovery cache: the test's own
        with pytest.raises(UsageError) as e:
            open_transport("k8s:serving/vllm-0")
        assert e.value.exit_code == 2 and "no such pod or container" in e.value.message, e.value.message
        assert "kubectl get pods -n serving" in str(e.value.fix)
        assert any("/namespaces/serving/pods/vllm-0" in p for p in api.paths)
        assert not any("exec" in p for p in api.paths)   # nothing was run in a pod
    finally:
        api.close()
    with pytest.raises(TransportError) as e4:   # the same kubeconfig, nothing listening there now
        open_transport("k8s:serving/vllm-0")
    assert e4.value.exit_code == 4 and "cannot reach its cluster" in e4.value.message, e4.value.message
