"""GPU tools: ``nvidia-smi`` queries and their parsers (declared as tools by ``tools.probes.gpu``).

Older drivers name the clock reasons "Clocks Throttle Reasons" (``clocks_throttle_reasons``);
newer ones "Clocks Event Reasons" (``clocks_event_reasons``). Both parse to the same names.
The query asks for ``clocks_throttle_reasons.active``, which every driver accepts (newer
ones print it as ``clocks_event_reasons.active`` in the header).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError, parser
from .transport import q, split_lines

# Bit values of NVML's nvmlClocksEventReasons (and the older nvmlClocksThrottleReasons).
EVENT_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# How ``nvidia-smi -q`` spells each reason.
Q_REASON_NAMES = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clock_setting",
}

QUERY_FIELDS: list[tuple[str, str]] = [
    # (query name, model field)
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("pci.bus_id", "bus_id"),
    ("driver_version", "driver_version"),
    ("pstate", "pstate"),
    ("clocks.sm", "sm_clock"),
    ("clocks.max.sm", "sm_clock_max"),
    ("clocks.mem", "mem_clock"),
    ("clocks.max.mem", "mem_clock_max"),
    ("power.draw", "power_draw"),
    ("power.limit", "power_limit"),
    ("power.max_limit", "power_limit_max"),
    ("temperature.gpu", "temperature"),
    ("utilization.gpu", "utilization"),
    ("memory.used", "memory_used"),
    ("memory.total", "memory_total"),
    ("pcie.link.gen.current", "pcie_gen"),
    ("pcie.link.gen.max", "pcie_gen_max"),
    ("pcie.link.width.current", "pcie_width"),
    ("pcie.link.width.max", "pcie_width_max"),
    ("clocks_throttle_reasons.active", "event_reasons_mask"),
    ("persistence_mode", "persistence"),
    ("ecc.mode.current", "ecc"),
]
# Header names nvidia-smi prints (without units) -> model field.
HEADER_ALIASES: dict[str, str] = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "pci.bus_id": "bus_id",
    "driver_version": "driver_version",
    "pstate": "pstate",
    "clocks.current.sm": "sm_clock",
    "clocks.sm": "sm_clock",
    "clocks.max.sm": "sm_clock_max",
    "clocks.current.memory": "mem_clock",
    "clocks.mem": "mem_clock",
    "clocks.max.memory": "mem_clock_max",
    "clocks.max.mem": "mem_clock_max",
    "power.draw": "power_draw",
    "power.limit": "power_limit",
    "power.max_limit": "power_limit_max",
    "temperature.gpu": "temperature",
    "utilization.gpu": "utilization",
    "memory.used": "memory_used",
    "memory.total": "memory_total",
    "pcie.link.gen.current": "pcie_gen",
    "pcie.link.gen.gpucurrent": "pcie_gen",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width",
    "pcie.link.width.max": "pcie_width_max",
    "clocks_event_reasons.active": "event_reasons_mask",
    "clocks_throttle_reasons.active": "event_reasons_mask",
    "persistence_mode": "persistence",
    "ecc.mode.current": "ecc",
}

INT_FIELDS = {"index", "sm_clock", "sm_clock_max", "mem_clock", "mem_clock_max", "temperature", "utilization",
              "memory_used", "memory_total", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"}
FLOAT_FIELDS = {"power_draw", "power_limit", "power_limit_max"}


def decode_reasons(mask: int) -> list[str]:
    """Names of the set bits of a clock event (throttle) reason mask."""
    return [name for bit, name in EVENT_REASON_BITS.items() if mask & bit]


class GpuBase(BaseModel):
    """What every GPU model holds (the CSV query, ``nvidia-smi -q``, a snapshot): the name, the power
    limits, the PCIe link and the active clock event reasons; ``None`` where it was not read."""

    name: str = ""
    power_limit: float | None = None
    power_limit_max: float | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    event_reasons: list[str] = Field(default_factory=list)


class GpuReading(GpuBase):
    """A GPU read at one moment: ``GpuBase`` and the clocks, power draw and temperature."""

    sm_clock: int | None = None
    sm_clock_max: int | None = None
    mem_clock: int | None = None
    power_draw: float | None = None
    temperature: int | None = None


class GpuState(GpuReading):
    """One GPU as ``nvidia-smi --query-gpu`` reports it; ``None`` where it said [N/A]."""

    model_config = ConfigDict(extra="forbid")

    index: int
    uuid: str = ""
    bus_id: str = ""
    driver_version: str = ""
    pstate: str = ""
    mem_clock_max: int | None = None
    utilization: int | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    event_reasons_mask: int | None = None
    persistence: str = ""
    ecc: str = ""


def _value(field: str, raw: str) -> object:
    raw = raw.strip()
    if raw in ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""):
        return None
    if field == "event_reasons_mask":
        try:
            return int(raw, 16) if raw.lower().startswith("0x") else int(raw)
        except ValueError as exc:
            raise ParseError(f"bad reason mask {raw!r}", tool="gpu_query") from exc
    if field in INT_FIELDS or field in FLOAT_FIELDS:
        m = re.match(r"^(-?[0-9]+(?:\.[0-9]+)?)\s*(?:MHz|W|MiB|%|C|x)?$", raw)
        if not m:
            raise ParseError(f"{field}: expected a number, got {raw!r}", tool="gpu_query", excerpt=raw)
        num = float(m.group(1))
        return int(num) if field in INT_FIELDS else num
    return raw


def _row_to_state(fields: list[str], values: list[str]) -> GpuState:
    data: dict[str, object] = {}
    for field, raw in zip(fields, values, strict=True):
        if field is None or field in data:
            continue
        data[field] = _value(field, raw)
    if data.get("index") is None:
        raise ParseError("a row without a GPU index", tool="gpu_query", excerpt=",".join(values))
    mask = data.get("event_reasons_mask")
    if isinstance(mask, int):
        data["event_reasons"] = decode_reasons(mask)
    return GpuState.model_validate(data)


def _split(line: str) -> list[str]:
    return [c.strip() for c in line.split(",")]


@parser("query_csv")
def parse_query_csv(text: str) -> list[GpuState]:
    """Parse ``nvidia-smi --query-gpu=… --format=csv`` (header with units, values with units)."""
    lines = [ln for ln in split_lines(text) if ln.strip()]
    if not lines:
        raise ParseError("no output", tool="gpu_query")
    header = _split(lines[0])
    fields: list[str] = []
    for h in header:
        base = re.sub(r"\s*\[.*\]$", "", h).strip()
        fields.append(HEADER_ALIASES.get(base))  # type: ignore[arg-type]
    if "index" not in fields:
        raise ParseError("header has no `index` column (is this --format=csv output?)", tool="gpu_query", excerpt=lines[0])
    out = []
    for ln in lines[1:]:
        vals = _split(ln)
        if len(vals) != len(fields):
            raise ParseError(f"row has {len(vals)} columns, header has {len(fields)}", tool="gpu_query", excerpt=ln)
        out.append(_row_to_state(fields, vals))
    return out


@parser("query_noheader")
def parse_query_noheader(text: str, fields: list[str] | None = None) -> list[GpuState]:
    """Parse ``--format=csv,noheader`` rows whose columns are ``QUERY_FIELDS`` in order."""
    names = fields or [f for _, f in QUERY_FIELDS]
    out = []
    for ln in split_lines(text):
        if not ln.strip():
            continue
        vals = _split(ln)
        if len(vals) != len(names):
            raise ParseError(f"row has {len(vals)} columns, expected {len(names)}", tool="gpu_sample", excerpt=ln)
        out.append(_row_to_state(names, vals))
    return out


class GpuQuery(BaseModel):
    """Input of ``gpu_query``: which GPU state fields to read (all of QUERY_FIELDS)."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return "nvidia-smi --query-gpu=" + ",".join(n for n, _ in QUERY_FIELDS) + " --format=csv"


# ---------------------------------------------------------------- nvidia-smi -q
@parser("q_tree")
def parse_q_tree(text: str) -> dict:
    """Parse ``nvidia-smi -q`` into nested dicts by indentation. Lines without ':' open a section."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    gpu_count = 0
    for raw in split_lines(text):
        if not raw.strip() or raw.startswith("=") or raw.startswith("$ ") or raw.startswith("[exit"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else root
        is_gpu = re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$", line)
        if ":" in line and not is_gpu:
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if val == "":
                node: dict = {}
                parent[key] = node
                stack.append((indent, node))
            else:
                parent[key] = val
        else:
            if is_gpu:
                node = {"Bus Id": line[4:].strip()}
                root.setdefault("GPUs", []).append(node)
                gpu_count += 1
            else:
                node = {}
                parent[line] = node
            stack.append((indent, node))
    if "Driver Version" not in root:
        raise ParseError("no `Driver Version` line (is this `nvidia-smi -q` output?)", tool="gpu_q")
    return root


class GpuDetails(GpuBase):
    """What ``nvidia-smi -q`` adds to the CSV query, per GPU."""

    bus_id: str
    reasons_section: str = ""
    power_limit_default: float | None = None
    reset_required: bool | None = None
    ecc_errors_uncorrectable: int | None = None


class DriverInfo(BaseModel):
    driver_version: str
    cuda_version: str = ""
    gpus: list[GpuDetails] = Field(default_factory=list)


def _num(v: object) -> float | None:
    if not isinstance(v, str):
        return None
    m = re.match(r"^(-?[0-9]+(?:\.[0-9]+)?)", v.strip())
    return float(m.group(1)) if m else None


@parser("q")
def parse_q(text: str) -> DriverInfo:
    """Parse ``nvidia-smi -q`` into the driver, CUDA version and per-GPU details."""
    tree = parse_q_tree(text)
    gpus = []
    for g in tree.get("GPUs", []):
        section_name = "Clocks Event Reasons" if "Clocks Event Reasons" in g else (
            "Clocks Throttle Reasons" if "Clocks Throttle Reasons" in g else "")
        reasons: list[str] = []

        def walk(d: dict, out: list[str]) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(v, out)
                elif v == "Active" and k in Q_REASON_NAMES:
                    out.append(Q_REASON_NAMES[k])

        if section_name:
            walk(g[section_name], reasons)
        power = g.get("GPU Power Readings") or g.get("Power Readings") or {}
        pci = g.get("PCI", {})
        link = pci.get("GPU Link Info", {}) if isinstance(pci, dict) else {}
        gen = link.get("PCIe Generation", {})
        width = link.get("Link Width", {})
        reset = g.get("GPU Reset Status", {})
        reset_required = None
        if isinstance(reset, dict) and "Reset Required" in reset:
            reset_required = reset["Reset Required"].lower() in ("yes", "requested")
        ecc_unc = None
        ecc = g.get("ECC Errors", {})
        if isinstance(ecc, dict) and isinstance(ecc.get("Volatile"), dict):
            vals = [_num(v) for k, v in ecc["Volatile"].items() if "Uncorrectable" in k]
            vals = [v for v in vals if v is not None]
            ecc_unc = int(sum(vals)) if vals else None
        gpus.append(GpuDetails(
            bus_id=g.get("Bus Id", ""),
            name=g.get("Product Name", ""),
            event_reasons=reasons,
            reasons_section=section_name,
            power_limit=_num(power.get("Current Power Limit") or power.get("Power Limit")),
            power_limit_default=_num(power.get("Default Power Limit")),
            power_limit_max=_num(power.get("Max Power Limit")),
            pcie_gen=int(_num(gen.get("Current")) or 0) or None,
            pcie_gen_max=int(_num(gen.get("Max")) or 0) or None,
            pcie_width=int(_num(width.get("Current")) or 0) or None,
            pcie_width_max=int(_num(width.get("Max")) or 0) or None,
            reset_required=reset_required,
            ecc_errors_uncorrectable=ecc_unc,
        ))
    return DriverInfo(driver_version=tree["Driver Version"], cuda_version=tree.get("CUDA Version", ""), gpus=gpus)


class GpuQ(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return "nvidia-smi -q"


# ---------------------------------------------------------------- compute processes
class GpuProcess(BaseModel):
    gpu_uuid: str
    pid: int
    process_name: str
    used_memory_mib: int | None = None


class GpuProcesses(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return "nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits"


@parser("compute_apps")
def parse_compute_apps(text: str) -> list[GpuProcess]:
    out = []
    for ln in split_lines(text):
        if not ln.strip() or "No running" in ln:
            continue
        parts = _split(ln)
        if len(parts) != 4:
            raise ParseError("expected gpu_uuid, pid, process_name, used_memory", tool="gpu_processes", excerpt=ln)
        try:
            pid = int(parts[1])
        except ValueError as exc:
            raise ParseError(f"bad pid {parts[1]!r}", tool="gpu_processes", excerpt=ln) from exc
        mem = _num(parts[3])
        out.append(GpuProcess(gpu_uuid=parts[0], pid=pid, process_name=parts[2], used_memory_mib=int(mem) if mem is not None else None))
    return out


# ---------------------------------------------------------------- sampling under load
class GpuSampleUnderLoad(BaseModel):
    """Input of ``gpu_sample_under_load``: run ``load`` (a benchmark) and sample GPUs meanwhile.

    Idle GPUs show low clocks and often PCIe gen 1: a reading taken at idle proves nothing
    about clocks or the link, so clocks and PCIe are read while the benchmark runs.
    """

    model_config = ConfigDict(extra="forbid")

    load: str
    cwd: str | None = None
    seconds: float = 2.0
    interval: float = 0.25
    limit_s: float = 300.0

    attempts: int = 3

    def command(self) -> str:
        """Run the load (repeated until ``seconds`` have passed, and at least once, however long it
        takes: a real benchmark spends seconds importing before the GPU works) and sample the GPUs
        for as long as it runs, up to ``limit_s``. A round in which no sample caught the GPUs busy
        (utilization above 0) proves nothing: the load and the sampling run again, ``attempts``
        rounds at most."""
        fields = ",".join(n for n, _ in QUERY_FIELDS)
        util = [n for n, _ in QUERY_FIELDS].index("utilization.gpu") + 1
        load = self.load if not self.cwd else f"cd {q(self.cwd)} && {self.load}"
        ms = int(self.seconds * 1000)
        loop = (f"e=$(( $(date +%s%3N) + {ms} )); while :; do {load}; "
                f"[ $(date +%s%3N) -ge $e ] && break; done")
        most = int(self.limit_s / max(self.interval, 0.05))
        busy = f"awk -F', ' '${util}+0>0{{f=1}} END{{exit !f}}'"
        return (
            f"for a in $(seq 1 {int(self.attempts)}); do busy=0; "
            f"timeout {self.limit_s:g} bash -c {q(loop)} >/dev/null 2>&1 & b=$!; n=0; "
            f"while kill -0 $b 2>/dev/null && [ $n -lt {most} ]; do "
            f"s=$(nvidia-smi --query-gpu={fields} --format=csv,noheader); printf '%s\\n' \"$s\"; "
            f"printf '%s\\n' \"$s\" | {busy} && busy=1; n=$((n+1)); sleep {self.interval:g}; done; wait $b; "
            f"[ $busy = 1 ] && break; done; true"
        )


class LoadSample(BaseModel):
    samples: list[GpuState]
    loaded: list[GpuState]  # samples where the GPU was busy (not idle)

    def per_gpu(self) -> dict[int, GpuState]:
        """The median-ish busy reading per GPU (the last busy one; idle if never busy)."""
        out: dict[int, GpuState] = {}
        pool = self.loaded or self.samples
        for s in pool:
            out[s.index] = s
        return out


@parser("load_samples")
def parse_load_samples(text: str) -> LoadSample:
    samples = parse_query_noheader(text)
    if not samples:
        raise ParseError("no GPU samples were taken while the load ran (did it exit at once?)", tool="gpu_sample_under_load")
    loaded = [s for s in samples if "gpu_idle" not in s.event_reasons and (s.utilization or 0) > 0]
    return LoadSample(samples=samples, loaded=loaded)


# ---------------------------------------------------------------- nvidia-smi -q -x
# How ``nvidia-smi -q -x`` names each reason after its section's prefix (``clocks_event_reason_`` on newer drivers,
# ``clocks_throttle_reason_`` on older ones).
XML_REASON_NAMES = {
    "gpu_idle": "gpu_idle",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "hw_thermal_slowdown": "hw_thermal_slowdown",
    "hw_power_brake_slowdown": "hw_power_brake_slowdown",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal_slowdown",
    "display_clocks_setting": "display_clock_setting",
    "display_clock_setting": "display_clock_setting",
}
XML_SECTIONS = {"clocks_event_reasons": ("Clocks Event Reasons", "clocks_event_reason_"),
                "clocks_throttle_reasons": ("Clocks Throttle Reasons", "clocks_throttle_reason_")}


class GpuQXml(BaseModel):
    """Input of ``gpu_q_xml``: ``nvidia-smi -q -x``, the ``-q`` report as XML."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return "nvidia-smi -q -x"


def _xml_text(node: object, path: str) -> str | None:
    import xml.etree.ElementTree as ET
    if not isinstance(node, ET.Element):
        return None
    found = node.find(path)
    return found.text.strip() if found is not None and found.text is not None else None


@parser("q_xml")
def parse_q_xml(text: str) -> DriverInfo:
    """Parse ``nvidia-smi -q -x`` into the same ``DriverInfo`` as ``parse_q``: both the ``clocks_event_reasons``
    section of newer drivers and the ``clocks_throttle_reasons`` of older ones, ``gpu_power_readings`` or
    ``power_readings``. The document's DOCTYPE names a DTD that is never fetched (expat does not)."""
    import xml.etree.ElementTree as ET
    body = text[text.find("<"):] if "<" in text else text
    try:
        root = ET.fromstring(body.encode())
    except ET.ParseError as exc:
        raise ParseError(f"not XML: {exc}", tool="gpu_q_xml", excerpt=text[:80]) from exc
    if root.tag != "nvidia_smi_log" or _xml_text(root, "driver_version") is None:
        raise ParseError("no <nvidia_smi_log> with a <driver_version> (is this `nvidia-smi -q -x` output?)",
                         tool="gpu_q_xml", excerpt=text[:80])
    gpus = []
    for g in root.findall("gpu"):
        reasons: list[str] = []
        section_name = ""
        for tag, (name, prefix) in XML_SECTIONS.items():
            sec = g.find(tag)
            if sec is None:
                continue
            section_name = name
            for child in sec:
                key = child.tag.removeprefix(prefix)
                if (child.text or "").strip() == "Active" and key in XML_REASON_NAMES:
                    reasons.append(XML_REASON_NAMES[key])
            break
        power = g.find("gpu_power_readings")
        if power is None:
            power = g.find("power_readings")
        link = g.find("pci/pci_gpu_link_info")
        reset = _xml_text(g, "gpu_reset_status/reset_required")
        unc = [_num(x.text) for x in g.findall("ecc_errors/volatile/*") if "uncorrectable" in x.tag]
        unc_vals = [v for v in unc if v is not None]

        def link_num(path: str, node: ET.Element | None = link) -> int | None:
            v = _num(_xml_text(node, path)) if node is not None else None
            return int(v) if v else None

        gpus.append(GpuDetails(
            bus_id=g.get("id") or _xml_text(g, "pci/pci_bus_id") or "",
            name=_xml_text(g, "product_name") or "",
            event_reasons=reasons,
            reasons_section=section_name,
            power_limit=_num(_xml_text(power, "current_power_limit") or _xml_text(power, "power_limit")),
            power_limit_default=_num(_xml_text(power, "default_power_limit")),
            power_limit_max=_num(_xml_text(power, "max_power_limit")),
            pcie_gen=link_num("pcie_gen/current_link_gen"), pcie_gen_max=link_num("pcie_gen/max_link_gen"),
            pcie_width=link_num("link_widths/current_link_width"), pcie_width_max=link_num("link_widths/max_link_width"),
            reset_required=reset.lower() in ("yes", "requested") if reset else None,
            ecc_errors_uncorrectable=int(sum(unc_vals)) if unc_vals else None,
        ))
    return DriverInfo(driver_version=_xml_text(root, "driver_version") or "",
                      cuda_version=_xml_text(root, "cuda_version") or "", gpus=gpus)


# ---------------------------------------------------------------- Xid errors in the kernel log
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")
XID_UNREADABLE = "unreadable: "


class GpuXid(BaseModel):
    """Input of ``gpu_xid``: the GPU driver's Xid lines of the kernel log (``dmesg``, read-only). A log this user
    may not read (``kernel.dmesg_restrict``) is answered ``unreadable: WHY``, not an error."""

    model_config = ConfigDict(extra="forbid")
    last: int = 200

    def command(self) -> str:
        return ("if out=$(LC_ALL=C dmesg 2>&1); then echo readable; printf '%s\\n' \"$out\" | "
                f"grep -E 'NVRM: Xid' | tail -n {int(self.last)}; "
                f"else printf '{XID_UNREADABLE}%s\\n' \"$(printf '%s' \"$out\" | head -c 300 | tr '\\n' ' ')\"; fi")


class Xid(BaseModel):
    pci: str
    code: int
    text: str
    line: str


class XidReport(BaseModel):
    readable: bool
    why: str = ""
    xids: list[Xid] = Field(default_factory=list)


def parse_xid(inp: GpuXid, r: object) -> XidReport:
    """``gpu_xid``'s answer: whether the kernel log was readable, and each Xid line (PCI address, code, text)."""
    stdout = getattr(r, "stdout", "") or ""
    lines = [ln for ln in split_lines(stdout) if ln.strip()]
    if not lines:
        raise ParseError("no answer (is this the gpu_xid command's output?)", tool="gpu_xid")
    if lines[0].startswith(XID_UNREADABLE):
        return XidReport(readable=False, why=lines[0][len(XID_UNREADABLE):].strip())
    if lines[0].strip() != "readable":
        raise ParseError("expected `readable` or `unreadable: …` first", tool="gpu_xid", excerpt=lines[0])
    out = []
    for ln in lines[1:]:
        m = XID_RE.search(ln)
        if m:
            out.append(Xid(pci=m.group(1), code=int(m.group(2)), text=m.group(3).strip(), line=ln.strip()))
    return XidReport(readable=True, xids=out)
