"""The fault suite over real host shapes: ``debugagent run`` is sent SIGKILL, SIGTERM or SIGHUP at one phase of its
work (probing, reproducing, an experiment's restart, a code revert, the undo's own restart), ``debugagent undo RUN``
follows, and the host is read again and compared with what it was before the run.

The shapes are the ones of tests/realhost/test_shapes.py and test_containers.py, on this machine, for real:

- ``console``: ``VENV/bin/inferd``, a console script pip installed from a wheel, whose forked worker holds the port
  with it (``--host local``); the flag and the variable it was started with are the suspects;
- ``supervisor``: a server run by a real supervisord from the ``supervisor`` package, its flag and variable in the
  program's section (``--host local``): an experiment rewrites that section and runs ``supervisorctl update``;
- ``container``: a server in a bubblewrap box of its own namespaces (mount, pid, net, IPC, UTS), reached by
  ``--host nsenter:PID``; its code is a git checkout whose last commit is slow, and it runs with the flag.

What "as found" means here, read from this machine's ``/proc`` (and the box's): the server tree (how many, each
root's argv, environment and folder, its workers), which processes listen on the port, the supervisor's config
files (bytes, mode, mtime) and ``supervisorctl status``, the checkout's HEAD, worktrees and status, the venv's
installed files with their hashes, the names in ``/tmp`` that carry the run's id (and every name in the box's
own ``/tmp``), no journal of the run left in the cache folder (the console's and the container's runs share one,
as a home shared over NFS: each meets the other host's journals there), no process the run started still running,
and the host lock free for the next run.

``bench/faults`` runs the whole matrix; tests/realhost/test_fault_shapes.py runs two cases.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults import events

from .conftest import Host, git, make_venv, proc_state, site_state
from .container import Box, bench_in, make_box, start_in, why_not
from .shapes import ConsoleHost, Supervised, add_the_regression, install_console_server, start_supervisord

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}
# the probes that read the host after the reproduce step's first run: a signal among them lands while probing
PROBES = ("python_packages", "git_state", "gpu_query", "gpu_q", "driver_files", "gpu_sample_under_load")
RESTARTS = ("restart_server", "supervisor_apply")
UNDO_RESTARTS = ("restart_server", "supervisor_restore")
PHASES = ("probe", "reproduce", "restart", "revert", "undo")
# what each cause of a shape's regression (the flag, the variable, the slow commit) costs a request, over a 10 ms step:
# large enough to stand out from this machine's noise under load (at 20 ms, with the machine at load average 17-33,
# the reproduce step called the regression noise in 2 of 39 cases, and the run ended before its experiment)
CAUSE_MS = 60.0


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "debugagent.agent.cli", *args]


# ---------------------------------------------------------------- what the host is
def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _running(pid: int, start: str) -> bool:
    """The process that had ``start`` as its start time still runs (a zombie, which this machine's init may never
    reap, holds nothing and runs nothing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and fields[19] == start


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def all_pids() -> list[int]:
    return sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())


def tagged(tag: str) -> list[int]:
    return [p for p in all_pids() if tag.encode() in _cmdline(p)]


def server_tree(tag: str) -> list[dict]:
    """Each process tree whose command lines carry ``tag``: its root's argv, environment and folder, and how many
    processes run under it (a worker left behind by a half-stopped server is a tree of its own)."""
    pids = tagged(tag)
    out = []
    for root in (p for p in pids if _parent(p) not in pids):
        try:
            st = proc_state(root)
        except (OSError, ValueError):
            continue
        kids, frontier = 0, [root]
        while frontier:
            nxt = [p for p in pids if _parent(p) in frontier]
            kids += len(nxt)
            frontier = nxt
        out.append({**st, "workers": kids})
    return sorted(out, key=lambda s: s["argv"])


def listeners(port: int, netns_pid: int | None = None) -> list[list[str]]:
    """The command lines of the processes that hold a listening TCP socket on ``port`` (in the network namespace of
    ``netns_pid``, this process's where None)."""
    inodes = set()
    base = f"/proc/{netns_pid}/net" if netns_pid else "/proc/self/net"
    for f in ("tcp", "tcp6"):
        try:
            lines = Path(base, f).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{parts[9]}]")
    owners = []
    for pid in all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    owners.append(_cmdline(pid).decode(errors="replace").split("\0")[:-1])
                    break
            except OSError:
                continue
    return sorted(owners)


def descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid`` now, with its start time (to tell a reused pid apart)."""
    pids = all_pids()
    parents = {p: _parent(p) for p in pids}
    out, frontier = {}, {pid}
    while frontier:
        nxt = {p for p, pp in parents.items() if pp in frontier and p not in out}
        out.update({p: _start(p) for p in nxt})
        frontier = nxt
    return out


def lock_takeable(target: str) -> str:
    """"" when a new run could take the host's lock now (free, or its holder provably gone); else why not."""
    from debugagent.agent.hosts import open_transport
    from debugagent.agent.journal import HostLock, HostLocked, host_side
    from debugagent.tools.errors import DebugAgentError
    try:
        with open_transport(target) as t:
            lock = HostLock(host_side(t), "faultsuite-check")
            lock.acquire()
            lock.release()
    except HostLocked as e:
        return str(e)
    except DebugAgentError as e:
        return f"the host could not be reached: {e}"
    return ""


# ---------------------------------------------------------------- the shapes
@dataclass
class Shape:
    """One host shape set up on this machine, with the regression a run is asked about."""

    name: str
    dir: Path
    phases: tuple[str, ...] = ("probe", "reproduce", "restart", "undo")
    h: Any = None
    base: float = 0.0
    bad: float = 0.0
    parts: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)   # for the runs: a host lock folder of the shape's own

    @property
    def target(self) -> str:
        return "local"

    def setup(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.h is not None:
            self.h.stop()

    def state(self) -> dict:
        return {"servers": server_tree(self.h.tag), "listening": listeners(self.h.port)}

    def settle(self, timeout: float = 90) -> None:
        """Until the server answers and its tree stops changing (a restarted server forks its worker after it listens;
        supervisord restarts a program it saw exit): what is read after that is the host, not a step in flight."""
        deadline = time.monotonic() + timeout
        last, same_since = None, time.monotonic()
        while time.monotonic() < deadline:
            now = (json.dumps(server_tree(self.h.tag), sort_keys=True), self.answers())
            if now != last:
                last, same_since = now, time.monotonic()
            elif now[1] and time.monotonic() - same_since > 1.5:
                return
            time.sleep(0.2)

    def answers(self) -> bool:
        return self.h.bench_once() is not None

    def run_argv(self, out: Path) -> list[str]:
        return cli("run", "--host", self.target, "--server-pattern", self.h.pattern, "--bench", self.h.bench_cmd(),
                   "--allow-mutations", "--json", "--out", str(out), "--ready-timeout", "60", "--reproduce-runs", "3",
                   "--max-runs", "3", "--symptom", f"latency {self.bad:.2f} ms", "--baseline", f"latency {self.base:.2f} ms")


@dataclass
class ConsoleShape(Shape):
    def setup(self) -> None:
        d = self.dir / "console"
        d.mkdir(parents=True, exist_ok=True)
        self.h = h = ConsoleHost(dir=d, python=str(make_venv(d / "venv", pip=True)))
        install_console_server(h, flag_ms=CAUSE_MS, env_ms=CAUSE_MS)
        h.cwd = d
        h.start()
        self.base = h.baseline()
        h.flags = ["--disable-cuda-graph"]
        h.env = {"CUDA_LAUNCH_BLOCKING": "1"}
        h.restart()
        self.settle()
        self.bad = h.baseline(3)

    def state(self) -> dict:
        return {**super().state(), "site-packages": site_state(self.h.python)}


@dataclass
class SupervisorShape(Shape):
    def setup(self) -> None:
        d = self.dir / "supd"
        d.mkdir(parents=True, exist_ok=True)
        self.h = h = Host(dir=d, python=str(make_venv(d / "venv", pip=False)))
        h.cwd = d / "srv"
        h.write_code(h.cwd, flag_ms=CAUSE_MS, env_ms=CAUSE_MS)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(d), "LANG": "C.UTF-8"}
        self.parts["sup"] = sup = start_supervisord(h, h.argv(), env)
        self.base = h.baseline()
        add_the_regression(h, sup)
        self.settle()
        self.bad = h.baseline(3)

    @property
    def sup(self) -> Supervised:
        return self.parts["sup"]

    def close(self) -> None:
        sup = self.parts.get("sup")
        if sup is not None:
            sup.stop()
        super().close()

    def state(self) -> dict:
        conf = self.sup.state()
        return {**super().state(), "supervisor config": {k: v for k, v in conf.items() if k != "status"},
                "supervisorctl status": conf["status"], "supervisord running": self.sup.proc.poll() is None}


@dataclass
class ContainerShape(Shape):
    phases: tuple[str, ...] = PHASES

    @property
    def box(self) -> Box:
        return self.parts["box"]

    @property
    def target(self) -> str:
        return f"nsenter:{self.box.pid}"

    @property
    def repo(self) -> Path:
        return self.h.cwd

    def setup(self) -> None:
        why = why_not()
        if why:
            raise RuntimeError(f"no container shape here: {why}")
        d = self.dir / "boxed"
        d.mkdir(parents=True, exist_ok=True)
        # a cache folder the runs share with this machine's (the suite's XDG_CACHE_HOME), bound in writable: the
        # journals of both hosts meet there, as in a shared NFS home, and each run must restore only its own host's
        shared = tuple(Path(self.env[k]) for k in ("XDG_CACHE_HOME",) if k in self.env)
        for f in shared:
            f.mkdir(parents=True, exist_ok=True)
        self.parts["box"] = box = make_box(d, binds=shared)
        self.h = h = Host(dir=d, python=str(make_venv(d / "venv", pip=False)))
        h.cwd = repo = d / "srv"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        h.write_code(repo, flag_ms=CAUSE_MS)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "Serve /generate")
        start_in(box, h)
        self.base = sorted(bench_in(box, h) or 1e9 for _ in range(3))[1]
        subprocess.run(box.enter("pkill", "-f", "--", h.pattern), check=True)
        h.write_code(repo, extra=CAUSE_MS, flag_ms=CAUSE_MS)
        git(repo, "commit", "-qam", "Fuse the sampling step")
        h.flags = ["--disable-cuda-graph"]
        start_in(box, h)
        self.settle()
        self.bad = sorted(bench_in(box, h) or 0 for _ in range(3))[1]

    def close(self) -> None:
        box = self.parts.get("box")
        if box is not None:
            box.stop()   # every process in the box with it
        super().close()

    def answers(self) -> bool:
        return bench_in(self.box, self.h) is not None

    def state(self) -> dict:
        r = self.repo
        ns = {n: os.readlink(f"/proc/{self.box.pid}/ns/{n}") for n in ("mnt", "pid", "net")}
        outside = [p for p in tagged(self.h.tag)
                   if {n: os.readlink(f"/proc/{p}/ns/{n}") for n in ("mnt", "pid", "net")} != ns]
        return {"servers": server_tree(self.h.tag), "listening": listeners(self.h.port, self.box.pid),
                "servers outside the box": len(outside), "HEAD": git(r, "rev-parse", "HEAD"),
                "worktrees": git(r, "worktree", "list", "--porcelain"), "git status": git(r, "status", "--porcelain"),
                "box /tmp": self.box.tmp()}


SHAPES = {"console": ConsoleShape, "supervisor": SupervisorShape, "container": ContainerShape}


# ---------------------------------------------------------------- one case


def reached(out: Path, phase: str) -> tuple[bool, bool]:
    """Whether the run is at ``phase`` now, from its events.jsonl: (reached, its command still in flight)."""
    evs = events(out)
    want: tuple[str, ...]
    if phase == "probe":
        want, undo = PROBES, False
    elif phase == "reproduce":
        hit = [i for i, e in enumerate(evs) if e.get("event") == "tool_call" and e.get("tool") == "bench"
               and str(e.get("why", "")).startswith("reproduce")]
        return (bool(hit), bool(hit) and not any(e.get("event") == "tool_result" and e.get("tool") == "bench"
                                                  for e in evs[hit[0]:]))
    elif phase == "restart":
        want, undo = RESTARTS, False
    elif phase == "revert":
        want, undo = ("git_worktree_add",), False
    elif phase == "undo":
        want, undo = UNDO_RESTARTS, True
    else:
        raise ValueError(phase)
    for i, e in enumerate(evs):
        if (e.get("event") == "tool_call" and e.get("tool") in want
                and str(e.get("why", "")).startswith("undo:") == undo):
            done = any(x.get("event") == "tool_result" and x.get("tool") == e["tool"] for x in evs[i + 1:])
            return True, not done
    return False, False


def compare(before: dict, after: dict) -> list[str]:
    """What differs, one line per key, short enough to print."""
    out = []
    for k in sorted(set(before) | set(after)):
        a, b = before.get(k), after.get(k)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list) and k == "servers":
            out.append(f"{k}: {len(a)} server tree(s) found, {len(b)} now"
                       + ("" if len(a) != len(b) else "; " + "; ".join(
                           f"{f} differs" for f in ("argv", "env", "cwd", "workers")
                           if [s.get(f) for s in a] != [s.get(f) for s in b])))
        elif isinstance(a, dict) and isinstance(b, dict):
            out.append(f"{k}: " + ", ".join(sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x)))[:200] + " differ")
        else:
            out.append(f"{k}: {str(a)[:120]!r} found, {str(b)[:120]!r} now")
    return out


def run_case(shape: Shape, phase: str, sig: str, out: Path) -> dict:
    """One case: the run, the signal at ``phase``, ``undo``, the host compared with what it was before."""
    before = shape.state()
    t0 = time.monotonic()
    p = subprocess.Popen(shape.run_argv(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=shape.h.dir, env={**os.environ, **shape.env, "PYTHONUNBUFFERED": "1"})
    case: dict[str, Any] = {"shape": shape.name, "phase": phase, "signal": sig, "changed": [], "problems": []}
    deadline = time.monotonic() + 300
    at, in_flight, started = False, False, {}
    while time.monotonic() < deadline and p.poll() is None:
        at, in_flight = reached(out, phase)
        started = descendants(p.pid) or started
        if at:
            break
        time.sleep(0.01)
    if at and p.poll() is None:
        started = {**started, **descendants(p.pid)}
        p.send_signal(SIGNALS[sig])
    else:
        how = f"ended (exit {p.returncode})" if p.poll() is not None else "timed out"
        case["problems"].append(f"the run {how} before the phase {phase}")
        if p.poll() is None:
            p.kill()
    case["in_flight"] = in_flight
    try:
        _, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        case["problems"].append("the run did not end within 300 s of the signal")
    case["exit"] = p.returncode
    marks = {"signal": time.monotonic() - t0}
    if sig != "SIGKILL" and at and p.returncode not in (130, 6):
        case["problems"].append(f"exit {p.returncode} after {sig} (130, or 6 naming what is left, expected): "
                                + err.strip()[-300:])
    env = {**os.environ, **shape.env}
    u = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=300, env=env)
    case["undo"] = u.returncode
    if u.returncode != 0:
        case["problems"].append(f"`undo` exit {u.returncode}: {u.stderr.strip()[-300:]}")
        u = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=300, env=env)
        case["undo"] = f"{case['undo']},{u.returncode}"
    marks["undo"] = time.monotonic() - t0
    shape.settle()
    marks["settle"] = time.monotonic() - t0
    after = shape.state()
    case["changed"] = compare(before, after)
    try:
        run_id = json.loads((out / "run.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        run_id = ""
    if run_id:
        left = sorted(n for n in os.listdir("/tmp") if run_id in n)
        if left:
            case["changed"].append(f"/tmp: {left}")
        cache = Path(shape.env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "debugagent"
        journals = sorted(n for n in (os.listdir(cache) if cache.is_dir() else []) if run_id in n)
        if journals:
            case["changed"].append(f"journal left in {cache}: {journals}")
    servers = set(tagged(shape.h.tag))
    deadline = time.monotonic() + 30
    while True:   # a benchmark the killed run started ends on its own within its timeout
        alive = [pid for pid, st in started.items() if pid not in servers and _running(pid, st)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if alive:
        case["changed"].append("processes of the run still running: " + "; ".join(
            _cmdline(pid).decode(errors="replace").replace("\0", " ")[:100] for pid in alive))
    marks["procs"] = time.monotonic() - t0
    r = subprocess.run([sys.executable, "-c", "import sys; from tests.realhost.faultsuite import lock_takeable; "
                        "print(lock_takeable(sys.argv[1]))", shape.target], capture_output=True, text=True, timeout=120,
                       env=env, cwd=Path(__file__).resolve().parents[2])
    why = r.stdout.strip() if r.returncode == 0 else f"the lock could not be checked: {r.stderr.strip()[-200:]}"
    if why:
        case["changed"].append(f"host lock: {why[:200]}")
    case["wall_s"] = round(time.monotonic() - t0, 1)
    case["marks"] = {k: round(v, 1) for k, v in marks.items()}
    return case
