"""The host shapes of tests/realhost/test_shapes.py, shared with the fault suite (tests/realhost/faultsuite.py): a
console-script server with a forked worker installed from a wheel into a venv's site-packages, and a server run by
a real supervisord (the ``supervisor`` package, on a unix socket in the host's folder)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import BENCH, Host, pids_with, proc_state

# An API process that serves HTTP and a worker (multiprocessing, forked after the port is bound, as engines fork
# theirs) that does each request's work. The worker notices its parent is gone only at its next heartbeat (20 s),
# as a GPU worker finishing its step does: stopping only the API process leaves the worker holding the port.
CLI = '''"""inferd: a small inference server with one worker process."""
import argparse, multiprocessing as mp, os, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

FLAG_MS = 20.0   # what --disable-cuda-graph costs a request
ENV_MS = 20.0    # and CUDA_LAUNCH_BLOCKING=1


def worker(conn, flag_ms):
    cost = 10.0 + flag_ms + (ENV_MS if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else 0.0)
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
    mp.get_context("fork").Process(target=worker, args=(theirs, FLAG_MS if a.disable_cuda_graph else 0.0)).start()
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


def install_console_server(h: ConsoleHost, flag_ms: float = 20.0, env_ms: float = 20.0) -> Path:
    """inferd 1.0 built as a wheel and installed by pip into the host's venv (site-packages, not editable); the flag
    and the variable cost a request ``flag_ms`` and ``env_ms``."""
    cli = CLI.replace("FLAG_MS = 20.0", f"FLAG_MS = {float(flag_ms)!r}").replace("ENV_MS = 20.0", f"ENV_MS = {float(env_ms)!r}")
    whl = pure_wheel(h.dir / "wheels", "inferd", "1.0", {"inferd/__init__.py": "", "inferd/cli.py": cli},
                     {"inferd": "inferd.cli:main"})
    subprocess.run([h.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    str(whl)], check=True)
    return whl


def wait_one_tree(h: Host, timeout: float = 60) -> None:
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

    def stop(self) -> None:
        """supervisord stopped (its program with it), killed when it takes over 30 s."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

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
    (h.dir / "bench.py").write_text(BENCH)
    h.wait_ready()
    return Supervised(dir=h.dir, conf=conf, program=program, proc=proc)


def add_the_regression(h: Host, sup: Supervised) -> None:
    """The operator's change: --disable-cuda-graph and CUDA_LAUNCH_BLOCKING=1 in the program's section (the file's
    mtime kept old), applied by ``supervisorctl update``; returns once the new server answers."""
    text = sup.program.read_text().replace(f"--tag {h.tag}", f"--tag {h.tag} --disable-cuda-graph").replace(
        "environment=", 'environment=CUDA_LAUNCH_BLOCKING="1",')
    sup.program.write_text(text)
    os.utime(sup.program, (1_700_000_000, 1_700_000_000))
    sup.ctl("reread")
    sup.ctl("update", "infer")
    h.wait_ready()
