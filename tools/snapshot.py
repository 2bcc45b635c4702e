"""A host's fingerprint (``debugagent snapshot``) and the difference of two (``debugagent diff``).

Difference paths use the vocabulary of scenario factors (``packages.NAME.build``,
``repo.head``, ``server.args.FLAG``, ``server.env.VAR``, ``gpus.N.FIELD``,
``gpu_processes``, ``cpu.governor``, ``driver.version``); ``DIFF_PATHS`` lists every path
the diff can report. A change is plain data (path, before and after, a note): which
hypothesis it is evidence of is the playbook's to say, not this module's.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .discovery import Discovery, DiscoveryInput, finish, resolve
from .discovery import calls as discovery_calls
from .errors import UsageError
from .gpu import GpuReading
from .host import GitInfo, HostFacts, PackageSet, ServerInfo
from .redact import redact
from .registry import Runner

SNAPSHOT_VERSION = 1
# The read-only tools a caller may leave out of a snapshot (a playbook's `checks` choose them).
OPTIONAL_PROBES = ("gpu_q", "driver_files", "python_packages", "git_state", "gpu_sample_under_load")


class GpuFacts(GpuReading):
    index: int
    reset_required: bool | None = None
    under_load: bool = False


class Snapshot(BaseModel):
    snapshot_version: int = SNAPSHOT_VERSION
    host: str
    hostname: str = ""
    taken_at: str = ""
    commands: int = 0
    driver: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuFacts] = Field(default_factory=list)
    gpu_processes: list[dict[str, Any]] = Field(default_factory=list)
    server: ServerInfo | None = None
    python: str | None = None
    packages: PackageSet | None = None
    repo: GitInfo | None = None
    cpu: dict[str, Any] = Field(default_factory=dict)
    host_facts: HostFacts | None = None
    bench: dict[str, Any] = Field(default_factory=dict)
    driver_files: dict[str, Any] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    discovery: Discovery | None = None  # how the server was found (its process tree, other servers)

    @classmethod
    def load(cls, path: str) -> Snapshot:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"snapshot `{path}`: no such file", fix="make one with `debugagent snapshot --host H -o FILE`")
        try:
            return cls.model_validate_json(p.read_text())
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise UsageError(f"snapshot `{path}` is not a debugagent snapshot: {first}",
                             fix="make one with `debugagent snapshot --host H -o FILE`") from exc


def collect(runner: Runner, *, bench: str | None = None, python: str | None = None, repo: str | None = None,
            server_pattern: str | None = None, sample_seconds: float = 1.5,
            known: Discovery | tuple[HostFacts | None, ServerInfo | None] | None = None, bench_runs: int = 0,
            metric: str | None = None, bench_regex: str | None = None,
            probes: Collection[str] | None = None) -> Snapshot:
    """Gather the fingerprint in concurrent waves; record what failed instead of raising.

    ``probes`` names the optional read-only tools to run (``OPTIONAL_PROBES``; None: all of them);
    discovery's calls and ``gpu_query`` always run, since finding the server and the GPUs needs them.

    The server is found by ``tools.discovery`` (the same overrides as ``run``), in the
    same concurrent wave as the GPU reads. ``known`` passes a discovery already made (or,
    as before, host facts and the server), so it is not made again. ``bench_runs`` > 0
    also runs the benchmark that many times (a baseline snapshot then carries its own
    baseline numbers).
    """
    errors: list[str] = []
    inp = DiscoveryInput(server_pattern=server_pattern, python=python, repo=repo, bench=bench, metric=metric,
                         bench_regex=bench_regex)

    def want(tool: str) -> bool:
        return probes is None or tool in probes

    calls: list[tuple[str, Any, str]] = [("gpu_query", None, "GPU clocks, power, PCIe, reasons (idle reading)")]
    if want("gpu_q"):
        calls.append(("gpu_q", None, "driver and CUDA versions, clock reasons, reset state"))
    if want("driver_files"):
        calls.append(("driver_files", None, "the driver's kernel module and library, and when it was installed"))
    fixed = len(calls)
    if known is None:
        calls += discovery_calls(inp)
    elif not isinstance(known, Discovery):
        calls.append(("gpu_processes", None, "processes holding GPU memory"))
    wave1 = runner.call_many(calls)
    by_tool = {o.tool: o for o in wave1[:fixed]}
    gq_o, q_o, df_o = by_tool["gpu_query"], by_tool.get("gpu_q"), by_tool.get("driver_files")
    for o in wave1:
        if not o.ok:
            errors.append(o.error or "")
    if known is None:
        host_o, table_o, gp_o = wave1[fixed:]
        disc = finish(runner, inp, table_o, gp_o, host_o.output if host_o.ok else None)
        errors += [e for e in disc.errors if e not in errors]
    elif isinstance(known, Discovery):
        disc = known
    else:
        facts0, server0 = known
        gp_o = wave1[fixed]
        values = resolve(inp, facts0, server0)
        disc = Discovery(server=server0, host_facts=facts0, gpu_processes=list(gp_o.output.processes) if gp_o.ok else [],
                         **{k: v for k, (v, _) in values.items()})
    facts, server = disc.host_facts, disc.server
    bench = bench or disc.bench
    metric = metric or disc.metric
    bench_regex = bench_regex or disc.bench_regex
    python = python or disc.python
    repo = repo or disc.repo
    wave3: list[tuple[str, Any, str]] = []
    if python and want("python_packages"):
        pk_in: dict[str, Any] = {"python": python}
        pp = server.env.get("PYTHONPATH", "") if server is not None else ""
        if server is not None and server.env and python == server.python and "[REDACTED]" not in pp:
            pk_in["pythonpath"] = pp   # the packages as the server sees them
        wave3.append(("python_packages", pk_in, "versions and compiled-file hashes"))
    if repo and want("git_state"):
        wave3.append(("git_state", {"repo": repo}, "HEAD, dirty files, reflog"))
    if bench and want("gpu_sample_under_load"):
        wave3.append(("gpu_sample_under_load", {"load": bench, "cwd": repo, "seconds": sample_seconds},
                      "clocks and PCIe read while the benchmark runs"))
    outs = {o.tool: o for o in runner.call_many(wave3)}
    samples: list[float] = []
    unit: str | None = None
    if bench and (metric or bench_regex) and bench_runs > 0:
        for i in range(bench_runs):
            b = runner.call("bench", {"cmd": bench, "metric": metric or "", "cwd": repo, "regex": bench_regex},
                            why=f"the benchmark in this state, run {i + 1} of {bench_runs}")
            if b.ok:
                samples.append(b.output.value)
                unit = b.output.unit or unit
            else:
                errors.append(b.error or "")
    pk = outs.get("python_packages")
    packages = pk.output if pk and pk.ok else None
    gi = outs.get("git_state")
    git = gi.output if gi and gi.ok else None
    if (gi is None or not gi.ok) and packages and want("git_state"):
        editable = next((p.editable for p in packages.packages if p.editable and p.commit), None)
        if editable:
            gi = runner.call("git_state", {"repo": editable}, why="the editable package's checkout")
            git = gi.output if gi.ok else None
    for o in outs.values():
        if not o.ok and "not a git repository" not in (o.error or ""):
            errors.append(o.error or "")
    load = outs.get("gpu_sample_under_load")
    loaded = load.output.per_gpu() if load and load.ok else {}
    details = {d.bus_id: d for d in q_o.output.gpus} if q_o and q_o.ok else {}
    gpus = []
    for g in (gq_o.output.gpus if gq_o.ok else []):
        lg = loaded.get(g.index)
        src = lg or g
        d = details.get(g.bus_id)
        gpus.append(GpuFacts(
            index=g.index, name=g.name, sm_clock=src.sm_clock, sm_clock_max=g.sm_clock_max, mem_clock=src.mem_clock,
            power_draw=src.power_draw, power_limit=g.power_limit, power_limit_max=g.power_limit_max,
            temperature=src.temperature, pcie_gen=src.pcie_gen, pcie_gen_max=g.pcie_gen_max, pcie_width=src.pcie_width,
            pcie_width_max=g.pcie_width_max, event_reasons=[r for r in src.event_reasons if r != "gpu_idle"],
            reset_required=d.reset_required if d else None, under_load=lg is not None and "gpu_idle" not in lg.event_reasons,
        ))
    procs = disc.tenants()  # by pid: the server's whole tree is left out, a second server is a tenant
    return Snapshot(
        host=runner.transport.host, hostname=facts.hostname if facts else "",
        taken_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), commands=runner.count,
        driver={"version": q_o.output.driver_version, "cuda": q_o.output.cuda_version} if q_o and q_o.ok else {},
        gpus=gpus, gpu_processes=procs, server=server, python=python, packages=packages, repo=git,
        cpu={"governor": facts.governor, "cores": facts.cores, "kernel": facts.kernel} if facts else {},
        host_facts=facts, bench=({"cmd": bench, "metric": metric, "regex": bench_regex, "unit": unit, "runs": bench_runs,
                                   "samples": samples} if bench else {}),
        discovery=disc.model_copy(update={"server": None, "host_facts": None}),
        driver_files=df_o.output.model_dump() if df_o and df_o.ok else {}, errors=[e for e in errors if e],
    )


# ---------------------------------------------------------------- diff
class Change(BaseModel):
    """One difference between two snapshots: ``a`` is the value before (the good snapshot), ``b`` after."""

    path: str
    a: Any = None
    b: Any = None
    note: str = ""
    editable: bool = False  # a package installed editable (from a source checkout): its change is a change of source
    # a reading that follows the work the GPU is given (power draw, temperature under load): a slower server draws
    # less, so such a change alone says nothing of a cause
    follows_load: bool = False


GPU_TOLERANCE = {"sm_clock": 0.03, "power_draw": 0.10, "mem_clock": 0.03}
GPU_EXACT = ("name", "sm_clock_max", "power_limit", "power_limit_max", "pcie_gen", "pcie_gen_max", "pcie_width",
             "pcie_width_max", "event_reasons", "reset_required")
# Every path ``diff`` reports; NAME, FLAG, VAR and N stand for one path segment.
DIFF_PATHS = ("packages.NAME.version", "packages.NAME.build", "repo.head", "repo.dirty", "server.args.FLAG",
              "server.env.VAR", *(f"gpus.N.{f}" for f in (*GPU_EXACT, *GPU_TOLERANCE, "temperature")),
              "gpu_processes", "cpu.governor", "driver.version", "driver.cuda")
PLACEHOLDERS = ("NAME", "FLAG", "VAR", "N")
FOLLOW_LOAD = ("power_draw", "temperature")


def diff(a: Snapshot, b: Snapshot) -> list[Change]:
    out: list[Change] = []

    def add(path: str, va: Any, vb: Any, note: str = "", editable: bool = False) -> None:
        out.append(Change(path=path, a=va, b=vb, note=note, editable=editable,
                          follows_load=path.startswith("gpus.") and path.rsplit(".", 1)[-1] in FOLLOW_LOAD))

    # packages
    pa = {p.name: p for p in (a.packages.packages if a.packages else [])}
    pb = {p.name: p for p in (b.packages.packages if b.packages else [])}
    editable = {n for n, p in {**pa, **pb}.items() if p.editable}
    for name in sorted(set(pa) | set(pb)):
        x, y = pa.get(name), pb.get(name)
        if x is None or y is None:
            add(f"packages.{name}.version", x.version if x else None, y.version if y else None,
                "installed" if x is None else "removed", name in editable)
        elif x.version != y.version:
            add(f"packages.{name}.version", x.version, y.version, "", name in editable)
        elif x.build_hash != y.build_hash and not x.editable:
            add(f"packages.{name}.build", x.build_hash, y.build_hash,
                f"same version {x.version}, different build (compiled files differ)", name in editable)
    # repo
    if a.repo and b.repo and a.repo.head != b.repo.head:
        subj = {c.sha: c.subject for c in (a.repo.commits + b.repo.commits)}
        add("repo.head", a.repo.head[:12], b.repo.head[:12], f"{subj.get(a.repo.head, '?')} -> {subj.get(b.repo.head, '?')}")
    if a.repo and b.repo and sorted(a.repo.dirty) != sorted(b.repo.dirty):
        add("repo.dirty", a.repo.dirty, b.repo.dirty)
    # server
    fa = a.server.flags if a.server else {}
    fb = b.server.flags if b.server else {}
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            add(f"server.args.{k}", fa.get(k), fb.get(k))
    ea = a.server.env if a.server else {}
    eb = b.server.env if b.server else {}
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k) != eb.get(k):
            add(f"server.env.{k}", ea.get(k), eb.get(k))
    # gpus
    ga = {g.index: g for g in a.gpus}
    gb = {g.index: g for g in b.gpus}
    for i in sorted(set(ga) & set(gb)):
        x, y = ga[i], gb[i]
        for f in GPU_EXACT:
            vx, vy = getattr(x, f), getattr(y, f)
            if vx != vy:
                add(f"gpus.{i}.{f}", vx, vy)
        both_loaded = x.under_load and y.under_load
        for f, tol in GPU_TOLERANCE.items():
            vx, vy = getattr(x, f), getattr(y, f)
            if both_loaded and vx is not None and vy is not None and abs(vx - vy) > tol * max(abs(vx), abs(vy), 1):
                add(f"gpus.{i}.{f}", vx, vy, "under load")
        if both_loaded and x.temperature is not None and y.temperature is not None and abs(x.temperature - y.temperature) > 8:
            add(f"gpus.{i}.temperature", x.temperature, y.temperature, "under load")
    for i in sorted(set(ga) ^ set(gb)):
        add(f"gpus.{i}.name", ga[i].name if i in ga else None, gb[i].name if i in gb else None, "GPU count changed")
    # others
    def procs(s: Snapshot) -> list[tuple[str, Any]]:
        return sorted((p["process_name"], p.get("used_memory_mib")) for p in s.gpu_processes)
    if procs(a) != procs(b):
        add("gpu_processes", [p["process_name"] for p in a.gpu_processes], [p["process_name"] for p in b.gpu_processes])
    if a.cpu.get("governor") != b.cpu.get("governor"):
        add("cpu.governor", a.cpu.get("governor"), b.cpu.get("governor"))
    if a.driver.get("version") != b.driver.get("version"):
        add("driver.version", a.driver.get("version"), b.driver.get("version"))
    if a.driver.get("cuda") != b.driver.get("cuda"):
        add("driver.cuda", a.driver.get("cuda"), b.driver.get("cuda"))
    return out


def dump(snap: Snapshot) -> str:
    """The snapshot as JSON text, redacted (it is written to a file or printed)."""
    return json.dumps(redact(snap.model_dump(mode="json")), indent=1, sort_keys=False)
