"""A real host on 127.0.0.1 for the experiments: no simulator.

A small HTTP inference server (stdlib) whose per-request cost comes from its code
(``infer/model.py``, a git history), its flags (``--disable-cuda-graph``, ``--attention-backend``, whose default
its engine version chooses and reports as SGLang does: its endpoints and start-up lines), its environment
(``CUDA_LAUNCH_BLOCKING``) and a compiled extension (``fastmod``, two builds of one
version, wheels assembled here from gcc output); a benchmark client; ``debugagent run
--host local`` as a subprocess; and a record of everything a run must leave as found.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATTERN = r"-m infer\.serve"   # every test's server; a run is given its own server's (``Host.pattern``)

SERVE = '''"""A tiny inference server: each /generate request costs what its code, flags, environment and extension say.

It answers as SGLang does about itself: /server_info (and the deprecated /get_server_info) with the attention
backend it runs, /model_info (/get_model_info), /health, no /metrics (404: metrics off); and it logs SGLang's start-up
lines: the backend it chose when --attention-backend is not given, its ServerArgs."""
import argparse, json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

from infer import model

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--tag", default="")
ap.add_argument("--disable-cuda-graph", action="store_true")
ap.add_argument("--attention-backend", default=None)
a = ap.parse_args()
backend = a.attention_backend or getattr(model, "DEFAULT_BACKEND", "flashinfer")
cost_ms = model.step_ms() + (getattr(model, "FLAG_MS", 20.0) if a.disable_cuda_graph else 0.0) + (getattr(model, "ENV_MS", 20.0) if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else 0.0)
cost_ms += getattr(model, "BACKEND_MS", {}).get(backend, 0.0)
stamp = time.strftime("[%Y-%m-%d %H:%M:%S]")
if a.attention_backend is None:
    print(f"{stamp} INFO server_args.py:1970: Attention backend not specified. Use {backend} backend by default.", flush=True)
ARGS = {"model_path": "infer", "port": a.port, "tp_size": 1, "attention_backend": backend,
        "disable_cuda_graph": a.disable_cuda_graph, "enable_metrics": False}
print(f"{stamp} INFO engine.py:157: server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in ARGS.items()) + ")",
      flush=True)
INFO = {**ARGS, "version": getattr(model, "VERSION", "0.0.0"),
        "internal_states": [{"attention_backend": backend, "last_gen_throughput": 0.0}]}
try:
    import fastmod
    kernel = fastmod.step
except ImportError:
    kernel = lambda: None


time.sleep(getattr(model, "START_S", 0.0))   # loading weights, warming up: a while before it listens
# a start that comes up slow (as the H200 lab's server came up in its slow mode at some starts): the first start
# after the file SLOW_START names appears, which it takes away
slow_start = getattr(model, "SLOW_START", "")
if slow_start and os.path.exists(slow_start):
    os.remove(slow_start)
    cost_ms += getattr(model, "SLOW_START_MS", 40.0)
slow_after = getattr(model, "SLOW_AFTER", 0)   # a server that slows down once it has served that many requests
served = 0


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        global served
        if self.path == "/generate":
            served += 1
            time.sleep((cost_ms + (12.0 if slow_after and served > slow_after else 0.0)) / 1000.0)
            kernel()
        body = b"ok"
        if self.path in ("/server_info", "/get_server_info"):
            body = json.dumps(INFO).encode()
        elif self.path in ("/model_info", "/get_model_info"):
            body = json.dumps({"model_path": "infer", "is_generation": True}).encode()
        elif self.path not in ("/generate", "/health", "/"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


srv = HTTPServer(("127.0.0.1", a.port), H)
print(f"server ready on port {a.port}", flush=True)
srv.serve_forever()
'''

BENCH = '''"""Benchmark client: the median latency of N requests to the server."""
import http.client, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 7
lat = []
for _ in range(n):
    t = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/generate")
        c.getresponse().read()
        c.close()
    except OSError as e:
        print(f"error: cannot reach the server on port {port}: {e}", file=sys.stderr)
        sys.exit(1)
    lat.append((time.perf_counter() - t) * 1000)
print(f"latency={statistics.median(lat):.3f} ms")
'''

MODEL = '''"""The model's step: what one request costs."""
STEP_MS = {step}
EXTRA_MS = {extra}
SLOW_AFTER = {slow_after}
FLAG_MS = {flag_ms}
ENV_MS = {env_ms}
START_S = {start_s}
DEFAULT_BACKEND = {default_backend!r}   # the attention backend this engine chooses when no flag sets it
BACKEND_MS = {backend_ms!r}             # what a request costs more with a backend
VERSION = {version!r}
SLOW_START = {slow_start!r}   # a file whose presence makes the next start slow by SLOW_START_MS (taken away then)
SLOW_START_MS = 40.0


def step_ms():
    return STEP_MS + EXTRA_MS
'''

FASTMOD_C = r'''
#include <Python.h>
#include <unistd.h>
static PyObject *step(PyObject *self, PyObject *args) {
    Py_BEGIN_ALLOW_THREADS
    usleep(DELAY_US);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
static PyMethodDef M[] = {{"step", step, METH_NOARGS, "one kernel launch"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, M};
PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&D); }
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
           "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


def build_wheel(out_dir: Path, work: Path, delay_us: int, version: str = "1.0") -> Path:
    """A real wheel of ``fastmod`` whose compiled ``step()`` sleeps ``delay_us``: gcc, then the wheel's zip by hand."""
    work.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = work / "fast.c"
    src.write_text(FASTMOD_C)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    so = work / f"_fast{suffix}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", f"-DDELAY_US={delay_us}", f"-I{sysconfig.get_paths()['include']}",
                    str(src), "-o", str(so)], check=True, capture_output=True)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    dist = f"fastmod-{version}.dist-info"
    files = {
        "fastmod/__init__.py": b"from ._fast import step\n",
        f"fastmod/_fast{suffix}": so.read_bytes(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: fastmod\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: debugagent-tests\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-linux_x86_64\n".encode(),
        f"{dist}/top_level.txt": b"fastmod\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    whl = out_dir / f"fastmod-{version}-{tag}-{tag}-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return whl


def make_venv(path: Path, pip: bool = True) -> Path:
    """A venv of its own, with pip if asked (copied from this one's: ensurepip takes ~15 s on a loaded machine)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    if not pip:
        return path / "bin" / "python"
    here = Path(sysconfig.get_paths()["purelib"])
    site = next((path / "lib").glob("python3*/site-packages"))
    shutil.copytree(here / "pip", site / "pip")
    info = next(here.glob("pip-*.dist-info"))
    shutil.copytree(info, site / info.name)
    return path / "bin" / "python"


def proc_state(pid: int) -> dict:
    p = Path(f"/proc/{pid}")
    env = dict(kv.split("=", 1) for kv in p.joinpath("environ").read_bytes().decode().split("\0") if "=" in kv)
    return {"argv": p.joinpath("cmdline").read_bytes().decode().split("\0")[:-1], "env": env, "cwd": os.readlink(p / "cwd")}


def pids_with(tag: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if tag.encode() in p.joinpath("cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return sorted(out)


@dataclass
class Host:
    """One real host in a temporary folder: a server, its checkout or venv, the benchmark."""

    dir: Path
    port: int = field(default_factory=free_port)
    python: str = sys.executable
    cwd: Path | None = None
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    supervisor: subprocess.Popen | None = None

    @property
    def tag(self) -> str:
        return f"rh-{self.dir.name}-{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def argv(self) -> list[str]:
        return [self.python, "-m", "infer.serve", "--port", str(self.port), "--tag", self.tag, *self.flags]

    def server_env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.dir), "LANG": "C.UTF-8", **self.env}

    @property
    def pattern(self) -> str:
        """This test's server alone: tests run side by side, each with a server of the same code (``--port`` is a
        flag no experiment reverts, so the pattern still finds the server each experiment restarts)."""
        return rf"-m infer\.serve --port {self.port}( |$)"

    def bench_cmd(self) -> str:
        return f"{sys.executable} {self.dir / 'bench.py'} {self.port}"

    def write_code(self, folder: Path, step: float = 10.0, extra: float = 0.0, slow_after: int = 0,
                   flag_ms: float = 20.0, start_s: float = 0.0, env_ms: float = 20.0, default_backend: str = "flashinfer",
                   backend_ms: dict[str, float] | None = None, version: str = "0.5.5", slow_start: str = "") -> None:
        (folder / "infer").mkdir(parents=True, exist_ok=True)
        (folder / "infer" / "__init__.py").write_text("")
        (folder / "infer" / "serve.py").write_text(SERVE)
        (folder / "infer" / "model.py").write_text(MODEL.format(step=step, extra=extra, slow_after=slow_after,
                                                                          flag_ms=flag_ms, env_ms=env_ms, start_s=start_s,
                                                                          default_backend=default_backend,
                                                                          backend_ms=backend_ms or {}, version=version,
                                                                          slow_start=slow_start))

    def start(self) -> None:
        (self.dir / "bench.py").write_text(BENCH)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), cwd=self.cwd, env=self.server_env(), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready()

    def start_supervised(self) -> None:
        """The server under a supervisor-like parent: a script named ``supervisord`` that starts the command line in
        ``supervised.cmd`` again whenever the server exits (its pid in ``supervised.pid``)."""
        (self.dir / "bench.py").write_text(BENCH)
        sup = self.dir / "supervisord"
        self.cmd_file.write_text("exec " + " ".join(shlex.quote(a) for a in self.argv()) + "\n")
        # the child notes its own pid before it execs the server (the file never names a server already gone), and
        # bash's own ``_`` is kept out of the server's environment, as a real supervisor's would be
        sup.write_text(f"#!/bin/bash\ncd '{self.cwd}'\nwhile true; do (echo $BASHPID > '{self.dir / 'supervised.pid'}'; "
                       f"c=$(cat '{self.cmd_file}'); eval \"exec env -u _ ${{c#exec }}\") >> '{self.log}' 2>&1 < /dev/null & wait $!; sleep 0.2; done\n")
        sup.chmod(0o755)
        self.supervisor = subprocess.Popen([str(sup)], env=self.server_env(), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready()

    @property
    def cmd_file(self) -> Path:
        return self.dir / "supervised.cmd"

    def hook(self) -> str:
        """A restart hook for the supervisor: the command line to run next, then stop the server and wait until the
        supervisor has started the next one (as ``systemctl restart`` returns once the unit is started again)."""
        pf = shlex.quote(str(self.dir / 'supervised.pid'))
        return (f"old=$(cat {pf}) && printf 'exec %s\\n' \"$DEBUGAGENT_ARGV\" > {shlex.quote(str(self.cmd_file))} && "
                f"kill $old && for i in $(seq 1 200); do [ \"$(cat {pf})\" != \"$old\" ] && exit 0; sleep 0.05; done; exit 1")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.bench_once() is not None:
                return
            time.sleep(0.1)
        raise AssertionError(f"the test server did not start; log: {self.log.read_text()[-500:]}")

    def bench_once(self) -> float | None:
        r = subprocess.run(self.bench_cmd(), shell=True, capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return float(r.stdout.split("=")[1].split()[0])

    def baseline(self, n: int = 5) -> float:
        vals = [v for v in (self.bench_once() for _ in range(n)) if v is not None]
        return sorted(vals)[len(vals) // 2]

    def stop(self) -> None:
        for p in pids_with(self.tag):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            self.proc.wait(timeout=10)

    def server_pid(self) -> int:
        pids = [p for p in pids_with(self.tag) if "infer.serve" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        assert len(pids) == 1, f"expected one server, found {pids}"
        return pids[0]

    def restart(self) -> None:
        """Stop the server and start it again, as an operator would after an upgrade."""
        pid = self.server_pid()
        os.kill(pid, signal.SIGTERM)
        if self.proc and self.proc.pid == pid:
            self.proc.wait(timeout=10)
        self.start()

    def run(self, *args: str, out: Path, timeout: float = 240, env: dict[str, str] | None = None) -> dict:
        """``debugagent run --host local … --allow-mutations --json`` as a subprocess; its JSON and run id."""
        cli = Path(sys.executable).parent / "debugagent"
        argv = [str(cli) if cli.exists() else sys.executable, *([] if cli.exists() else ["-m", "debugagent.agent.cli"]),
                "run", "--host", "local", "--server-pattern", self.pattern, "--bench", self.bench_cmd(), "--allow-mutations",
                "--json", "--out", str(out), "--ready-timeout", "60", *args]
        started = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.dir, env={**os.environ, **(env or {})})
        assert r.stdout.strip().startswith("{"), f"exit {r.returncode}; stderr: {r.stderr[-3000:]}"
        o = json.loads(r.stdout)
        o["exit"] = r.returncode
        # a run that stopped before it made its folder says why in its JSON: shown, not a bare FileNotFoundError
        assert (out / "run.json").is_file(), f"exit {r.returncode}, no run.json; stdout: {r.stdout[:2000]}; " \
                                             f"stderr: {r.stderr[-2000:]}"
        o["run_id"] = json.loads((out / "run.json").read_text())["run_id"]
        o["wall"] = time.monotonic() - started
        o["events"] = [json.loads(line) for line in (out / "events.jsonl").read_text().split("\n") if line]  # JSON Lines: "\n" alone ends a line
        return o


def code_history(h: Host, repo: Path, upstream: list[tuple[str, float, str | None]]) -> str:
    """``repo``: a checkout of ``h``'s server, its first commit (returned) on ``main`` and, on a branch ``upstream``
    one commit per ``(subject, extra_ms, note)``: the model's step costs ``extra_ms`` more from there on, and a note
    names a ``NOTES-note.md`` the commit adds (None: the code alone changes). Leaves ``main`` checked out: a pull
    (``git merge --ff-only upstream``) brings the history in."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    h.write_code(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "Serve /generate")
    good = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "upstream")
    for subject, extra, note in upstream:
        h.write_code(repo, 10.0, extra)
        if note:
            (repo / f"NOTES-{note}.md").write_text(subject + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    git(repo, "checkout", "-q", "main")
    return good


def site_state(python: str) -> dict[str, str]:
    """Every installed file of ``python``'s environment with a hash: what 'installed packages as found' means."""
    r = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                       text=True, check=True)
    site = Path(r.stdout.strip())
    out = {}
    for p in sorted(site.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and not p.is_relative_to(site / "pip"):
            out[str(p.relative_to(site))] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return out


def tmp_leftovers(run_id: str) -> list[str]:
    """What a run left in /tmp: every name there that carries its run id."""
    return sorted(n for n in os.listdir("/tmp") if run_id in n)


@pytest.fixture
def realhost(tmp_path):
    """A Host in a fresh temporary folder; every process it started is killed afterwards."""
    hosts: list[Host] = []

    def make(name: str, pip: bool = False) -> Host:
        d = tmp_path / name
        d.mkdir()
        h = Host(dir=d, python=str(make_venv(d / "venv", pip)))
        hosts.append(h)
        return h

    yield make
    for h in hosts:
        if h.supervisor:
            h.supervisor.kill()
            h.supervisor.wait(timeout=10)
        h.stop()
