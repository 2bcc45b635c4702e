"""GPUs read through NVML with the host's own Python (``nvidia-ml-py``, imported as ``pynvml``), while a load runs.

``nvidia-smi`` takes tens of milliseconds a query (it starts a process and opens every GPU); NVML's calls answer
in microseconds. ``GpuNvmlUnderLoad`` sends ``SAMPLER`` over the transport and runs it with the server's interpreter,
or any ``python3`` on the host that imports ``pynvml``; where none does (exit 3) or NVML fails, the same command
samples with ``nvidia-smi`` instead (``tools.gpu.GpuSampleUnderLoad``). The script only reads:

- once: name, UUID, PCI bus id, driver, the maximum SM and memory clocks, the enforced power limit and the
  largest one allowed, the PCIe link's maximum generation and width, total memory, persistence, ECC mode;
- at 10 Hz, only calls that answer in microseconds: SM and memory clocks, the clock event reasons mask
  (``nvmlDeviceGetCurrentClocksEventReasons``, or the deprecated ``…ThrottleReasons`` of older bindings),
  power usage, temperature, utilization, performance state, the PCIe link's current generation and width
  (never ``nvmlDeviceGetPcieThroughput``, which blocks for about 20 ms);
- once the GPUs are seen busy: the compute processes with their pids and memory.

A long benchmark on many GPUs keeps every k-th round of samples, at most 3000 rows (``every`` says k), so the answer
stays well under the transport's output limit.

``parse_nvml`` gives the same ``LoadSample`` of ``GpuState`` rows as the ``nvidia-smi`` sampler, so the snapshot,
its diff and the rules' facts cannot tell which one read the GPUs; the output also says which API answered and
what one 10 Hz sample cost on the host.
"""

from __future__ import annotations

import json
import statistics

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError
from .gpu import EVENT_REASON_BITS, GpuSampleUnderLoad, GpuState, LoadSample, parse_load_samples
from .transport import q

NO_NVML = 3   # the exit status when no interpreter tried imports pynvml
SMI_MARK = "NVML: no interpreter read the GPUs through pynvml; sampling with nvidia-smi"

# The NVML names of the reason bits, without their prefix: ``nvmlClocksEventReason`` (current bindings) or
# ``nvmlClocksThrottleReason`` (deprecated, older bindings); the bits are the same.
NVML_REASON_NAMES: dict[str, str] = {
    "GpuIdle": "gpu_idle",
    "ApplicationsClocksSetting": "applications_clocks_setting",
    "UserDefinedClocks": "applications_clocks_setting",
    "SwPowerCap": "sw_power_cap",
    "HwSlowdown": "hw_slowdown",
    "SyncBoost": "sync_boost",
    "SwThermalSlowdown": "sw_thermal_slowdown",
    "HwThermalSlowdown": "hw_thermal_slowdown",
    "HwPowerBrakeSlowdown": "hw_power_brake_slowdown",
    "DisplayClockSetting": "display_clock_setting",
}
REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")

# argv: load (a shell command), seconds, interval, limit_s, attempts. One JSON object on stdout.
SAMPLER = r"""import json,os,signal,subprocess,sys,time
try:
    import pynvml as N
except Exception as e:
    sys.stderr.write("pynvml not importable by %s: %s\n"%(sys.executable,e)); sys.exit(3)
load,secs,itv,lim,att=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4]),int(sys.argv[5])
def g(f,*a):
    try:
        v=f(*a)
        return v.decode() if isinstance(v,bytes) else v
    except Exception:
        return None
def fn(*names):
    for n in names:
        if hasattr(N,n):
            return n,getattr(N,n)
    return None,None
try:
    N.nvmlInit()
except Exception as e:
    sys.stderr.write("nvmlInit failed: %s\n"%e); sys.exit(4)
api,reasons=fn("nvmlDeviceGetCurrentClocksEventReasons","nvmlDeviceGetCurrentClocksThrottleReasons")
names={k:getattr(N,k) for k in dir(N) if k.startswith(("nvmlClocksEventReason","nvmlClocksThrottleReason")) and isinstance(getattr(N,k),int)}
hs=[N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
def lim1(i,h):
    pc=g(N.nvmlDeviceGetPowerManagementLimitConstraints,h)
    mem=g(N.nvmlDeviceGetMemoryInfo,h)
    ecc=g(N.nvmlDeviceGetEccMode,h)
    pci=g(N.nvmlDeviceGetPciInfo,h)
    bus=getattr(pci,"busId",None) if pci is not None else None
    return {"index":i,"name":g(N.nvmlDeviceGetName,h),"uuid":g(N.nvmlDeviceGetUUID,h),
            "bus_id":bus.decode() if isinstance(bus,bytes) else bus,
            "sm_max":g(N.nvmlDeviceGetMaxClockInfo,h,N.NVML_CLOCK_SM),"mem_max":g(N.nvmlDeviceGetMaxClockInfo,h,N.NVML_CLOCK_MEM),
            "power_limit_mw":g(N.nvmlDeviceGetEnforcedPowerLimit,h),"power_max_mw":pc[1] if pc else None,
            "gen_max":g(N.nvmlDeviceGetMaxPcieLinkGeneration,h),"width_max":g(N.nvmlDeviceGetMaxPcieLinkWidth,h),
            "mem_total":mem.total if mem is not None else None,"persistence":g(N.nvmlDeviceGetPersistenceMode,h),
            "ecc":ecc[0] if ecc else None}
limits=[lim1(i,h) for i,h in enumerate(hs)]
def one(i,h):
    t=time.perf_counter_ns()
    u=g(N.nvmlDeviceGetUtilizationRates,h)
    r={"i":i,"sm":g(N.nvmlDeviceGetClockInfo,h,N.NVML_CLOCK_SM),"mem":g(N.nvmlDeviceGetClockInfo,h,N.NVML_CLOCK_MEM),
       "reasons":g(reasons,h) if reasons else None,"power_mw":g(N.nvmlDeviceGetPowerUsage,h),
       "temp":g(N.nvmlDeviceGetTemperature,h,N.NVML_TEMPERATURE_GPU),"util":u.gpu if u is not None else None,
       "pstate":g(N.nvmlDeviceGetPerformanceState,h),"gen":g(N.nvmlDeviceGetCurrPcieLinkGeneration,h),
       "width":g(N.nvmlDeviceGetCurrPcieLinkWidth,h)}
    r["ns"]=time.perf_counter_ns()-t
    return r
def procs():
    out=[]
    for i,h in enumerate(hs):
        mem=g(N.nvmlDeviceGetMemoryInfo,h)
        for p in g(N.nvmlDeviceGetComputeRunningProcesses,h) or []:
            m=getattr(p,"usedGpuMemory",None)
            out.append({"gpu":i,"uuid":limits[i]["uuid"],"pid":p.pid,"used_mib":m//1048576 if isinstance(m,int) else None})
        limits[i]["mem_used"]=mem.used if mem is not None else None
    return out
ms=int(secs*1000)
loop="e=$(( $(date +%%s%%3N) + %d )); while :; do %s; [ $(date +%%s%%3N) -ge $e ] && break; done"%(ms,load)
most=int(lim/max(itv,0.05))
samples,ps,rounds=[],None,0
for a in range(att):
    rounds+=1; busy=False; n=0
    b=subprocess.Popen(["timeout","%g"%lim,"bash","-c",loop],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL,stdin=subprocess.DEVNULL)
    while b.poll() is None and n<most:
        t0=time.monotonic()
        rows=[one(i,h) for i,h in enumerate(hs)]
        samples.append(rows); n+=1
        if any((r["util"] or 0)>0 for r in rows):
            busy=True
            if ps is None:
                ps=procs()
        time.sleep(max(0.0,itv-(time.monotonic()-t0)))
    b.wait()
    if busy:
        break
k=max(1,-(-len(samples)*len(hs)//3000))
print(json.dumps({"api":api,"reason_names":names,"driver":g(N.nvmlSystemGetDriverVersion),"limits":limits,
                  "samples":[r for rows in samples[::k] for r in rows],"processes":ps or [],"rounds":rounds,
                  "interval":itv,"every":k}))
N.nvmlShutdown()
"""


class GpuNvmlUnderLoad(GpuSampleUnderLoad):
    """Input of ``gpu_nvml_under_load``: run ``load`` and read the GPUs through NVML meanwhile, at ``interval``
    (10 Hz), with ``python`` (the server's interpreter) or, where that one lacks ``pynvml``, ``python3``; where
    neither imports it, the same command samples with ``nvidia-smi`` instead (``GpuSampleUnderLoad``, every
    ``smi_interval`` seconds), so one call, recorded either way, reads the GPUs under load."""

    model_config = ConfigDict(extra="forbid")
    python: str | None = None
    interval: float = 0.1
    smi_interval: float = 0.25

    def command(self) -> str:
        load = self.load if not self.cwd else f"cd {q(self.cwd)} && {self.load}"
        args = " ".join(q(a) for a in (load, f"{self.seconds:g}", f"{self.interval:g}", f"{self.limit_s:g}",
                                       str(int(self.attempts))))
        pys = " ".join(q(p) for p in dict.fromkeys([*([self.python] if self.python else []), "python3"]))
        smi = GpuSampleUnderLoad(load=self.load, cwd=self.cwd, seconds=self.seconds, interval=self.smi_interval,
                                 limit_s=self.limit_s, attempts=self.attempts).command()
        return (f"r={NO_NVML}; for p in {pys}; do command -v \"$p\" >/dev/null 2>&1 || continue; "
                f"\"$p\" -I -c {q(SAMPLER)} {args}; r=$?; [ $r = 0 ] && exit 0; [ $r = {NO_NVML} ] || break; done; "
                f"echo {q(SMI_MARK)} >&2; {smi}")


class NvmlProcess(BaseModel):
    gpu: int
    uuid: str | None = None
    pid: int
    used_mib: int | None = None


class NvmlLoadSample(LoadSample):
    """``LoadSample`` (the same ``GpuState`` rows as ``nvidia-smi``'s), where they came from (``nvml`` or
    ``nvidia-smi``), and what only NVML tells: which reasons API answered, the compute processes with their pids,
    and the median cost of one 10 Hz sample of one GPU."""

    source: str = "nvml"
    api: str | None = None
    processes: list[NvmlProcess] = Field(default_factory=list)
    sample_us: float | None = None
    rounds: int = 1


def reason_bits(names: dict[str, int]) -> dict[int, str]:
    """The reason bits by our name from the NVML module's own constants, under either prefix
    (``nvmlClocksEventReasonSwPowerCap`` or ``nvmlClocksThrottleReasonSwPowerCap``); the documented bits where
    the module named none. Masks such as ``…All`` or ``…None`` are not single reasons and are left out."""
    out = dict(EVENT_REASON_BITS)
    for full, bit in names.items():
        prefix = next((p for p in REASON_PREFIXES if full.startswith(p)), None)
        ours = NVML_REASON_NAMES.get(full[len(prefix):]) if prefix else None
        if ours and isinstance(bit, int) and bit > 0 and bit & (bit - 1) == 0:
            out[bit] = ours
    return out


def _mw(v: object) -> float | None:
    return round(v / 1000.0, 2) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def parse_nvml(text: str) -> NvmlLoadSample:
    """The sampler's JSON object as ``NvmlLoadSample`` (each sample a ``GpuState`` with the limits read once)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    try:
        raw = json.loads(lines[-1]) if lines else None
    except ValueError as exc:
        raise ParseError(f"not the NVML sampler's JSON: {exc}", tool="gpu_nvml_under_load", excerpt=text[:80]) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("samples"), list) or not isinstance(raw.get("limits"), list):
        raise ParseError("not the NVML sampler's JSON object", tool="gpu_nvml_under_load", excerpt=text[:80])
    bits = reason_bits({str(k): v for k, v in (raw.get("reason_names") or {}).items() if isinstance(v, int)})
    limits = {int(x["index"]): x for x in raw["limits"] if isinstance(x, dict) and isinstance(x.get("index"), int)}
    samples: list[GpuState] = []
    cost: list[float] = []
    for s in raw["samples"]:
        if not isinstance(s, dict) or not isinstance(s.get("i"), int) or s["i"] not in limits:
            continue
        lim = limits[s["i"]]
        mask = _int(s.get("reasons"))
        mem_total, mem_used = _int(lim.get("mem_total")), _int(lim.get("mem_used"))
        pstate = _int(s.get("pstate"))
        ecc = _int(lim.get("ecc"))
        samples.append(GpuState(
            index=s["i"], name=str(lim.get("name") or ""), uuid=str(lim.get("uuid") or ""),
            bus_id=str(lim.get("bus_id") or ""), driver_version=str(raw.get("driver") or ""),
            pstate=f"P{pstate}" if pstate is not None and pstate < 32 else "",
            sm_clock=_int(s.get("sm")), sm_clock_max=_int(lim.get("sm_max")), mem_clock=_int(s.get("mem")),
            mem_clock_max=_int(lim.get("mem_max")), power_draw=_mw(s.get("power_mw")),
            power_limit=_mw(lim.get("power_limit_mw")), power_limit_max=_mw(lim.get("power_max_mw")),
            temperature=_int(s.get("temp")), utilization=_int(s.get("util")),
            memory_used=mem_used // 1048576 if mem_used is not None else None,
            memory_total=mem_total // 1048576 if mem_total is not None else None,
            pcie_gen=_int(s.get("gen")), pcie_gen_max=_int(lim.get("gen_max")), pcie_width=_int(s.get("width")),
            pcie_width_max=_int(lim.get("width_max")), event_reasons_mask=mask,
            event_reasons=[name for bit, name in sorted(bits.items()) if mask is not None and mask & bit],
            persistence={1: "Enabled", 0: "Disabled"}.get(_int(lim.get("persistence")), ""),  # type: ignore[arg-type]
            ecc={1: "Enabled", 0: "Disabled"}.get(ecc, "") if ecc is not None else "",
        ))
        if isinstance(s.get("ns"), int):
            cost.append(s["ns"] / 1000.0)
    if not samples:
        raise ParseError("no GPU samples were taken while the load ran (did it exit at once?)", tool="gpu_nvml_under_load")
    loaded = [s for s in samples if "gpu_idle" not in s.event_reasons and (s.utilization or 0) > 0]
    procs = [NvmlProcess.model_validate(p) for p in raw.get("processes") or [] if isinstance(p, dict)]
    return NvmlLoadSample(samples=samples, loaded=loaded, api=raw.get("api") if isinstance(raw.get("api"), str) else None,
                          processes=procs, sample_us=round(statistics.median(cost), 1) if cost else None,
                          rounds=_int(raw.get("rounds")) or 1)


def parse_under_load(text: str) -> NvmlLoadSample:
    """What ``gpu_nvml_under_load`` printed: the NVML sampler's JSON object, or, where no interpreter imported
    ``pynvml``, the ``nvidia-smi`` rows of the fallback (``source`` says which)."""
    last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), "")
    if last.lstrip().startswith("{"):
        return parse_nvml(text)
    smi = parse_load_samples(text)
    return NvmlLoadSample(samples=smi.samples, loaded=smi.loaded, source="nvidia-smi")
