"""GPUs: ``nvidia-smi``'s query (idle, and sampled while the benchmark runs), its ``-q`` report, and the
processes that hold GPU memory.

Snapshot fields ``gpus`` (clocks, power, temperature and PCIe read under load where a benchmark ran) and
``gpu_processes`` (the tenants: every GPU process outside the server's tree); difference paths ``gpus.N.FIELD``
and ``gpu_processes``; facts ``gpus`` (each with what its event reasons mean), ``gpus_loaded`` and
``gpu_processes``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .. import gpu, nvml
from .base import Add, Call, FactsInput, Gathering, Probe, Tool
from .text import clip_words, code, csv_rows, plural, table

if TYPE_CHECKING:
    from ..snapshot import Snapshot

THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")  # when the playbook's knowledge.thermal_reasons is absent
HW_SLOW = {"hw_slowdown", "hw_power_brake_slowdown"}
GPU_TOLERANCE = {"sm_clock": 0.03, "power_draw": 0.10, "mem_clock": 0.03}
GPU_EXACT = ("name", "sm_clock_max", "power_limit", "power_limit_max", "pcie_gen", "pcie_gen_max", "pcie_width",
             "pcie_width_max", "event_reasons", "reset_required")
# readings that follow the work the GPU is given: a slower server draws less, so such a change alone says nothing
FOLLOW_LOAD = ("power_draw", "temperature")
NVSMI_Q_KEYS = ("Driver Version", "CUDA Version", "Product Name", "Reset Required", "Current", "Max",
                "SW Power Capping", "HW Slowdown", "SW Thermal Slowdown", "HW Thermal Slowdown")
GPU_HEADER = ["GPU", "SM MHz (of max)", "power W", "temp C", "util", "PCIe", "reasons", "readings"]


class GpuList(BaseModel):
    gpus: list[gpu.GpuState]


class GpuProcessList(BaseModel):
    processes: list[gpu.GpuProcess]


class GpuFacts(gpu.GpuReading):
    index: int
    reset_required: bool | None = None
    under_load: bool = False
    # the idle reading's clocks (a clock lock's MIN holds an idle GPU there) and the memory clock's maximum
    mem_clock_max: int | None = None
    idle_sm_clock: int | None = None
    idle_mem_clock: int | None = None


class Fields(BaseModel):
    gpus: list[GpuFacts] = Field(default_factory=list)
    gpu_processes: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------- transcript
def gpu_rows(gpus: list[dict[str, Any]]) -> list[list[Any]]:
    """Readings of nvidia-smi, the columns that decide clocks/power/PCIe, identical rows merged."""
    rows: Counter[tuple] = Counter()
    order: list[tuple] = []
    for g in gpus:
        r = (g.get("index"), f"{g.get('sm_clock')} / {g.get('sm_clock_max')}",
             f"{g.get('power_draw', 0):.0f} / {g.get('power_limit', 0):.0f} (max {g.get('power_limit_max', 0):.0f})",
             g.get("temperature"), f"{g.get('utilization')} %",
             f"gen {g.get('pcie_gen')}/{g.get('pcie_gen_max')} x{g.get('pcie_width')}/{g.get('pcie_width_max')}",
             ", ".join(g.get("event_reasons") or []) or "none")
        if r not in rows:
            order.append(r)
        rows[r] += 1
    return [[*r, rows[r]] for r in order]


def _readings(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    readings = parsed.get("gpus") or parsed.get("samples")
    return table(GPU_HEADER, gpu_rows(readings), inline_one=True) if readings else None


def _q(ev: dict[str, Any]) -> list[str]:
    out = ev.get("stdout") or ""
    keep = [ln.strip() for ln in out.splitlines() if ":" in ln and ln.strip().split(":")[0].strip() in NVSMI_Q_KEYS
            and "N/A" not in ln]
    return [f"Output ({plural(len(out.splitlines()), 'line')}; the lines that matter): "
            + "; ".join(code(" ".join(k.split())) for k in keep[:10])]


def _processes(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("stdout") or ""
    if "\x1f" in out or not out.strip():
        return None
    m = re.search(r"--query-compute-apps=(\S+)", ev.get("command") or "")
    head = m.group(1).split(",") if m else None
    rows = csv_rows(out)
    return table(head or [f"field {i + 1}" for i in range(len(rows[0]))], rows, inline_one=True)


def _nvml_readings(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output") or {}
    lines = _readings(ev)
    if lines is None:
        return None
    if out.get("source") == "nvml":
        head = (f"Read through NVML ({out.get('api') or 'reasons API unknown'}), one GPU's sample "
                f"{out.get('sample_us')} µs; compute processes: "
                + (", ".join(f"pid {p['pid']} on GPU {p['gpu']}" for p in out.get("processes") or []) or "none"))
    else:
        head = "Read with nvidia-smi (no interpreter on the host read the GPUs through pynvml)"
        why = (ev.get("stderr") or "").strip()
        if why:   # the reason, once: not again as the stderr line (text.tail)
            head += ": " + code(clip_words(why, 300))
    return [head, *lines]


def _q_xml(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output")
    if not out:
        return None
    gpus = "; ".join(f"{g.get('bus_id')}: reasons {', '.join(g.get('event_reasons') or []) or 'none'} "
                     f"({g.get('reasons_section') or 'no reasons section'})" for g in out.get("gpus") or [])
    return [f"Output: driver {code(out.get('driver_version') or '?')}, CUDA {code(out.get('cuda_version') or '?')}; {gpus}"]


def _xid(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output")
    if not out:
        return None
    if not out.get("readable"):
        return [f"Output: the kernel log is not readable here ({out.get('why') or 'no reason given'})"]
    xids = out.get("xids") or []
    head = f"Output: {plural(len(xids), 'Xid line')} in the kernel log"
    return [head, *(f"- {code(x.get('line') or '')}" for x in xids[:20])]


# ---------------------------------------------------------------- snapshot
def _first(g: Gathering) -> list[Call]:
    return [("gpu_query", None, "GPU clocks, power, PCIe, reasons (idle reading)"),
            ("gpu_q", None, "driver and CUDA versions, clock reasons, reset state")]


def _xid_call(g: Gathering) -> list[Call]:
    return [("gpu_xid", None, "the GPU driver's Xid errors in the kernel log")]


def _second(g: Gathering) -> list[Call]:
    """The GPUs read while the benchmark runs: through NVML with the host's Python (``nvidia-smi`` where none imports
    it, in the same call); replaying a recording made before that call existed, with ``nvidia-smi`` as it was."""
    if not g.bench or not g.want("gpu_sample_under_load"):
        return []
    recorded = getattr(getattr(g.runner, "transport", None), "recorded_tools", None)
    if recorded is not None and "gpu_nvml_under_load" not in recorded:
        return [("gpu_sample_under_load", {"load": g.bench, "cwd": g.repo, "seconds": g.sample_seconds},
                 "clocks and PCIe read while the benchmark runs")]
    return [("gpu_nvml_under_load", {"load": g.bench, "cwd": g.repo, "seconds": g.sample_seconds, "python": g.python},
             "clocks, PCIe and clock event reasons read through NVML at 10 Hz while the benchmark runs")]


def _wave2(g: Gathering) -> list[Call]:
    return [*_xid_call(g), *_second(g)]


def _fill(g: Gathering) -> dict[str, Any]:
    """Each GPU: the idle query's limits and maxima, the busy sample's readings where one was taken."""
    idle: GpuList | None = g.output("gpu_query")
    load: gpu.LoadSample | None = g.output("gpu_nvml_under_load") or g.output("gpu_sample_under_load")
    q: gpu.DriverInfo | None = g.output("gpu_q")
    loaded = load.per_gpu() if load else {}
    details = {d.bus_id: d for d in q.gpus} if q else {}
    gpus = []
    for x in (idle.gpus if idle else []):
        lg = loaded.get(x.index)
        src = lg or x
        d = details.get(x.bus_id)
        gpus.append(GpuFacts(
            index=x.index, name=x.name, sm_clock=src.sm_clock, sm_clock_max=x.sm_clock_max, mem_clock=src.mem_clock,
            power_draw=src.power_draw, power_limit=x.power_limit, power_limit_max=x.power_limit_max,
            temperature=src.temperature, pcie_gen=src.pcie_gen, pcie_gen_max=x.pcie_gen_max, pcie_width=src.pcie_width,
            pcie_width_max=x.pcie_width_max, event_reasons=[r for r in src.event_reasons if r != "gpu_idle"],
            reset_required=d.reset_required if d else None, under_load=lg is not None and "gpu_idle" not in lg.event_reasons,
            mem_clock_max=x.mem_clock_max, idle_sm_clock=x.sm_clock, idle_mem_clock=x.mem_clock,
        ))
    # by pid: the server's whole tree is left out, a second server is a tenant
    return {"gpus": gpus, "gpu_processes": g.discovery.tenants() if g.discovery else []}


# ---------------------------------------------------------------- diff
def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    ga = {x.index: x for x in a.gpus}
    gb = {x.index: x for x in b.gpus}
    for i in sorted(set(ga) & set(gb)):
        x, y = ga[i], gb[i]
        for f in GPU_EXACT:
            vx, vy = getattr(x, f), getattr(y, f)
            if vx != vy:
                add(f"gpus.{i}.{f}", vx, vy, follows_load=f in FOLLOW_LOAD)
        both_loaded = x.under_load and y.under_load
        for f, tol in GPU_TOLERANCE.items():
            vx, vy = getattr(x, f), getattr(y, f)
            if both_loaded and vx is not None and vy is not None and abs(vx - vy) > tol * max(abs(vx), abs(vy), 1):
                add(f"gpus.{i}.{f}", vx, vy, "under load", follows_load=f in FOLLOW_LOAD)
        if both_loaded and x.temperature is not None and y.temperature is not None and abs(x.temperature - y.temperature) > 8:
            add(f"gpus.{i}.temperature", x.temperature, y.temperature, "under load", follows_load=True)
    for i in sorted(set(ga) ^ set(gb)):
        add(f"gpus.{i}.name", ga[i].name if i in ga else None, gb[i].name if i in gb else None, "GPU count changed")

    def procs(s: Snapshot) -> list[tuple[str, Any]]:
        return sorted((p["process_name"], p.get("used_memory_mib")) for p in s.gpu_processes)
    if procs(a) != procs(b):
        add("gpu_processes", [p["process_name"] for p in a.gpu_processes], [p["process_name"] for p in b.gpu_processes])


# ---------------------------------------------------------------- facts
def gpu_view(g: dict[str, Any], thermal: Collection[str] = THERMAL) -> dict[str, Any]:
    """One GPU as the rules see it; ``thermal``: the event reasons that mean a thermal slowdown."""
    reasons = list(g.get("event_reasons") or [])
    pl, plm = g.get("power_limit") or 0, g.get("power_limit_max") or 0
    gen, genm = g.get("pcie_gen"), g.get("pcie_gen_max")
    w, wm = g.get("pcie_width"), g.get("pcie_width_max")
    return {
        **g,
        "reasons": reasons,
        "thermal": bool(set(thermal) & set(reasons)),
        "hw_slowdown": bool(HW_SLOW & set(reasons)),
        "power_capped": "sw_power_cap" in reasons,
        # clocks held by `nvidia-smi -lgc`/`-lmc` or lowered applications clocks (NVML's reason 0x2), read under load
        "clocks_locked": bool(g.get("under_load")) and "applications_clocks_setting" in reasons,
        "limit_lowered": bool(plm and pl and pl < 0.95 * plm),
        "pcie_degraded": bool(g.get("under_load") and ((gen and genm and gen < genm) or (w and wm and w < wm))),
    }


def tenants(snap: Snapshot, server: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Other processes on the GPUs, by pid, never by name: a second server from the same binary is a tenant."""
    server_pids = {server["pid"], *(server.get("workers") or [])} if server else set()
    return [p for p in snap.gpu_processes if p.get("pid") not in server_pids]


def _facts(snap: Snapshot, fx: FactsInput) -> dict[str, Any]:
    gpus = [gpu_view(x.model_dump(), fx.knowledge.get("thermal_reasons", THERMAL)) for x in snap.gpus]
    return {"gpus": gpus, "gpus_loaded": bool(gpus) and all(x.get("under_load") for x in gpus),
            "gpu_processes": tenants(snap, fx.so_far.get("server"))}


PROBE = Probe(
    "gpu",
    tools=(Tool("gpu_query", gpu.GpuQuery, lambda i, r: GpuList(gpus=gpu.parse_query_csv(r.stdout)), summary=_readings,
                wave=1, check=True),
           Tool("gpu_q", gpu.GpuQ, lambda i, r: gpu.parse_q(r.stdout), summary=_q, optional=True, wave=1, check=True),
           Tool("gpu_processes", gpu.GpuProcesses,
                lambda i, r: GpuProcessList(processes=gpu.parse_compute_apps(r.stdout)), summary=_processes, check=True),
           Tool("gpu_sample_under_load", gpu.GpuSampleUnderLoad, lambda i, r: gpu.parse_load_samples(r.stdout),
                timeout=120.0, checked=False, summary=_readings, optional=True, wave=2, check=True),
           # sent in its place (it is chosen with it): NVML, or nvidia-smi in the same call
           Tool("gpu_nvml_under_load", nvml.GpuNvmlUnderLoad, lambda i, r: nvml.parse_under_load(r.stdout),
                timeout=120.0, checked=False, summary=_nvml_readings, stands_for="gpu_sample_under_load"),
           Tool("gpu_q_xml", gpu.GpuQXml, lambda i, r: gpu.parse_q_xml(r.stdout), summary=_q_xml, check=True),
           Tool("gpu_xid", gpu.GpuXid, gpu.parse_xid, summary=_xid, optional=True, wave=2, check=True)),
    first=_first, second=_wave2, fill=_fill,
    diff_paths=tuple(f"gpus.N.{f}" for f in (*GPU_EXACT, *GPU_TOLERANCE, "temperature")) + ("gpu_processes",),
    diff=_diff, facts=_facts,
)
