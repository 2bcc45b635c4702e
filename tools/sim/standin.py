"""What a simulated host's ``nvidia-smi`` prints, computed by its controller (outside the host).

The ``nvidia-smi`` inside the host is a small client (``guest/client.py``) that sends its
arguments to the controller and prints the reply; the formats follow the H200 captures in
``tests/vectors/h200``. ``ctl`` is the controller's view of the host: ``host``, ``gpu(i)``,
``save_override``, ``loaded()``, ``servers()`` (pid as the host sees it, argv, env), ``driver_old()``.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

REASON_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}


class HostView(Protocol):
    """What nvidia-smi reads of the host and writes back (tools/sim/controller.py's ``Controller``)."""

    host: dict[str, Any]   # the scenario's host state, as tools/sim/scenario.py dumps it

    def gpu(self, i: int) -> dict[str, Any]: ...
    def save_override(self, i: int, key: str, value: object) -> None: ...
    def loaded(self) -> bool: ...
    def servers(self) -> list[tuple[int, list[str], dict[str, str]]]: ...
    def driver_old(self) -> bool: ...


ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr


def so_bytes(name: str, version: str, build: str | None, salt: str = "") -> bytes:
    """The bytes of a distribution's compiled file: an ELF64 shared object's header, then bytes keyed by the
    host's random salt over name, version and build. They change with the build, as a rebuilt file's do, and
    hold nothing a probe could read the build from: no name, version or label, no period, a size that
    varies; without the salt (outside every sealed host) no build can be mapped to its bytes."""
    label = build or f"v{version}"
    key = hmac.new(salt.encode(), f"{name}\0{version}\0{label}".encode(), hashlib.sha256).digest()
    size = 8192 + 64 * (int.from_bytes(key[:2], "little") % 384)   # 8 KiB .. 32 KiB
    header = ELF_HEADER.pack(b"\x7fELF\x02\x01\x01\x00" + bytes(8), 3, 0x3E, 1, 0, 64, size - 64 * 12, 0, 64, 56, 0,
                             64, 12, 11)
    return header + hashlib.shake_256(key).digest(size - len(header))


# ---------------------------------------------------------------- nvidia-smi
UNITS = {"clocks.sm": "MHz", "clocks.current.sm": "MHz", "clocks.max.sm": "MHz", "clocks.mem": "MHz",
         "clocks.current.memory": "MHz", "clocks.max.mem": "MHz", "clocks.max.memory": "MHz", "clocks.gr": "MHz",
         "clocks.current.graphics": "MHz", "power.draw": "W", "power.limit": "W", "enforced.power.limit": "W",
         "power.max_limit": "W", "power.default_limit": "W", "utilization.gpu": "%", "utilization.memory": "%",
         "memory.used": "MiB", "memory.total": "MiB", "memory.free": "MiB"}
CANON = {"clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory", "clocks.max.mem": "clocks.max.memory",
         "clocks.gr": "clocks.current.graphics", "gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}


def gpu_view(ctl: HostView, i: int, loaded: bool) -> dict:
    g = ctl.gpu(i)
    servers = ctl.servers()
    used = int(g["memory_mib"] * 0.88) if servers else 0
    used += sum(p["used_memory_mib"] for p in ctl.host.get("gpu_processes", []) if p.get("gpu", 0) == i)
    lock_sm, lock_mem = g.get("locked_sm_clock"), g.get("locked_mem_clock")
    mem = g["mem_clock"]
    if loaded:
        reasons = list(g.get("event_reasons", []))
        sm, power, temp, gen, util = g["sm_clock"], g["power_draw"], g["temperature"], g["pcie_gen"], 97
        # a lock below the clock the GPU would run at holds it there, and says so (NVML's applications-clocks reason)
        if lock_sm and int(lock_sm) < sm or lock_mem and int(lock_mem) < mem:
            sm, mem = min(sm, int(lock_sm or sm)), min(mem, int(lock_mem or mem))
            reasons = [*reasons, "applications_clocks_setting"]
    else:
        reasons = ["gpu_idle"]
        sm, power, temp, gen, util = 345, 79.62 + 0.31 * i, max(30, g["temperature"] - 14), 1, 0
        # an idle GPU sits at a lock's MIN
        sm = int(g.get("locked_sm_clock_min") or lock_sm or sm)
        mem = int(g.get("locked_mem_clock_min") or lock_mem or mem)
    mask = 0
    for r in reasons:
        mask |= REASON_BITS.get(r, 0)
    return {
        "index": str(i), "name": g["name"], "uuid": "GPU-" + hashlib.md5(f"{ctl.host['hostname']}{i}".encode()).hexdigest()[:8]
        + "-bfc3-9e86-112e-e6cf153df3fe", "pci.bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
        "driver_version": ctl.host["driver"]["version"], "vbios_version": "96.00.A5.00.1A",
        "persistence_mode": "Enabled", "compute_mode": "Default", "pstate": "P0",
        "clocks.current.sm": sm, "clocks.max.sm": g["sm_clock_max"], "clocks.current.memory": mem,
        "clocks.max.memory": g["mem_clock"], "clocks.current.graphics": sm,
        "power.draw": f"{power:.2f}", "power.limit": f"{g['power_limit']:.2f}", "enforced.power.limit": f"{g['power_limit']:.2f}",
        "power.max_limit": f"{g['power_limit_max']:.2f}", "power.default_limit": f"{g['power_limit_max']:.2f}",
        "temperature.gpu": temp, "temperature.memory": max(30, temp - 3), "utilization.gpu": util,
        "utilization.memory": util // 3, "memory.used": used, "memory.total": g["memory_mib"],
        "memory.free": g["memory_mib"] - used,
        "pcie.link.gen.current": gen, "pcie.link.gen.gpucurrent": gen, "pcie.link.gen.max": g["pcie_gen_max"],
        "pcie.link.gen.gpumax": g["pcie_gen_max"], "pcie.link.gen.hostmax": "[N/A]",
        "pcie.link.width.current": g["pcie_width"], "pcie.link.width.max": g["pcie_width_max"],
        "clocks_event_reasons.active": f"0x{mask:016X}", "clocks_throttle_reasons.active": f"0x{mask:016X}",
        "ecc.mode.current": "Enabled", "mig.mode.current": "Disabled", "compute_cap": "9.0",
        "reset_status.reset_required": "Yes" if g.get("reset_required") else "No",
        "timestamp": datetime.now(UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
        "_reasons": reasons, "_raw": g,
    }


def nvsmi(ctl: HostView, args: list[str], out: TextIO, err: TextIO) -> int:
    fmt = ""
    query = None
    apps = None
    index = None
    i = 0
    pl = None
    lgc: str | None = None
    lmc: str | None = None
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1].split(",")
        elif a.startswith("--query-compute-apps="):
            apps = a.split("=", 1)[1].split(",")
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a in ("-i", "--id"):
            index = int(args[i + 1])
            i += 1
        elif a.startswith("--id="):
            index = int(a.split("=", 1)[1])
        elif a in ("-pl", "--power-limit"):
            pl = float(args[i + 1])
            i += 1
        elif a in ("-lgc", "--lock-gpu-clocks") and i + 1 < len(args):
            lgc = args[i + 1]
            i += 1
        elif a.startswith("--lock-gpu-clocks="):
            lgc = a.split("=", 1)[1]
        elif a in ("-rgc", "--reset-gpu-clocks"):
            lgc = ""
        elif a in ("-lmc", "--lock-memory-clocks") and i + 1 < len(args):
            lmc = args[i + 1]
            i += 1
        elif a.startswith("--lock-memory-clocks="):
            lmc = a.split("=", 1)[1]
        elif a in ("-rmc", "--reset-memory-clocks"):
            lmc = ""
        elif a in ("-q", "--query"):
            query = query or ["-q"]
        elif a in ("-d", "--display"):
            i += 1
        elif a in ("-lms", "-l", "--loop-ms", "--loop"):
            i += 1
        i += 1
    n = len(ctl.host["gpus"])
    indices = [index] if index is not None else list(range(n))
    if index is not None and index >= n:
        print(f"No devices were found matching the index {index}", file=err)
        return 6
    if lgc is not None:
        return lock_clocks(ctl, indices, lgc, out, err)
    if lmc is not None:
        return lock_clocks(ctl, indices, lmc, out, err, "mem")
    if pl is not None:
        for idx in indices:
            g = ctl.gpu(idx)
            if pl > g["power_limit_max"] or pl < 200:
                print(f"Provided power limit {pl:.2f} W is not a valid power limit which should be between "
                      f"200.00 W and {g['power_limit_max']:.2f} W for GPU 00000000:{0x18 + 0x10 * idx:02X}:00.0", file=err)
                return 2
            old = g["power_limit"]
            ctl.save_override(idx, "power_limit", pl)
            print(f"Power limit for GPU 00000000:{0x18 + 0x10 * idx:02X}:00.0 was set to {pl:.2f} W from {old:.2f} W.", file=out)
        print("All done.", file=out)
        return 0
    loaded = ctl.loaded()
    if apps is not None:
        rows = []
        for idx in indices:
            v = gpu_view(ctl, idx, loaded)
            for pid, argv, _env in ctl.servers():
                rows.append({"gpu_uuid": v["uuid"], "pid": pid, "process_name": argv[0] if argv else "python3",
                             "used_memory": int(v["_raw"]["memory_mib"] * 0.88), "gpu_bus_id": v["pci.bus_id"]})
            for p in ctl.host.get("gpu_processes", []):
                if p.get("gpu", 0) == idx:
                    rows.append({"gpu_uuid": v["uuid"], "pid": p["pid"], "process_name": p["name"],
                                 "used_memory": p["used_memory_mib"], "gpu_bus_id": v["pci.bus_id"]})
        nounits = "nounits" in fmt
        if "noheader" not in fmt:
            print(", ".join(f + (" [MiB]" if f == "used_memory" and not nounits else "") for f in apps), file=out)
        for r in rows:
            vals = []
            for f in apps:
                if f not in r:
                    print(f'Field "{f}" is not a valid field to query.', file=err)
                    return 2
                val = r[f]
                vals.append(f"{val} MiB" if f == "used_memory" and not nounits else str(val))
            print(", ".join(vals), file=out)
        return 0
    if query == ["-q"]:
        print(q_text(ctl, indices, loaded), file=out)
        return 0
    if query:
        views = [gpu_view(ctl, idx, loaded) for idx in indices]
        names = []
        for f in query:
            c = CANON.get(f, f)
            if c not in views[0] or c.startswith("_"):
                print(f'Field "{f}" is not a valid field to query.', file=err)
                print("\nPlease run 'nvidia-smi --help-query-gpu' for more information.", file=err)
                return 2
            names.append(c)
        nounits = "nounits" in fmt
        if "noheader" not in fmt:
            hdr = []
            for c in names:
                shown = c
                if c in ("clocks_throttle_reasons.active", "clocks_event_reasons.active"):
                    shown = "clocks_throttle_reasons.active" if ctl.driver_old() else "clocks_event_reasons.active"
                hdr.append(shown + (f" [{UNITS[c]}]" if c in UNITS else ""))
            print(", ".join(hdr), file=out)
        for v in views:
            vals = []
            for c in names:
                val = v[c]
                vals.append(f"{val} {UNITS[c]}" if c in UNITS and not nounits else str(val))
            print(", ".join(vals), file=out)
        return 0
    print(table(ctl, loaded), file=out)
    return 0


def lock_clocks(ctl: HostView, indices: list[int], spec: str, out: TextIO, err: TextIO, which: str = "sm") -> int:
    """``-lgc MIN,MAX`` (``-lmc`` for memory, ``which`` "mem") holds the clock between MIN and MAX: at most MAX under
    load, MIN at idle; one value is MIN and MAX; ``-rgc`` / ``-rmc`` (spec "") resets it."""
    clocks: tuple[int, int] | None = None
    flag = "-lgc" if which == "sm" else "-lmc"
    if spec:
        try:
            parts = [int(x) for x in spec.split(",")]
            lo, hi = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])
            if len(parts) > 2:
                raise ValueError(spec)
        except ValueError:
            print(f"Invalid clock values: {spec}; give MIN,MAX in MHz, e.g. {flag} 1980,1980", file=err)
            return 2
        if lo > hi:
            print("Invalid clock values: MIN is above MAX", file=err)
            return 2
        clocks = (lo, hi)
    key = "locked_sm_clock" if which == "sm" else "locked_mem_clock"
    what = "GPU" if which == "sm" else "Memory"
    for idx in indices:
        bus = f"00000000:{0x18 + 0x10 * idx:02X}:00.0"
        if clocks is not None:
            lo, hi = clocks
            ctl.save_override(idx, key, hi)
            ctl.save_override(idx, key + "_min", lo)
            print(f"{what} clocks set to \"({'gpuClkMin' if which == 'sm' else 'memClkMin'} {lo}, "
                  f"{'gpuClkMax' if which == 'sm' else 'memClkMax'} {hi})\" for GPU {bus}", file=out)
        else:
            ctl.save_override(idx, key, None)
            ctl.save_override(idx, key + "_min", None)
            print(f"All done.\n{what} clocks reset to default for GPU {bus}", file=out)
    if spec:
        print("All done.", file=out)
    return 0


def _line(indent: int, key: str, value: object | None = None) -> str:
    head = " " * indent + key
    return head if value is None else head.ljust(55) + f": {value}"


def q_text(ctl: HostView, indices: list[int], loaded: bool) -> str:
    old = ctl.driver_old()
    d = ctl.host["driver"]
    out = ["", "==============NVSMI LOG==============", "",
           _line(0, "Timestamp", datetime.now(UTC).strftime("%a %b %d %H:%M:%S %Y")),
           _line(0, "Driver Version", d["version"]), _line(0, "CUDA Version", d["cuda"]), "",
           _line(0, "Attached GPUs", len(ctl.host["gpus"]))]
    for idx in indices:
        v = gpu_view(ctl, idx, loaded)
        g = v["_raw"]
        act = lambda r, _v=v: "Active" if r in _v["_reasons"] else "Not Active"  # noqa: E731
        out += [f"GPU {v['pci.bus_id']}", _line(4, "Product Name", v["name"]), _line(4, "Product Brand", "NVIDIA"),
                _line(4, "Product Architecture", "Hopper"), _line(4, "Persistence Mode", "Enabled"),
                _line(4, "GPU UUID", v["uuid"]), _line(4, "Minor Number", idx), _line(4, "VBIOS Version", v["vbios_version"]),
                _line(4, "GPU Reset Status"), _line(8, "Reset Required", "Yes" if g.get("reset_required") else "No"),
                _line(8, "Drain and Reset Recommended", "No"),
                _line(4, "PCI"), _line(8, "Bus Id", v["pci.bus_id"]), _line(8, "GPU Link Info"),
                _line(12, "PCIe Generation"), _line(16, "Max", g["pcie_gen_max"]), _line(16, "Current", v["pcie.link.gen.current"]),
                _line(16, "Device Current", v["pcie.link.gen.current"]), _line(16, "Device Max", g["pcie_gen_max"]),
                _line(16, "Host Max", "N/A"), _line(12, "Link Width"), _line(16, "Max", f"{g['pcie_width_max']}x"),
                _line(16, "Current", f"{g['pcie_width']}x"), _line(8, "Replays Since Reset", 0),
                _line(4, "Fan Speed", "N/A"), _line(4, "Performance State", "P0"),
                _line(4, "Clocks Throttle Reasons" if old else "Clocks Event Reasons"),
                _line(8, "Idle", act("gpu_idle")), _line(8, "Applications Clocks Setting", act("applications_clocks_setting")),
                _line(8, "SW Power Cap", act("sw_power_cap")), _line(8, "HW Slowdown", act("hw_slowdown")),
                _line(12, "HW Thermal Slowdown", act("hw_thermal_slowdown")),
                _line(12, "HW Power Brake Slowdown", act("hw_power_brake_slowdown")),
                _line(8, "Sync Boost", act("sync_boost")), _line(8, "SW Thermal Slowdown", act("sw_thermal_slowdown")),
                _line(8, "Display Clock Setting", act("display_clock_setting")),
                _line(4, "FB Memory Usage"), _line(8, "Total", f"{g['memory_mib']} MiB"), _line(8, "Reserved", "616 MiB"),
                _line(8, "Used", f"{v['memory.used']} MiB"), _line(8, "Free", f"{v['memory.free']} MiB"),
                _line(4, "Compute Mode", "Default"), _line(4, "Utilization"), _line(8, "GPU", f"{v['utilization.gpu']} %"),
                _line(8, "Memory", f"{v['utilization.memory']} %"),
                _line(4, "ECC Mode"), _line(8, "Current", "Enabled"), _line(8, "Pending", "Enabled"),
                _line(4, "ECC Errors"), _line(8, "Volatile"), _line(12, "SRAM Correctable", 0),
                _line(12, "SRAM Uncorrectable Parity", 0), _line(12, "DRAM Correctable", 0), _line(12, "DRAM Uncorrectable", 0),
                _line(4, "Temperature"), _line(8, "GPU Current Temp", f"{v['temperature.gpu']} C"),
                _line(4, "Power Readings" if old else "GPU Power Readings"),
                _line(8, "Average Power Draw", f"{v['power.draw']} W"), _line(8, "Instantaneous Power Draw", f"{v['power.draw']} W"),
                _line(8, "Power Limit" if old else "Current Power Limit", f"{g['power_limit']:.2f} W"),
                _line(8, "Default Power Limit", f"{g['power_limit_max']:.2f} W"),
                _line(8, "Min Power Limit", "200.00 W"), _line(8, "Max Power Limit", f"{g['power_limit_max']:.2f} W"),
                _line(4, "Clocks"), _line(8, "Graphics", f"{v['clocks.current.sm']} MHz"), _line(8, "SM", f"{v['clocks.current.sm']} MHz"),
                _line(8, "Memory", f"{g['mem_clock']} MHz"), _line(4, "Max Clocks"), _line(8, "Graphics", f"{g['sm_clock_max']} MHz"),
                _line(8, "SM", f"{g['sm_clock_max']} MHz"), _line(8, "Memory", f"{g['mem_clock']} MHz"),
                _line(4, "Processes", "None" if not ctl.servers() else "")]
    return "\n".join(out) + "\n"


def table(ctl: HostView, loaded: bool) -> str:
    d = ctl.host["driver"]
    lines = [datetime.now(UTC).strftime("%a %b %d %H:%M:%S %Y       "), "+" + "-" * 89 + "+",
             f"| NVIDIA-SMI {d['version']:<22} Driver Version: {d['version']:<14} CUDA Version: {d['cuda']:<9}|",
             "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"]
    for i in range(len(ctl.host["gpus"])):
        v = gpu_view(ctl, i, loaded)
        lines.append(f"| {i:>3}  {v['name']:<26}          On  |   {v['pci.bus_id']} Off |                    0 |")
        lines.append(f"| N/A   {v['temperature.gpu']}C    P0  {float(v['power.draw']):>15.0f}W / {float(v['power.limit']):>4.0f}W |"
                     f" {v['memory.used']:>8}MiB / {v['memory.total']}MiB | {v['utilization.gpu']:>8}%      Default |")
    lines.append("+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+")
    return "\n".join(lines)
