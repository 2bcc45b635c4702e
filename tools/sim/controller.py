"""The GPU service of a simulated host: the one place that knows the factors, outside the host.

It listens on a unix socket that the host sees at ``/run/nvidia-gpu/service.sock``. Programs
inside the host ask it for observations only:

- ``nvidia-smi ARGS``: what the GPUs report now (idle unless a benchmark is running, which
  the service knows because it runs the benchmark's workload itself), and ``-pl`` / ``-lgc``.
- the benchmark (``gpu-bench ARGS``): its workload (the flags it was given) against the
  inference server that runs now, measured with noise.
- ``up``: an inference server (or its worker) tells what it imported when it started; the
  connection stays open for the process's life, so the service knows what runs.

What a server runs is what it imported when it started: its code's newest change and the
sha256 of each compiled dependency it loaded. The service maps those back to the
scenario's labels; nothing inside the host holds the mapping.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..host import parse_flags
from ..units import unit_kind
from . import serving
from .scenario import Factor, Scenario
from .standin import nvsmi, so_bytes


@dataclass
class Proc:
    """A server or worker process as it registered: host pid, real pid, what it imported."""

    role: str
    pid: int
    real_pid: int
    code: int
    builds: dict[str, str]
    seq: int = 0  # the order of registration (1, 2, …)
    start: int = 0  # the order of registration among the processes of its role (a server's first start: 1)
    started: float = field(default_factory=time.monotonic)

    def argv(self, strip: str = "") -> list[str]:
        try:
            raw = Path(f"/proc/{self.real_pid}/cmdline").read_bytes()
        except OSError:
            return []
        return [a.decode(errors="replace").replace(strip, "") if strip else a.decode(errors="replace")
                for a in raw.split(b"\0") if a]

    def env(self) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{self.real_pid}/environ").read_bytes()
        except OSError:
            return {}
        return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    try:
        return float(a) == float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return a == b


class Controller:
    """The host's state outside the host, and the socket service that answers from it."""

    def __init__(self, scenario: Scenario, state: dict[str, Any], salt: str, socket_path: Path, sys_root: Path,
                 strip: str = "") -> None:
        self.scenario = scenario
        self.host = state
        self.salt = salt
        self.sys_root = sys_root
        self.strip = strip  # the sandbox folder, removed from command lines where the host is not sealed
        self.overrides: dict[int, dict[str, Any]] = {}
        self.procs: list[Proc] = []
        self.load = 0
        self.count = 0
        self.connect_wait_s = 20.0
        self.registered = 0
        self.starts: dict[str, int] = {}
        # a host's service manager asks for a unit's process to show its cgroup (``supervised.show_cgroup``)
        self.on_cgroup: Callable[[int, str], str] | None = None
        self.cv = threading.Condition()
        self.builds = self._build_table()
        self.path = socket_path
        ctl = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    ctl._handle(self)
                except ConnectionError:   # the simulated tool that asked is gone (Ctrl-C reaches it too): no one to answer
                    pass

        self.server = socketserver.ThreadingUnixStreamServer(str(socket_path), Handler)
        self.server.daemon_threads = True
        os.chmod(socket_path, 0o666)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------ what nvidia-smi reads
    def gpu(self, i: int) -> dict[str, Any]:
        g = dict(self.host["gpus"][i])
        g.update(self.overrides.get(i, {}))
        return g

    def save_override(self, i: int, key: str, value: object) -> None:
        self.overrides.setdefault(i, {})[key] = value

    def loaded(self) -> bool:
        return self.load > 0

    def driver_old(self) -> bool:
        try:
            return int(self.host["driver"]["version"].split(".")[0]) < 530
        except ValueError:
            return False

    def live(self, role: str) -> list[Proc]:
        with self.cv:
            return [p for p in self.procs if p.role == role]

    def servers(self) -> list[tuple[int, list[str], dict[str, str]]]:
        return [(p.pid, p.argv(self.strip), p.env()) for p in self.live("server")]

    def wait_server(self, timeout: float, after: int = 0) -> bool:
        """Wait until a server runs that registered after the first ``after`` registrations."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while not any(p.role == "server" and p.seq > after for p in self.procs):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    # ------------------------------------------------------------ the socket
    def _handle(self, h: socketserver.StreamRequestHandler) -> None:
        first = h.rfile.read(1)
        if first == b"{":  # a server's report: one JSON line, then the connection stays open
            self._register(h, json.loads(first + h.rfile.readline()))
            return
        head = first + h.rfile.read(3)
        if len(head) < 4:
            return
        fields = h.rfile.read(int.from_bytes(head, "big")).split(b"\0")[:-1]
        op, argv = fields[0].decode(), [f.decode("utf-8", "surrogateescape") for f in fields[1:]]
        if op == "nvidia-smi":
            out, err = io.StringIO(), io.StringIO()
            rc = nvsmi(self, argv, out, err)
            reply = {"out": out.getvalue(), "err": err.getvalue(), "rc": rc}
        elif op == "cgroup" and self.on_cgroup is not None and len(argv) == 2 and argv[0].isdigit() \
                and re.fullmatch(r"/system\.slice/[A-Za-z0-9_.@:-]+\.service|/system\.slice/docker-[0-9a-f]{64}\.scope"
                                 r"|/machine\.slice/libpod-[0-9a-f]{64}\.scope", argv[1]):
            err = self.on_cgroup(int(argv[0]), argv[1])
            reply = {"out": "", "err": err, "rc": 1 if err else 0}
        elif op == os.path.basename(self.scenario.bench.cmd.split()[0]):
            reply = self.bench(argv)
        elif op == serving.PROGRAM:   # `python -m sglang.bench_serving`: the same measurement, in its own format
            reply = serving.reply(self.bench(argv), argv, self.scenario)
        else:
            reply = {"out": "", "err": f"{op}: unknown program\n", "rc": 127}
        o, e = reply["out"].encode(), reply["err"].encode()
        h.wfile.write(int(reply["rc"]).to_bytes(4, "big", signed=True) + len(o).to_bytes(4, "big") + o
                      + len(e).to_bytes(4, "big") + e)

    def _register(self, h: socketserver.StreamRequestHandler, req: dict[str, Any]) -> None:
        pid, _uid, _gid = struct.unpack("3i", h.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                   struct.calcsize("3i")))
        p = Proc(role=str(req.get("role")), pid=int(req["pid"]), real_pid=pid, code=int(req.get("code", -1)),
                 builds={str(k): str(v) for k, v in (req.get("builds") or {}).items()})
        if p.role == "workload":   # an offline workload: its run's number, then it ends
            reply = self.bench([str(a) for a in req.get("argv") or []], workload=p)
            h.wfile.write(json.dumps(reply).encode())
            return
        with self.cv:
            self.registered += 1
            p.seq = self.registered
            self.starts[p.role] = p.start = self.starts.get(p.role, 0) + 1
            self.procs.append(p)
            self.cv.notify_all()
        try:
            while h.rfile.read(4096):
                pass
        finally:
            with self.cv:
                self.procs.remove(p)
                self.cv.notify_all()

    # ------------------------------------------------------------ the benchmark
    def _build_table(self) -> dict[str, tuple[str, str | None]]:
        """sha256 of a compiled file -> (version, build label), for every version and build the
        scenario or its wheelhouse names."""
        import hashlib
        sc = self.scenario
        table: dict[str, tuple[str, str | None]] = {}
        for dist, spec in sc.host.packages.items():
            versions, builds = {spec.version}, {spec.build}
            for f in sc.factors:
                if f.path == f"packages.{dist}.version":
                    versions |= {str(f.good), str(f.bad)}
                if f.path == f"packages.{dist}.build":
                    builds |= {f.good, f.bad}
            if sc.host.wheelhouse:
                for w in sc.host.wheelhouse.wheels:
                    if w.dist == dist:
                        versions.add(w.version)
                        builds.add(w.build)
            for v in versions:
                for b in builds:
                    table[hashlib.sha256(so_bytes(dist, v, b, self.salt)).hexdigest()] = (v, b)
        return table

    def current(self, path: str, srv: Proc, worker: Proc | None, client: list[str]) -> Any:
        """The value of a factor's path as the running server, its worker, the GPUs and the client have it."""
        parts = path.split(".")
        if parts[0] == "packages":
            spec = self.scenario.host.packages[parts[1]]
            module = spec.module or parts[1].replace("-", "_")
            got = self.builds.get(srv.builds.get(module, ""))
            if got is None:
                return None
            return got[0] if parts[2] == "version" else got[1]
        if path == "repo.head":
            commits = self.scenario.host.repo.commits if self.scenario.host.repo else []
            return commits[srv.code].sha if 0 <= srv.code < len(commits) else None
        if parts[0] == "server" and parts[1] == "args":
            return parse_flags(srv.argv(self.strip)[1:], dashes=False).get(parts[2])
        if parts[0] == "server" and parts[1] == "env":
            return (worker or srv).env().get(parts[2])
        if parts[0] == "server_view":
            # the value the running server uses: its flag of that name where one is given, else the engine's default
            given = parse_flags(srv.argv(self.strip)[1:]).get(parts[1].replace("_", "-"))
            return given if given is not None else (self.host["server"].get("defaults") or {}).get(parts[1])
        if parts[0] == "gpus":
            return self.gpu(int(parts[1])).get(parts[2])
        if path == "gpu_processes":
            return self.host.get("gpu_processes", [])
        if path == "cpu.governor":
            f = self.sys_root / "devices/system/cpu/cpu0/cpufreq/scaling_governor"
            return f.read_text().strip() if f.exists() else None
        if path == "driver.version":
            return self.host["driver"]["version"]
        if parts[0] == "bench":
            return parse_flags(client, dashes=False).get(parts[2])
        return None

    def active(self, f: Factor, cur: Any) -> bool:
        """Whether the factor is in its bad state, ``cur`` being its path's value as :meth:`current` read it."""
        if f.path == "repo.head":
            repo = self.scenario.host.repo   # a repo.head factor has one (Scenario's validation)
            labels = [c.sha for c in repo.commits] if repo else []
            if cur not in labels:
                return False
            if f.culprit:
                return labels.index(cur) >= labels.index(f.culprit)
            return cur == f.bad
        if f.path == "gpu_processes":
            return bool(cur) == bool(f.bad)
        return same(cur, f.bad)

    def bench(self, client: list[str], workload: Proc | None = None) -> dict[str, Any]:
        spec = self.scenario.bench
        if workload is not None:
            return self._measure(workload, None, client)
        if self.scenario.host.server.offline:
            return {"out": "", "rc": 127, "err": f"{os.path.basename(spec.cmd.split()[0])}: command not found\n"}
        if not self.live("server"):
            # a benchmark client retries a refused connection for a while, as a server that was just
            # restarted is still importing its code
            self.wait_server(self.connect_wait_s, 0)
        servers = self.live("server")
        if not servers:
            return {"out": "", "rc": 1,
                    "err": "error: cannot connect to the server at 127.0.0.1:30000 (connection refused); is it running?\n"}
        srv = servers[-1]
        workers = self.live("worker") if self.scenario.host.server.worker else []
        return self._measure(srv, workers[-1] if workers else None, client)

    def _measure(self, srv: Proc, worker: Proc | None, client: list[str]) -> dict[str, Any]:
        spec = self.scenario.bench
        value = spec.base
        on = [self.active(f, self.current(f.path, srv, worker, client)) for f in self.scenario.factors]
        bad = {f.path for f, o in zip(self.scenario.factors, on, strict=True) if o}
        for f, o in zip(self.scenario.factors, on, strict=True):
            if o and all(p in bad for p in f.with_):   # an interaction holds while its partners are bad too
                value += f.effect
        if spec.modes and srv.start:   # the mode this start of the server came up in
            value *= spec.modes[(srv.start - 1) % len(spec.modes)]
        with self.cv:
            self.count += 1
            n = self.count
            self.load += 1
        try:
            if spec.streaks:   # the host's own speed in this run's streak: a slow streak takes longer, does less a second
                speed = spec.streaks.speed(self.scenario.name, n)
                value = value / speed if unit_kind(spec.unit) == "time" else value * speed
            rng = random.Random(f"{self.scenario.name}:{n}")
            value = value * (1 + rng.gauss(0, spec.noise_pct / 100.0))
            time.sleep(spec.seconds)
        finally:
            with self.cv:
                self.load -= 1
        out = (f"[bench] warmup 3 iters, measure 10 iters, host {self.host['hostname']}\n"
               f"{spec.metric}={value:.3f} {spec.unit}\n")
        return {"out": out, "err": "", "rc": 0, "value": value, "run": n}
