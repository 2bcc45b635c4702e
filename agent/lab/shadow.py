"""Shadow experiments (``--shadow-gpus LIST --shadow-port N``): the server is never stopped, signalled or restarted.

Instead of restarting the server with a change, two copies of it are started beside it: the *changed* copy (its
command line with the change and ``--port N``) and the *reference* copy (its command line as found, ``--port N+1``),
both with its folder, environment, interpreter and identity (who it runs as), on the GPUs named
(``CUDA_VISIBLE_DEVICES``). The benchmark runs against each copy's port in turn (reference, changed, reference, …),
and the decision compares the two copies' interleaved runs (never the server's own runs: another process on other
GPUs). Each copy's undo (``stop_copy``) is journalled before it starts; the lab's undo stops both.

``check`` is run once, right after discovery, before any benchmark run: it refuses (exit 2) a server command line
with no port to rewrite, a benchmark that names no port to point at a copy (``{port}`` in ``--bench``), a port in
use, fewer GPUs than the server's parallelism needs, and GPUs without the free memory two copies need.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from debugagent.tools.errors import UsageError
from debugagent.tools.registry import Runner
from pydantic import BaseModel, Field

from ..stats import AUTO_CAP, PROMISING, decide, noise_sd, run_budget
from .errors import ExperimentError
from .server import Server, ServerRun

if TYPE_CHECKING:
    from .measure import Bench

PLACEHOLDER = "{port}"
PORT_FLAGS = ("--port", "-p")
# flags whose values multiply into the GPUs a server needs (SGLang, vLLM, TGI, TensorRT-LLM spellings)
PARALLEL_FLAGS = {"tp": ("--tp", "--tp-size", "--tensor-parallel-size", "--num-shard"),
                  "pp": ("--pp", "--pp-size", "--pipeline-parallel-size"),
                  "dp": ("--dp", "--dp-size", "--data-parallel-size")}
GPU_TOKEN = re.compile(r"^(?:[0-9]{1,3}|(?:GPU|MIG)-[0-9A-Za-z-]{1,80})$")


class ShadowPlan(BaseModel):
    """What ``check`` found and the lab runs by: the GPUs, the two ports, the server's port, the notes said."""

    gpus: list[str]
    port: int
    ref_port: int
    server_port: int
    bench: str = ""                 # the benchmark command with ``{port}`` where each copy's port goes
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------- pure helpers
def _norm(flag: str) -> str:
    return flag.replace("_", "-")


def port_of(argv: list[str]) -> int | None:
    """The port the server's command line gives (``--port N``, ``--port=N``, ``-p N``), None where it gives none."""
    for i, a in enumerate(argv[1:], 1):
        name, eq, val = a.partition("=")
        if _norm(name) in PORT_FLAGS:
            v = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if v.isdigit():
                return int(v)
    return None


def with_port(argv: list[str], port: int) -> list[str] | None:
    """``argv`` with its port argument replaced by ``port``; None where it has none."""
    out = list(argv)
    for i, a in enumerate(out[1:], 1):
        name, eq, val = a.partition("=")
        if _norm(name) in PORT_FLAGS:
            if eq and val.isdigit():
                out[i] = f"{name}={port}"
                return out
            if not eq and i + 1 < len(out) and out[i + 1].isdigit():
                out[i + 1] = str(port)
                return out
    return None


def gpus_needed(argv: list[str]) -> int:
    """The GPUs the server's parallelism flags need (tensor × pipeline × data parallel), 1 where none is given."""
    need = 1
    for names in PARALLEL_FLAGS.values():
        for i, a in enumerate(argv[1:], 1):
            name, eq, val = a.partition("=")
            if _norm(name) in names:
                v = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                if v.isdigit() and int(v) > 0:
                    need *= int(v)
                break
    return need


def bench_template(bench: str, server_port: int) -> str | None:
    """The benchmark with ``{port}`` where the server's port goes: as given when it holds ``{port}``, else its URL's
    ``:PORT`` or its ``--port PORT`` / ``--port=PORT`` rewritten; None where it names the server's port nowhere."""
    if PLACEHOLDER in bench:
        return bench
    p = str(server_port)
    out, n = re.subn(rf"(://[^\s/:@]+(?:@[^\s/:]+)?:){p}(?![0-9])", rf"\g<1>{PLACEHOLDER}", bench)
    out, m = re.subn(rf"(--port[= ]+){p}(?![0-9])", rf"\g<1>{PLACEHOLDER}", out)
    return out if n + m else None


def at_port(template: str, port: int) -> str:
    return template.replace(PLACEHOLDER, str(port))


def parse_gpus(text: str) -> list[str]:
    """``--shadow-gpus 4,5`` (indices or UUIDs); exit 2 naming the flag otherwise."""
    gpus = [g.strip() for g in text.split(",") if g.strip()]
    bad = [g for g in gpus if not GPU_TOKEN.match(g)]
    if not gpus or bad:
        raise UsageError(f"--shadow-gpus {text!r}: not a list of GPU indices or UUIDs"
                         + (f" ({', '.join(map(repr, bad))})" if bad else ""),
                         fix="give the GPUs as CUDA_VISIBLE_DEVICES takes them: --shadow-gpus 4,5")
    return gpus


def server_bench(bench: str | None, server: dict[str, Any] | None) -> str | None:
    """The benchmark as the server itself is measured: ``{port}`` filled in with the server's port."""
    if not bench or PLACEHOLDER not in bench:
        return bench
    argv = list((server or {}).get("argv") or [])
    port = port_of(argv) or next(iter((server or {}).get("ports") or []), None)
    if port is None:
        raise UsageError("--bench holds {port}, but the server's port is not known (no --port in its command line and "
                         "no port it listens on)", fix="write the server's port in --bench")
    return at_port(bench, port)


# ---------------------------------------------------------------- the check before anything runs
def check(runner: Runner, gpus_text: str | None, port: int | None, server: dict[str, Any] | None,
          bench: str | None) -> ShadowPlan:
    """Everything a shadow experiment needs, checked before the first benchmark run; exit 2 with the fix otherwise."""
    if not gpus_text or not port:
        missing = "--shadow-port" if gpus_text else "--shadow-gpus"
        raise UsageError(f"shadow experiments need both --shadow-gpus and --shadow-port; {missing} is missing",
                         fix="give both: --shadow-gpus 4,5 --shadow-port 31000 (the unchanged copy uses 31001)")
    gpus = parse_gpus(gpus_text)
    if server is None:
        raise UsageError("--shadow-gpus: no server was found to copy", fix="name it with --server-pattern REGEX")
    argv, pid = list(server.get("argv") or []), int(server.get("pid") or 0)
    sport = port_of(argv)
    if sport is None:
        raise UsageError(f"--shadow-port {port}: the server's command line (pid {pid}: `{' '.join(argv)[:200]}`) has no "
                         "--port N, --port=N or -p N to point a copy at another port",
                         fix="start the server with its port given as --port N, or run without --shadow-gpus and "
                             "--shadow-port (experiments then restart the server itself)")
    ref = port + 1
    if sport in (port, ref):
        raise UsageError(f"--shadow-port {port}: the copies would use ports {port} and {ref}, and the server listens on "
                         f"{sport}", fix=f"choose --shadow-port with two free ports other than {sport}")
    template = bench_template(bench or "", sport)
    if template is None:
        raise UsageError(f"--bench: the benchmark `{bench}` names the server's port ({sport}) in no URL (`:{sport}`) "
                         "and no --port, so it cannot be pointed at a copy",
                         fix="write {port} where the benchmark takes the server's port, e.g. "
                             "--bench 'python bench.py --port {port}' ({port} is the server's port when the server is "
                             "measured, each copy's when a copy is)")
    o = runner.call("listening_ports", why=f"are ports {port} and {ref} free for the two copies?")
    if not o.ok:
        raise UsageError(f"--shadow-port {port}: the host's listening ports could not be read ({o.error})",
                         fix="check that /proc/net/tcp is readable on the host")
    busy = [p for p in (port, ref) if p in o.output.ports]
    if busy:
        raise UsageError(f"--shadow-port {port}: port {', '.join(map(str, busy))} is in use on the host (the changed "
                         f"copy listens on {port}, the unchanged one on {ref})",
                         fix="choose --shadow-port N with N and N+1 both free")
    need = gpus_needed(argv)
    if len(gpus) < need:
        raise UsageError(f"--shadow-gpus {gpus_text}: the server's parallelism needs {need} GPUs (its tensor, pipeline "
                         f"and data parallel flags), {len(gpus)} given", fix=f"name {need} GPUs in --shadow-gpus")
    notes = memory_check(runner, gpus, gpus_text, pid, [pid, *[int(w) for w in server.get("workers") or []]], need)
    return ShadowPlan(gpus=gpus, port=port, ref_port=ref, server_port=sport, bench=template, notes=notes)


def memory_check(runner: Runner, gpus: list[str], gpus_text: str, pid: int, tree: list[int], need: int) -> list[str]:
    """Refuse GPUs without the free memory two copies need (twice what the server holds per GPU); notes otherwise."""
    o = runner.call("gpu_memory", why="the memory the server holds per GPU, and what the GPUs named have free")
    mem = o.output if o.ok else None
    if mem is None or not mem.readable:
        why = mem.why if mem is not None else (o.error or "nvidia-smi failed")
        return [f"the memory of GPUs {gpus_text} could not be checked ({why}): the two copies are started on "
                f"CUDA_VISIBLE_DEVICES={gpus_text} without knowing that they fit"]
    by_uuid = {g.uuid: g for g in mem.gpus}
    held = [a for a in mem.apps if a.pid in set(tree)]
    own = {a.gpu_uuid for a in held}
    per_gpu = sum(a.used_mib for a in held) / max(1, len(own) or need)
    notes: list[str] = []
    for g in gpus:
        if g.startswith("MIG-"):   # nvidia-smi's GPU rows do not list MIG instances
            notes.append(f"the memory of the MIG instance {g} could not be checked (nvidia-smi lists whole GPUs)")
            continue
        row = next((r for r in mem.gpus if g in (r.index, r.uuid)), None)
        if row is None:
            raise UsageError(f"--shadow-gpus {gpus_text}: the host has no GPU {g} (it has "
                             f"{', '.join(r.index for r in mem.gpus)})", fix="name GPUs that nvidia-smi lists")
        free = row.total_mib - row.used_mib
        if free < 2 * per_gpu:
            users = sorted({a.pid for a in mem.apps if a.gpu_uuid == row.uuid})
            raise UsageError(f"--shadow-gpus {gpus_text}: GPU {row.index} has {free:.0f} MiB free of {row.total_mib:.0f}; "
                             f"the two copies (changed and unchanged) need {2 * per_gpu:.0f} MiB there, twice the "
                             f"{per_gpu:.0f} MiB the server (pid {pid}) holds per GPU"
                             + (f" (held by pids {', '.join(map(str, users))})" if users else ""),
                             fix="name GPUs with that much memory free (`nvidia-smi` shows what holds them)")
        if row.uuid in own:
            notes.append(f"warning: GPU {row.index} is the server's own (pid {pid} holds memory there): the copies and "
                         "the server compete for it, so the server must be idle (no traffic) while the copies are "
                         "measured, or its traffic skews them and they slow it")
    if by_uuid and not held:
        notes.append(f"the server (pid {pid}) holds no GPU memory that nvidia-smi lists, so the copies need none")
    return notes


# ---------------------------------------------------------------- the copies
class Shadow(Server):
    """The lab's server when shadow experiments are asked: ``start`` starts the two copies (each ``stop_copy``
    journalled first) instead of restarting the server; ``sample`` measures them in turn. The server is only read."""

    def __init__(self, plan: ShadowPlan, *args: Any, bench: Bench, journal_note: Callable[[str, int, int], None],
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan = plan
        self.bench_ = bench
        self.journal_note = journal_note
        self.copies: dict[str, dict[str, Any]] = {}

    def check_alive(self, r: Runner) -> None:
        for role, c in self.copies.items():
            o = r.call("server_ready", {"pid": c["pid"]}, why=f"is the {role} copy still running?")
            if o.ok and o.output.state == "dead":
                raise ExperimentError(f"the {role} copy (pid {c['pid']}, port {c['port']}) exited; its output was in "
                                      f"{c['log']}")

    def start(self, r: Runner, srv: Any, run: ServerRun, change: str) -> int:
        """Start the reference copy (as found) and the changed copy (``run``) beside the server; the server is
        never signalled. Returns the changed copy's pid."""
        c = r.call("server_control", {"pid": srv.pid}, why="who the server runs as, so that its copies run as it does")
        if not c.ok:
            raise ExperimentError(c.error or "server_control failed")
        ctl = c.output
        run_as = ctl.run_as()
        if run_as is not None and ctl.shell_identity is not None and (cannot := run_as.needs_root(ctl.shell_identity)):
            raise ExperimentError(f"the server (pid {srv.pid}) runs as {ctl.identity.describe() if ctl.identity else '?'}; "
                                  f"this session (uid {ctl.shell_identity.uid}) cannot start a copy so "
                                  f"({', '.join(cannot)}): run debugagent as root or as the server's user")
        p = self.plan
        gpus = ",".join(p.gpus)
        self.copies = {}
        for role, state, port in (("reference", ServerRun(argv=list(srv.argv), cwd=srv.cwd), p.ref_port),
                                  ("changed", run, p.port)):
            argv = with_port(state.argv, port)
            if argv is None:
                raise ExperimentError(f"the {role} copy's command line has no --port to rewrite")
            base = f"/tmp/debugagent-{self.run_id}-shadow-{role}"
            files = {"pid_file": f"{base}.pid", "env_file": f"{base}.env", "log": f"{base}.log"}
            self.push_undo("stop_copy", {**files, "expect_argv": argv, "cwd": state.cwd, "found_argv": list(srv.argv)},
                           f"stop the {role} copy (port {port}; its pid in {files['pid_file']}, checked against its "
                           f"command line and start time) and remove its files")
            o = r.call("start_copy", {"role": role, "env_pid": srv.pid, "argv": argv,
                                      "fix_argv": list(state.argv), "cwd": state.cwd, "gpus": gpus, **files,
                                      "set": state.set, "unset": state.unset, "path_first": state.path_first,
                                      **({"run_as": run_as.model_dump(exclude_none=True)} if run_as else {})},
                       why=(f"a copy of the server with {change}" if role == "changed" else
                            "an unchanged copy of the server, the reference") + f", on GPUs {gpus}, port {port}; the "
                       f"server (pid {srv.pid}) keeps running untouched")
            if not o.ok:
                raise ExperimentError(f"the {role} copy did not start: {o.error or 'start_copy failed'}")
            self.journal_note(files["pid_file"], o.output.pid, o.output.start)
            self.copies[role] = {"pid": o.output.pid, "port": port, "log": files["log"]}
        self.started = {"run": run, "change": change, "pid": self.copies["changed"]["pid"], "shadow": True}
        for c_ in self.copies.values():
            self._wait_copy(r, c_)
        return self.copies["changed"]["pid"]

    def _wait_copy(self, r: Runner, c: dict[str, Any]) -> None:
        """Ready by the profile's health URL at the copy's port, or its ready line in the copy's log; else the
        benchmark's retries wait."""
        url = self.setup.health_url
        moved = re.sub(rf":{self.plan.server_port}(?![0-9])", f":{c['port']}", url) if url else None
        try:
            self.setup.health_url = moved if moved != url else None
            self._wait_ready(r, c["pid"], c["log"], 0)
        finally:
            self.setup.health_url = url

    def start_again(self, r: Runner, why: str) -> int:
        raise ExperimentError("a shadow experiment does not restart its copies per commit (no bisection)")

    # ------------------------------------------------------------ measuring
    def sample(self, b: Bench, r: Runner, cwd: str | None, regression: float | None, why: str,
               env: dict[str, str] | None) -> tuple[list[float], Any]:
        """The two copies measured in turn (reference, changed, …) until ``stats.decide`` on their runs decides, or
        the budget ends. Each copy's first run is a warm-up (it was just started) unless this server needs none."""
        p, ref_cwd = self.plan, b.spec.cwd
        ref_cmd, chg_cmd = at_port(p.bench, p.ref_port), at_port(p.bench, p.port)
        if b.warmth.needed is not False:
            for role, cmd, wd in (("reference", ref_cmd, ref_cwd), ("changed", chg_cmd, cwd)):
                b.warmups += 1
                b.bench(r, wd, f"warm-up of the {role} copy (port {p.ref_port if role == 'reference' else p.port}), "
                        "not counted", env if role == "changed" else None, cmd=cmd)
        cap = b.spec.max_runs or 0
        limit = (cap // 2) or None
        ref: list[float] = []
        vals: list[float] = []
        extended, d = False, None
        while True:
            most = (limit or AUTO_CAP) if extended else run_budget(noise_sd(ref, vals, b.noise)[0], regression,
                                                                   max(len(ref), 2), limit)
            for _ in range(2 if not vals else 1):
                ref.append(b.measured(r, ref_cwd, f"the unchanged copy (port {p.ref_port}), in turn", cmd=ref_cmd))
                vals.append(b.measured(r, cwd, f"{why}, in the changed copy (port {p.port})", env, cmd=chg_cmd))
            capped = bool(limit and len(vals) >= limit)
            final = len(vals) >= most or capped
            d = decide(ref, vals, regression, b.lower, final=final, noise=b.noise,
                       regression_se=b.spec.regression_se)
            if final and not d.decided and not capped and not extended and d.p < PROMISING \
                    and len(vals) < (limit or AUTO_CAP):
                extended = True
                continue
            if d.decided or final:
                break
        b.last_decision = d
        self.emit("experiment", phase="measure",
                  text=f"the copies measured in turn: unchanged {statistics.fmean(ref):.4g} over {len(ref)} runs (port "
                       f"{p.ref_port}), changed {statistics.fmean(vals):.4g} over {len(vals)} runs (port {p.port})")
        return vals, d

    def describe(self) -> str:
        p = self.plan
        return (f"in shadow copies on GPUs {','.join(p.gpus)} (changed on port {p.port}, unchanged on port {p.ref_port}, "
                f"measured in turn; the server itself untouched)")


def note_copy(journal: Any) -> Callable[[str, int, int], None]:
    """The journal's ``stop_copy`` step for ``pid_file`` learns the copy's pid and start time."""
    def note(pid_file: str, pid: int, start: int) -> None:
        for s in journal.pending():
            if s.tool == "stop_copy" and s.input.get("pid_file") == pid_file and pid and start:
                journal.update(s, stop_pid=int(pid), stop_start=int(start))
                return
    return note


__all__ = ["PLACEHOLDER", "Shadow", "ShadowPlan", "at_port", "bench_template", "check", "gpus_needed", "note_copy",
           "port_of", "server_bench", "with_port"]
