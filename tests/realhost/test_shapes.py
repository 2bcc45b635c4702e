"""Hosts as users run them, for real: a console-script server with a worker process installed from a wheel into a
venv's site-packages, and a server run by a real supervisord (the ``supervisor`` package, on a unix socket in the
test's folder). Each is found as what it is, diagnosed, and left exactly as found."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Host, git, pids_with, proc_state, tmp_leftovers
from .test_experiments import report, same_but_pid, tools_called

pytestmark = pytest.mark.slow

# each of these takes 60-90 s on a loaded 2-core machine: beyond what the suite's time allows, so run by hand
LONG = pytest.mark.skipif(os.environ.get("DEBUGAGENT_TEST_LONG") != "1", reason="60-90 s each on a loaded 2-core "
                          "machine: DEBUGAGENT_TEST_LONG=1 runs it (its logic is tested in tests/test_shapes.py)")

# An API process that serves HTTP and a worker (multiprocessing, forked after the port is bound, as engines fork
# theirs) that does each request's work. The worker notices its parent is gone only at its next heartbeat (20 s),
# as a GPU worker finishing its step does: stopping only the API process leaves the worker holding the port.
CLI = '''"""inferd: a small inference server with one worker process."""
import argparse, multiprocessing as mp, os, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer


def worker(conn, flag_ms):
    cost = 10.0 + flag_ms + (20.0 if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else 0.0)
    parent, beat = os.getppid(), time.monotonic()
    while True:
        try:
            if conn.poll(0.2):
                conn.recv()
                time.sleep(cost / 1000.0)
                conn.send(b"ok")
        except (EOFError, OSError):
            time.sleep(0.2)
        if time.monotonic() - beat > 20:
            beat = time.monotonic()
            if os.getppid() != parent:
                return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tag", default="")
    ap.add_argument("--disable-cuda-graph", action="store_true")
    a = ap.parse_args()
    lock = threading.Lock()
    mine, theirs = mp.Pipe()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/generate":
                with lock:
                    mine.send(1)
                    mine.recv()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    srv = HTTPServer(("127.0.0.1", a.port), H)
    mp.get_context("fork").Process(target=worker, args=(theirs, 20.0 if a.disable_cuda_graph else 0.0)).start()
    print(f"server ready on port {a.port}", flush=True)
    srv.serve_forever()
'''


def pure_wheel(out: Path, name: str, version: str, files: dict[str, str], scripts: dict[str, str]) -> Path:
    """A pure-Python wheel (its RECORD hashed, its console scripts in entry_points.txt), for pip to install."""
    dist = f"{name}-{version}.dist-info"
    data = {k: v.encode() for k, v in files.items()}
    data[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    data[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: debugagent-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    data[f"{dist}/entry_points.txt"] = ("[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())).encode()
    data[f"{dist}/top_level.txt"] = (name + "\n").encode()
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
              for k, v in data.items()]
    data[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    whl = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for k, v in data.items():
            z.writestr(k, v)
    return whl


@dataclass
class ConsoleHost(Host):
    """The server is ``VENV/bin/inferd …``, a console script pip made from the wheel's entry point."""

    def argv(self) -> list[str]:
        return [str(Path(self.python).parent / "inferd"), "--port", str(self.port), "--tag", self.tag, *self.flags]

    @property
    def pattern(self) -> str:
        return rf"bin/inferd --port {self.port}( |$)"

    def server_pid(self) -> int:
        tagged = pids_with(self.tag)
        roots = [p for p in tagged if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) not in tagged]
        assert len(roots) == 1, f"expected one server tree, found roots {roots}"
        return roots[0]

    def restart(self) -> None:
        """The whole tree stopped, then started again (as the operator's tooling does)."""
        self.stop()
        self.start()


def tree_state(h: Host) -> dict:
    """The server tree: its root's command line, environment and folder, and how many processes run under it."""
    pid = h.server_pid()
    return {"pid": pid, **proc_state(pid), "workers": len(pids_with(h.tag)) - 1}


def install_console_server(h: ConsoleHost) -> Path:
    """inferd 1.0 built as a wheel and installed by pip into the host's venv (site-packages, not editable)."""
    whl = pure_wheel(h.dir / "wheels", "inferd", "1.0", {"inferd/__init__.py": "", "inferd/cli.py": CLI},
                     {"inferd": "inferd.cli:main"})
    subprocess.run([h.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    str(whl)], check=True)
    return whl


def test_console_script_with_a_worker_from_site_packages(tmp_path):
    """`inferd` (a console script from a wheel in a venv's site-packages) and its forked worker: discovery says
    so; the flag and the variable are each measured by restarting the whole tree (a worker left behind would hold
    the port), and the tree is as found afterwards."""
    from .conftest import make_venv
    d = tmp_path / "console"
    d.mkdir()
    h = ConsoleHost(dir=d, python=str(make_venv(d / "venv", pip=True)))
    try:
        install_console_server(h)
        h.cwd = d
        h.start()
        base = h.baseline()
        h.flags = ["--disable-cuda-graph"]
        h.env = {"CUDA_LAUNCH_BLOCKING": "1"}
        h.restart()
        _wait_one_tree(h)
        bad = h.baseline(3)
        before = tree_state(h)
        assert before["workers"] == 1

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", out=tmp_path / "run")
        report(o, "console script")

        server = o["server"]
        shape = server["shape"]
        assert shape["launcher"] == "console_script" and shape["command"] == "inferd" and shape["module"] == "inferd.cli"
        assert shape["layout"] == "venv" and shape["engine"]["how"] == "site-packages"
        assert shape["engine"]["distribution"] == "inferd" and shape["engine"]["version"] == "1.0"
        assert len(server["workers"]) == 1
        md = (tmp_path / "run" / "transcript.md").read_text()
        assert "launched as the console script `inferd` (module `inferd.cli`)" in md and "site-packages (installed" in md

        causes = {c["hypothesis"]: c for c in o["root_causes"]}
        assert o["exit"] == 0, o["summary"]
        assert set(causes) == {"serving_config", "env_var"}, o["summary"]
        assert all(c["how"] == "experiment" and 0.25 < c["explains"] < 0.95 for c in causes.values())
        restarts = tools_called(o, "restart_server")
        assert restarts and all(i.get("ports") == [h.port] for i in restarts)
        h.wait_ready()
        _wait_one_tree(h)
        after = tree_state(h)
        assert same_but_pid(before, after) and "--disable-cuda-graph" in after["argv"]
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        h.stop()


def editable_checkout(h: ConsoleHost) -> Path:
    """inferd as a git checkout (a good commit, then one that makes the worker sync after each request, then an
    unrelated one), installed editable into the host's venv as setuptools' PEP 660 wheel does it: pip installs a
    ``__editable__.inferd-1.0.pth`` naming the checkout, the console script, and ``direct_url.json`` saying editable."""
    repo = h.dir / "inferd-src"
    (repo / "inferd").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "inferd" / "__init__.py").write_text("")
    (repo / "inferd" / "cli.py").write_text(CLI)
    (repo / "README.md").write_text("inferd\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "Serve /generate from a worker process")
    for subject, edit in [("Sync the worker after each request", lambda: (repo / "inferd" / "cli.py").write_text(
                              CLI.replace("cost = 10.0 +", "cost = 30.0 +"))),
                          ("Update the README", lambda: (repo / "README.md").write_text("inferd: a small server\n"))]:
        edit()
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    dist = "inferd-1.0.dist-info"
    whl = pure_wheel(h.dir / "wheels", "inferd", "1.0", {"__editable__.inferd-1.0.pth": f"{repo}\n",
                     f"{dist}/direct_url.json": f'{{"url": "file://{repo}", "dir_info": {{"editable": true}}}}'},
                     {"inferd": "inferd.cli:main"})
    subprocess.run([h.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    str(whl)], check=True)
    return repo


@LONG
def test_console_script_code_regression_from_an_editable_checkout(tmp_path):
    """`inferd` installed editable from a git checkout whose HEAD is two commits past a slow one: the code experiment
    reverts in a worktree and restarts the whole tree (API process and worker) from it, bisects to the commit, and
    leaves the tree, HEAD, the worktrees and the venv's packages as found."""
    from .conftest import make_venv, site_state
    d = tmp_path / "console-code"
    d.mkdir()
    h = ConsoleHost(dir=d, python=str(make_venv(d / "venv", pip=True)))
    try:
        repo = editable_checkout(h)
        h.cwd = d
        git(repo, "checkout", "-q", "HEAD~2")   # the good commit, as it ran before the pull
        h.start()
        base = h.baseline()
        git(repo, "checkout", "-q", "main")
        h.restart()
        _wait_one_tree(h)
        bad = h.baseline(3)
        assert bad > base + 10, (base, bad)
        before = {**tree_state(h), "head": git(repo, "rev-parse", "HEAD"), "worktrees": git(repo, "worktree", "list"),
                  "site": site_state(h.python)}

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", "--repo", str(repo),
                  out=tmp_path / "run")
        report(o, "console script, code")

        shape = o["server"]["shape"]
        assert shape["launcher"] == "console_script" and shape["engine"]["how"] == "editable", shape
        assert o["exit"] == 0, o["summary"]
        cause = o["root_cause"]
        assert cause["hypothesis"] == "code_change" and cause["how"] == "experiment", o["summary"]
        assert "Sync the worker after each request" in cause["summary"], cause["summary"]
        starts = [i for i in tools_called(o, "restart_server") if i.get("pid_file")]
        assert starts and all(i["cwd"] == str(d) and i["path_first"] and i["path_first"][0].startswith("/tmp/debugagent-wt-")
                              and i.get("ports") == [h.port] for i in starts)
        h.wait_ready()
        _wait_one_tree(h)
        after = {**tree_state(h), "head": git(repo, "rev-parse", "HEAD"), "worktrees": git(repo, "worktree", "list"),
                 "site": site_state(h.python)}
        assert same_but_pid(before, after)
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        h.stop()


def _wait_one_tree(h: Host, timeout: float = 60) -> None:
    """Until the server's tree is one API process and its one worker (a restarted server forks its worker after
    it listens)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(pids_with(h.tag)) == 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"the server tree is {pids_with(h.tag)}")


# ---------------------------------------------------------------- supervisord
SUPERVISORD_CONF = """[unix_http_server]
file=%(here)s/supervisor.sock

[supervisord]
logfile=%(here)s/supervisord.log
pidfile=%(here)s/supervisord.pid
childlogdir=%(here)s
nodaemon=true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://%(here)s/supervisor.sock

[include]
files = conf.d/*.conf
"""

PROGRAM = """; the inference server
[program:infer]
command={command}
directory={directory}
environment={environment}
autorestart=true
startsecs=1
stopwaitsecs=10
redirect_stderr=true
stdout_logfile={log}
"""


@dataclass
class Supervised:
    dir: Path
    conf: Path
    program: Path
    proc: subprocess.Popen

    @property
    def ctl_path(self) -> Path:
        return Path(sys.executable).parent / "supervisorctl"

    def ctl(self, *args: str) -> str:
        r = subprocess.run([str(self.ctl_path), "-c", str(self.conf), *args], capture_output=True, text=True, timeout=60)
        return r.stdout

    def state(self) -> dict:
        st = self.program.stat()
        return {"bytes": self.program.read_bytes(), "mode": st.st_mode, "mtime": st.st_mtime_ns,
                "main": self.conf.read_bytes(), "status": self.ctl("status", "infer").split()[1]}


def start_supervisord(h: Host, command: list[str], env: dict[str, str]) -> Supervised:
    """A real supervisord (the ``supervisor`` package's, from this venv) in the host's folder, running ``command``
    as ``[program:infer]`` from ``conf.d/infer.conf``; waits until the server answers."""
    if not (Path(sys.executable).parent / "supervisord").exists():
        pytest.skip("the supervisor package is not installed (pip install -e '.[test]')")
    conf = h.dir / "supervisord.conf"
    conf.write_text(SUPERVISORD_CONF)
    (h.dir / "conf.d").mkdir()
    program = h.dir / "conf.d" / "infer.conf"
    environment = ",".join(f'{k}="{v}"' for k, v in env.items())
    program.write_text(PROGRAM.format(command=" ".join(command), directory=h.cwd, environment=environment, log=h.log))
    os.utime(program, (1_700_000_000, 1_700_000_000))   # an old file: a rewrite would show in its mtime
    proc = subprocess.Popen([str(Path(sys.executable).parent / "supervisord"), "-c", str(conf)],
                            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(h.dir), "LANG": "C.UTF-8"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    (h.dir / "bench.py").write_text(__import__("tests.realhost.conftest", fromlist=["BENCH"]).BENCH)
    h.wait_ready()
    return Supervised(dir=h.dir, conf=conf, program=program, proc=proc)


def test_supervisord_program_flag_and_env_through_supervisorctl(realhost, tmp_path):
    """A server that supervisord runs (real supervisord, real supervisorctl): --disable-cuda-graph and
    CUDA_LAUNCH_BLOCKING=1, set in its program section, are each measured by changing that section and
    `supervisorctl update`; the config is put back byte for byte and the program runs as found."""
    h = realhost("supd")
    h.cwd = h.dir / "srv"
    h.write_code(h.cwd)
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(h.dir), "LANG": "C.UTF-8"}
    sup = start_supervisord(h, h.argv(), base_env)
    try:
        base = h.baseline()
        # the operator's change: the flag and the variable in the program's section, applied by supervisorctl
        text = sup.program.read_text().replace(f"--tag {h.tag}", f"--tag {h.tag} --disable-cuda-graph").replace(
            "environment=", 'environment=CUDA_LAUNCH_BLOCKING="1",')
        sup.program.write_text(text)
        os.utime(sup.program, (1_700_000_000, 1_700_000_000))
        sup.ctl("reread")
        sup.ctl("update", "infer")
        old = h.server_pid
        h.wait_ready()
        bad = h.baseline(3)
        assert bad > base + 25, (base, bad)
        before, conf_before = {"pid": old(), **proc_state(old())}, sup.state()
        assert conf_before["status"] == "RUNNING" and before["env"]["CUDA_LAUNCH_BLOCKING"] == "1"

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", out=tmp_path / "run")
        report(o, "supervisord")

        shape = o["server"]["shape"]
        assert shape["supervisor"]["kind"] == "supervisord" and shape["supervisor"]["program"] == "infer"
        assert shape["supervisor"]["config"] == str(sup.conf) and shape["engine"]["how"] == "cwd"
        causes = {c["hypothesis"]: c for c in o["root_causes"]}
        assert o["exit"] == 0, o["summary"]
        assert set(causes) == {"serving_config", "env_var"}, o["summary"]
        assert all(c["how"] == "experiment" and 0.25 < c["explains"] < 0.95 for c in causes.values())
        applied = tools_called(o, "supervisor_apply")
        assert applied and not tools_called(o, "restart_server") and not tools_called(o, "restart_hook")
        assert all(a["file"] == str(sup.program) for a in applied)
        assert any("--disable-cuda-graph" not in a["values"].get("command", "--disable-cuda-graph") for a in applied)
        assert any("CUDA_LAUNCH_BLOCKING" not in a["values"].get("environment", "CUDA_LAUNCH_BLOCKING") for a in applied)
        # the journal named the restore before the config was touched
        kinds = [(e["event"], e.get("tool")) for e in o["events"] if e.get("tool") in ("supervisor_apply", "supervisor_restore")]
        assert kinds.index(("experiment", "supervisor_restore")) < kinds.index(("tool_call", "supervisor_apply"))
        md = (tmp_path / "run" / "transcript.md").read_text()
        fixes = md.split("## What to do now", 1)[-1].split("\n## ", 1)[0]
        assert f"{sup.ctl_path} -c {sup.conf} reread && {sup.ctl_path} -c {sup.conf} update infer" in fixes, fixes
        assert f"in {sup.program}, set in [program:infer]" in fixes and "kill " not in fixes, fixes
        h.wait_ready()
        after = proc_state(h.server_pid())
        assert same_but_pid(before, {"pid": 0, **after}) and "--disable-cuda-graph" in after["argv"]
        assert sup.state() == conf_before   # bytes, mode and mtime of the config, and RUNNING
        assert sup.proc.poll() is None
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        sup.proc.terminate()
        try:
            sup.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.proc.kill()
        shutil.rmtree(h.dir / "conf.d", ignore_errors=True)


@LONG
def test_supervisord_program_code_regression_is_bisected_through_supervisorctl(realhost, tmp_path):
    """A server that supervisord runs from a git checkout (its program's directory=): after a pull and a
    `supervisorctl restart`, it is slower by a commit two back from HEAD. The code experiment reverts in a worktree
    and restarts the program through supervisord (its section's directory= and PYTHONPATH pointing there), restarts it
    so per bisection step, names the commit, and leaves the config's bytes, HEAD, the worktrees and the program as
    found."""
    h = realhost("supcode")
    repo = h.dir / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    h.write_code(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "Serve /generate")
    git(repo, "checkout", "-q", "-b", "upstream")
    for subject, extra, note in [("Refactor argument parsing", 0.0, "args"),
                                 ("Batch the model step with a sync per token", 20.0, None),
                                 ("Update the README", 20.0, "readme")]:
        h.write_code(repo, 10.0, extra)
        if note:
            (repo / f"NOTES-{note}.md").write_text(subject + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    git(repo, "checkout", "-q", "main")
    h.cwd = repo
    sup = start_supervisord(h, h.argv(), {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(h.dir), "LANG": "C.UTF-8"})
    try:
        base = h.baseline()
        git(repo, "merge", "-q", "--ff-only", "upstream")   # a pull; then the operator restarts the program
        sup.ctl("restart", "infer")
        h.wait_ready()
        bad = h.baseline(3)
        assert bad > base + 10, (base, bad)
        before, conf_before = {"pid": h.server_pid(), **proc_state(h.server_pid())}, sup.state()
        head, worktrees = git(repo, "rev-parse", "HEAD"), git(repo, "worktree", "list", "--porcelain")

        o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", "--repo", str(repo),
                  out=tmp_path / "run")
        report(o, "supervisord, code")

        assert o["exit"] == 0, o["summary"]
        cause = o["root_cause"]
        assert cause["hypothesis"] == "code_change" and cause["how"] == "experiment", o["summary"]
        assert "Batch the model step with a sync per token" in cause["summary"], cause["summary"]
        applied = tools_called(o, "supervisor_apply")
        assert len(applied) >= 2 and not tools_called(o, "restart_server") and not tools_called(o, "restart_hook")
        first = applied[0]["values"]
        assert first["directory"].startswith("/tmp/debugagent-wt-") and "PYTHONPATH" in first["environment"]
        assert any(a.get("restart_only") for a in applied[1:])   # a bisection step: the program restarted again
        h.wait_ready()
        after = proc_state(h.server_pid())
        assert same_but_pid(before, {"pid": 0, **after})
        assert sup.state() == conf_before   # bytes, mode and mtime of the config, and RUNNING
        assert git(repo, "rev-parse", "HEAD") == head and git(repo, "worktree", "list", "--porcelain") == worktrees
        assert sup.proc.poll() is None
        assert tmp_leftovers(o["run_id"]) == []
    finally:
        sup.proc.terminate()
        try:
            sup.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.proc.kill()


# ---------------------------------------------------------------- a system Python (Debian's layout)
def system_python(root: Path) -> Path:
    """Debian's own python3 (this machine's /usr/bin/python3.X, copied) under a prefix of the test's own, its standard
    library that of /usr: its site configuration (Debian's site.py) puts PREFIX/local/lib/python3.X/dist-packages on
    sys.path, as /usr/local/lib/python3.X/dist-packages is for /usr/bin/python3; no venv."""
    real = Path(os.path.realpath("/usr/bin/python3"))
    ver = real.name.removeprefix("python")
    if not real.is_file() or not Path(f"/usr/lib/python{ver}/os.py").is_file():
        pytest.skip("needs Debian's /usr/bin/python3 and its standard library in /usr/lib")
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy2(real, root / "bin" / "python3")
    os.symlink(f"/usr/lib/python{ver}", root / "lib" / f"python{ver}")
    dist = root / "local" / "lib" / f"python{ver}" / "dist-packages"
    dist.mkdir(parents=True)
    r = subprocess.run([str(root / "bin" / "python3"), "-c", "import sys, sysconfig; print(sys.prefix); print(sys.path)"],
                       capture_output=True, text=True, cwd="/", check=True)
    if r.stdout.splitlines()[0] != str(root) or str(dist) not in r.stdout:
        pytest.skip(f"this python3 does not keep Debian's site layout under another prefix: {r.stdout[-300:]}")
    return dist


@LONG
def test_a_system_python_server_with_its_engine_in_dist_packages(realhost, tmp_path):
    """The server runs on a system Python (Debian's, no venv) whose engine lives in dist-packages, not in the checkout
    nor the cwd: server_shape says system Python and dist-packages; --disable-cuda-graph is found by restarting it with
    that interpreter; the server and every file of dist-packages are as found."""
    h = realhost("syspy")
    dist = system_python(h.dir / "python")
    h.python = str(h.dir / "python" / "bin" / "python3")
    h.write_code(dist)
    info = dist / "infer-0.5.5.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: infer\nVersion: 0.5.5\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "top_level.txt").write_text("infer\n")
    h.cwd = h.dir
    h.start()
    base = h.baseline()
    h.flags = ["--disable-cuda-graph"]
    h.restart()
    bad = h.baseline(3)
    assert bad > base + 10, (base, bad)

    def files() -> dict[str, str]:
        return {str(p.relative_to(dist)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dist.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts}
    before, packages = {"pid": h.server_pid(), **proc_state(h.server_pid())}, files()

    o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", out=tmp_path / "run")
    report(o, "system python")

    shape = o["server"]["shape"]
    assert shape["layout"] == "system" and shape["launcher"] == "module", shape
    assert shape["engine"]["how"] == "dist-packages" and shape["engine"]["root"] == str(dist), shape
    assert shape["engine"]["distribution"] == "infer" and shape["engine"]["version"] == "0.5.5"
    md = (tmp_path / "run" / "transcript.md").read_text()
    assert "by a system Python" in md and "dist-packages (a system-Python layout)" in md
    assert o["exit"] == 0, o["summary"]
    causes = {c["hypothesis"]: c for c in o["root_causes"]}
    assert "serving_config" in causes and causes["serving_config"]["how"] == "experiment", o["summary"]
    restarts = tools_called(o, "restart_server")
    assert restarts and all(i["argv"][0] == h.python for i in restarts)
    h.wait_ready()
    after = proc_state(h.server_pid())
    assert same_but_pid(before, {"pid": 0, **after}) and files() == packages
    assert tmp_leftovers(o["run_id"]) == []
