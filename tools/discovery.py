"""One discovery of the inference server, used by ``run``, ``snapshot`` and every experiment.

::

    host_info ─┐
    process_table ─┼─► select_server (pure) ─► server_details(parent pid) ─► Discovery
    gpu_processes ─┘

How the server is found, first match wins:

1. ``known``: a process with the command line found earlier in this run (after a restart
   its pid changed, and it may not hold the GPU or its port yet);
2. ``pattern``: the command line matches ``--server-pattern`` (default: SGLang, vLLM,
   TGI, TensorRT-LLM launchers, ``vllm serve`` included);
3. ``gpu``: a process that ``nvidia-smi`` lists as a compute app;
4. ``port``: a process listening on a TCP port that the benchmark names (``:8000``,
   ``--port 8000``); a listener the benchmark does not name is never guessed at.

Matches are grouped into process trees: a match whose ancestor also matches is that
one's worker; for the GPU and port fallbacks, a process climbs to its parent while the
parent runs the same executable (a worker spawned by ``multiprocessing`` lists on the GPU,
its API parent does not). The root of a tree is the server (the process to restart) and
every descendant is recorded as a worker. Several trees: the one named by ``known_pid``
or ``known_argv``, then the one listening on the benchmark's port, then the one holding
GPU memory, then the oldest; the others are recorded as other servers (GPU tenants, each
named by its pid), never told apart by name.

debugagent's own processes are never candidates: the probe's shell, its ancestors and
descendants, its siblings that run the same shell (the transport's other commands, a
benchmark among them, when debugagent runs inside another program), any ``debugagent``
process (``debugagent …``, ``python -m debugagent.agent.cli``) and everything under it, and
everything under the SSH connection the probe came through (``sshd: USER@notty``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .gpu import GpuProcess
from .host import SERVER_PATTERN, HostFacts, Proc, ProcTable, ServerInfo
from .registry import Outcome, Runner
from .shape import ServerShape
from .workload import parse as parse_workload

FoundBy = Literal["known", "pattern", "gpu", "port"]
PORT_RE = re.compile(r"(?::|--port[= ]|-p )([0-9]{2,5})\b")


class DiscoveryInput(BaseModel):
    """What the user overrides (the same flags on ``run`` and ``snapshot``) and what a run already knows."""

    model_config = ConfigDict(extra="forbid")
    server_pattern: str | None = None
    python: str | None = None
    repo: str | None = None
    bench: str | None = None
    bench_regex: str | None = None
    metric: str | None = None
    known_pid: int | None = None
    known_argv: list[str] = Field(default_factory=list)


class ServerProcess(BaseModel):
    """One server process tree: its root (the process to restart) and its workers."""

    pid: int
    ppid: int
    argv: list[str]
    workers: list[int] = Field(default_factory=list)
    found_by: FoundBy
    why: str
    ports: list[int] = Field(default_factory=list)
    gpu_mib: int = 0
    start: int = 0

    @property
    def pids(self) -> set[int]:
        return {self.pid, *self.workers}

    @property
    def label(self) -> str:
        line = " ".join(self.argv)
        return f"pid {self.pid} ({line[:120]}{'…' if len(line) > 120 else ''})"


class Discovery(BaseModel):
    """What discovery found, and how: the server, other servers, what it left out, where each value came from."""

    server: ServerInfo | None = None
    process: ServerProcess | None = None
    others: list[ServerProcess] = Field(default_factory=list)
    own: list[int] = Field(default_factory=list)
    invisible_gpu_pids: list[int] = Field(default_factory=list)  # nvidia-smi lists them, /proc does not
    host_facts: HostFacts | None = None
    gpu_processes: list[GpuProcess] = Field(default_factory=list)
    python: str | None = None
    repo: str | None = None
    bench: str | None = None
    bench_regex: str | None = None
    metric: str | None = None
    sources: dict[str, str] = Field(default_factory=dict)  # value -> where it came from
    how: str = ""
    errors: list[str] = Field(default_factory=list)

    @property
    def server_pids(self) -> set[int]:
        if self.process:
            return self.process.pids
        return {self.server.pid, *self.server.workers} if self.server else set()

    def tenants(self) -> list[dict[str, Any]]:
        """GPU processes that are not the server's (by pid), each with the command line of its tree."""
        lines = {p.pid: " ".join(p.argv) for p in self.others}
        trees = {pid: o.pid for o in self.others for pid in o.pids}
        out = []
        for g in self.gpu_processes:
            if g.pid in self.server_pids or g.pid in self.own:
                continue
            d = g.model_dump()
            root = trees.get(g.pid)
            if root is not None:
                d["server_like"] = f"another server, pid {root}: {lines[root][:160]}"
            out.append(d)
        return out


# ---------------------------------------------------------------- pure selection
def is_debugagent(argv: list[str]) -> bool:
    """debugagent's own command line: ``debugagent …``, ``python …/bin/debugagent …``, ``python -m debugagent.agent.cli …``."""
    head = argv[:3]
    if any(a.rsplit("/", 1)[-1] == "debugagent" for a in head):
        return True
    return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] in ("agent.cli", "debugagent.agent.cli") for i, a in enumerate(argv[:4]))


def own_pids(table: ProcTable) -> set[int]:
    """debugagent's own processes: the probe, its ancestors and descendants, its siblings running the same
    shell, debugagent processes and their descendants, and everything under the probe's SSH connection."""
    own: set[int] = set()
    procs = table.by_pid()
    if table.self_pid is not None:
        chain = table.ancestors(table.self_pid)
        own |= {table.self_pid, *chain, *table.descendants(table.self_pid)}
        me = procs.get(table.self_pid)
        if me is not None:  # the probe's siblings that run its shell: concurrent commands of the same transport
            for p in table.procs:
                if p.ppid == me.ppid and p.pid != me.pid and _program(p) == _program(me):
                    own |= {p.pid, *table.descendants(p.pid)}
        for a in chain:
            argv = procs[a].argv
            if argv and argv[0].startswith("sshd:") and "@notty" in argv[0]:
                own |= {a, *table.descendants(a)}
    for p in table.procs:
        if is_debugagent(p.argv):
            own |= {p.pid, *table.descendants(p.pid)}
    return own


def _program(p: Proc) -> str:
    return p.exe or (p.argv[0] if p.argv else "")


def climb(table: ProcTable, pid: int, own: set[int]) -> int:
    """The root of ``pid``'s tree: its ancestors while they run the same executable (workers -> API process)."""
    procs = table.by_pid()
    cur = procs[pid]
    while True:
        parent = procs.get(cur.ppid)
        if parent is None or parent.pid in own or parent.pid <= 1 or _program(parent) != _program(cur):
            return cur.pid
        cur = parent


def bench_ports(bench: str | None) -> set[int]:
    """Ports a benchmark command names (``http://127.0.0.1:8000``, ``--port 8000``)."""
    return {int(m) for m in PORT_RE.findall(bench or "") if 0 < int(m) < 65536}


def _trees(table: ProcTable, roots: list[int], own: set[int], found_by: FoundBy, why: str,
           gpu_mib: dict[int, int]) -> list[ServerProcess]:
    procs = table.by_pid()
    out = []
    for r in dict.fromkeys(roots):
        p = procs[r]
        workers = [w for w in table.descendants(r) if w not in own]
        pids = {r, *workers}
        out.append(ServerProcess(pid=r, ppid=p.ppid, argv=p.argv, workers=workers, found_by=found_by, why=why,
                                 ports=table.ports_of(pids), gpu_mib=sum(gpu_mib.get(x, 0) for x in pids),
                                 start=p.start))
    return out


def candidates(table: ProcTable, gpu: list[GpuProcess], inp: DiscoveryInput) -> tuple[list[ServerProcess], set[int]]:
    """Every server-like process tree, by the first method that finds any; and debugagent's own pids."""
    own = own_pids(table)
    procs = {p.pid: p for p in table.procs if p.pid not in own and p.argv}
    gpu_mib: dict[int, int] = {}
    for g in gpu:
        gpu_mib[g.pid] = gpu_mib.get(g.pid, 0) + (g.used_memory_mib or 0)

    def roots_of(matched: set[int]) -> list[int]:
        return sorted(m for m in matched if not any(a in matched for a in table.ancestors(m)))

    if inp.known_argv:
        same = {pid for pid, p in procs.items() if p.argv == inp.known_argv}
        if same:
            return _trees(table, roots_of(same), own, "known", "the command line found earlier in this run",
                          gpu_mib), own
    pattern = inp.server_pattern or SERVER_PATTERN
    rx = re.compile(pattern)
    matched = {pid for pid, p in procs.items() if rx.search(p.line)}
    if matched:
        src = "--server-pattern" if inp.server_pattern else "the default pattern"
        return _trees(table, roots_of(matched), own, "pattern", f"its command line matches {src} `{pattern}`",
                      gpu_mib), own
    on_gpu = sorted({g.pid for g in gpu if g.pid in procs})
    if on_gpu:
        roots = sorted({climb(table, pid, own) for pid in on_gpu})
        return _trees(table, roots, own, "gpu", "nvidia-smi lists it (or its worker) as a compute process",
                      gpu_mib), own
    wanted = bench_ports(inp.bench)
    hits = sorted({pid for ln in table.listeners if ln.port in wanted for pid in ln.pids if pid in procs})
    if hits:
        roots = sorted({climb(table, pid, own) for pid in hits})
        why = f"it listens on port {', '.join(map(str, sorted(wanted)))}, which the benchmark names"
        return _trees(table, roots, own, "port", why, gpu_mib), own
    return [], own


def rank(found: list[ServerProcess], inp: DiscoveryInput) -> list[ServerProcess]:
    """The server first: the known pid, the known command line, the benchmark's port, GPU memory, the oldest."""
    wanted = bench_ports(inp.bench)

    def key(s: ServerProcess) -> tuple[int, int, int, int, int]:
        return (0 if inp.known_pid is not None and inp.known_pid in s.pids else 1,
                0 if inp.known_argv and s.argv == inp.known_argv else 1,
                0 if wanted & set(s.ports) else 1,
                0 if s.gpu_mib else 1,
                s.start)
    return sorted(found, key=key)


def resolve(inp: DiscoveryInput, facts: HostFacts | None, server: ServerInfo | None) -> dict[str, tuple[str | None, str]]:
    """Each of python, repo, bench, metric, bench_regex: (value, where it came from). Flags win."""
    profile = facts.profile if facts else {}

    def pick(name: str, *options: tuple[object, str]) -> tuple[str | None, str]:
        for value, src in options:
            if value:
                return str(value), src
        return None, ""
    return {
        "python": pick("python", (inp.python, "--python"), (server.python if server else None, "the server's interpreter"),
                       (profile.get("python"), "the host profile")),
        "repo": pick("repo", (inp.repo, "--repo"), (profile.get("repo"), "the host profile"),
                     (server.cwd if server else None, "the server's working directory")),
        "bench": pick("bench", (inp.bench, "--bench"), (profile.get("bench"), "the host profile")),
        "metric": pick("metric", (inp.metric, "--metric"), (profile.get("metric"), "the host profile")),
        "bench_regex": pick("bench_regex", (inp.bench_regex, "--bench-regex"), (profile.get("bench_regex"), "the host profile")),
    }


# ---------------------------------------------------------------- the calls
def calls(inp: DiscoveryInput, *, host_info: bool = True) -> list[tuple[str, BaseModel | dict[str, Any] | None, str]]:
    """The read-only calls discovery needs (tool, input, why: ``Runner.call_many``'s); independent, so a
    caller may run them with others."""
    out: list[tuple[str, BaseModel | dict[str, Any] | None, str]] = []
    if host_info:
        out.append(("host_info", None, "who is this host: hostname, cores, governor, and a host profile if one is installed"))
    out += [("process_table", None, "every process with its parent and command line, and the TCP listeners: "
                                    "which one is the inference server"),
            ("gpu_processes", None, "processes holding GPU memory (the server's workers, or other tenants)")]
    return out


def shape_wanted(runner: Runner) -> bool:
    """``server_shape`` is read unless the transport replays a recording made before it existed."""
    recorded = getattr(runner.transport, "recorded_tools", None)
    return recorded is None or "server_shape" in recorded


def finish(runner: Runner, inp: DiscoveryInput, table_o: Outcome, gpu_o: Outcome,
           facts: HostFacts | None, *, shape: bool = True) -> Discovery:
    """Select the server from the calls' outcomes, read its details, resolve the overrides."""
    errors = [o.error for o in (table_o, gpu_o) if not o.ok and o.error]
    gpu = list(gpu_o.output.processes) if gpu_o.ok else []
    found: list[ServerProcess] = []
    own: set[int] = set()
    invisible: list[int] = []
    if table_o.ok:
        table: ProcTable = table_o.output
        try:
            found, own = candidates(table, gpu, inp)
        except re.error as exc:
            errors.append(f"--server-pattern `{inp.server_pattern}` is not a regular expression: {exc}")
        seen = {p.pid for p in table.procs}
        invisible = sorted({g.pid for g in gpu if g.pid not in seen})
    ranked = rank(found, inp)
    process = ranked[0] if ranked else None
    server = None
    if process is not None:
        sd = runner.call("server_details", {"pid": process.pid},
                         why="its exact command line, environment and working directory")
        if sd.ok:
            server = sd.output.model_copy(update={"ppid": process.ppid, "workers": process.workers,
                                                  "ports": process.ports, "found_by": process.found_by})
            if shape and shape_wanted(runner):
                server.shape = read_shape(runner, server)
        else:
            errors.append(sd.error or "server_details failed")
    values = resolve(inp, facts, server)
    workload = None
    if server is None and (workload := parse_workload(values["bench"][0])) is not None:
        # no server: the benchmark is the program (an offline workload); what it runs stands for the server
        server = workload
        values = resolve(inp, facts, server)
    if table_o.ok:
        own &= {p.pid for p in table_o.output.procs}
    how = describe(process, ranked[1:], own, invisible, inp)
    if workload is not None:
        how += (f" The benchmark is the program itself, an offline workload: `{workload.entry}` run by "
                f"{workload.python}" + (f" in {workload.cwd}" if workload.cwd else "") + "; its interpreter, code, "
                "packages and environment are the suspects, its flags are its work (never changed), and each "
                "experiment re-runs it with the change (nothing to restart).")
    return Discovery(server=server, process=process if server else None, others=ranked[1:], own=sorted(own),
                     invisible_gpu_pids=invisible, host_facts=facts, gpu_processes=gpu,
                     sources={k: src for k, (v, src) in values.items() if v},
                     how=how, errors=errors, **{k: v for k, (v, _) in values.items()})


def read_shape(runner: Runner, server: ServerInfo) -> ServerShape | None:
    """How ``server`` is run (``tools.shape``); None when it could not be read (the transcript says why)."""
    o = runner.call("server_shape", {"pid": server.pid, "python": server.python, "cwd": server.cwd},
                    why="how the server is run: its launcher, where its engine is imported from, what supervises it, "
                        "whether it runs in a container")
    if not o.ok:
        return None
    got: ServerShape = o.output
    if not server.python:
        got.launcher, got.command = "binary", server.argv[0].rsplit("/", 1)[-1]
    return got


def discover(runner: Runner, inp: DiscoveryInput | None = None, *, host_info: bool = True) -> Discovery:
    """Find the server on the host behind ``runner`` (concurrent calls, then its details).

    ``host_info=False`` skips the host's facts and profile (a lookup during a run, which has them).
    """
    inp = inp or DiscoveryInput()
    outs = runner.call_many(calls(inp, host_info=host_info))
    host_o = outs[0] if host_info else None
    table_o, gpu_o = outs[-2:]
    facts = host_o.output if host_o is not None and host_o.ok else None
    d = finish(runner, inp, table_o, gpu_o, facts, shape=host_info)
    if host_o is not None and not host_o.ok and host_o.error:
        d.errors.insert(0, host_o.error)
    return d


def describe(process: ServerProcess | None, others: list[ServerProcess], own: set[int], invisible: list[int],
             inp: DiscoveryInput) -> str:
    """One paragraph for the transcript: what was found, how, and what was left out."""
    if process is None:
        text = ("No inference server process was found (by "
                + (f"--server-pattern `{inp.server_pattern}`" if inp.server_pattern else "the default pattern")
                + ", nvidia-smi's compute processes, or a port the benchmark names)")
    else:
        text = f"Found the server, {process.label}: {process.why}"
        if process.found_by in ("gpu", "port"):
            text += (" (no process matches " + (f"--server-pattern `{inp.server_pattern}`" if inp.server_pattern
                                                 else "the default pattern") + ")")
        if process.workers:
            text += f"; its workers: pid {', '.join(map(str, process.workers))} (the parent, pid {process.pid}, is the one to restart)"
        if process.ports:
            text += f"; it listens on port {', '.join(map(str, process.ports))}"
    if others:
        text += "; other server-like processes (GPU tenants, told apart by pid): " + "; ".join(o.label for o in others)
    if invisible:
        text += (f"; nvidia-smi lists pid {', '.join(map(str, invisible))}, which /proc here does not show (another "
                 "pid namespace, such as a container's, or a process that has just exited)")
    if own:
        text += f"; debugagent's own processes ({len(own)}) were left out"
    return text + "."
