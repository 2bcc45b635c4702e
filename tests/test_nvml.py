"""GPUs read through NVML with the host's Python, ``nvidia-smi -q -x``, and the Xid lines of the kernel log.

The sampler runs for real (a real interpreter, a real load, the very command the tool sends); where no GPU is
present its ``pynvml`` is a module written here that answers as NVML's binding does, with only the deprecated
``…ThrottleReason…`` names, as older bindings have. The H200 captures are in ``tests/vectors/h200``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from debugagent.tools.errors import ParseError
from debugagent.tools.gpu import GpuXid, parse_q, parse_q_xml, parse_xid
from debugagent.tools.nvml import (
    SMI_MARK,
    GpuNvmlUnderLoad,
    NvmlLoadSample,
    parse_nvml,
    parse_under_load,
    reason_bits,
)
from debugagent.tools.probes.gpu import gpu_view
from debugagent.tools.transport import CommandResult

from tests.conftest import vector

H200 = Path(__file__).parent / "vectors" / "h200"

FAKE_PYNVML = '''
"""Answers as nvidia-ml-py's pynvml does on a power-capped GPU at PCIe gen 4; only the deprecated names."""
import os
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
nvmlClocksThrottleReasonGpuIdle = 1
nvmlClocksThrottleReasonApplicationsClocksSetting = 2
nvmlClocksThrottleReasonSwPowerCap = 4
nvmlClocksThrottleReasonHwSlowdown = 8
nvmlClocksThrottleReasonSwThermalSlowdown = 32
nvmlClocksThrottleReasonHwThermalSlowdown = 64
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 128
nvmlClocksThrottleReasonAll = 511
class NVMLError(Exception):
    pass
class _O:
    def __init__(self, **kw):
        self.__dict__.update(kw)
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "550.54.15"
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA H200"
def nvmlDeviceGetUUID(h): return "GPU-0000"
def nvmlDeviceGetPciInfo(h): return _O(busId=b"00000000:00:06.0")
def nvmlDeviceGetMaxClockInfo(h, t): return 1980 if t == 1 else 3201
def nvmlDeviceGetEnforcedPowerLimit(h): return 500000
def nvmlDeviceGetPowerManagementLimitConstraints(h): return (200000, 700000)
def nvmlDeviceGetMaxPcieLinkGeneration(h): return 5
def nvmlDeviceGetMaxPcieLinkWidth(h): return 16
def nvmlDeviceGetMemoryInfo(h): return _O(total=150754820096, used=2268 * 1048576)
def nvmlDeviceGetPersistenceMode(h): return 1
def nvmlDeviceGetEccMode(h): return (1, 1)
def nvmlDeviceGetClockInfo(h, t): return 1755 if t == 1 else 3201
def nvmlDeviceGetCurrentClocksThrottleReasons(h): return 0x4 | 0x2
def nvmlDeviceGetPowerUsage(h): return 499000
def nvmlDeviceGetTemperature(h, t): return 61
def nvmlDeviceGetUtilizationRates(h): return _O(gpu=97, memory=40)
def nvmlDeviceGetPerformanceState(h): return 0
def nvmlDeviceGetCurrPcieLinkGeneration(h): return 4
def nvmlDeviceGetCurrPcieLinkWidth(h): return 16
def nvmlDeviceGetComputeRunningProcesses(h): return [_O(pid=os.getppid(), usedGpuMemory=1724907520)]
def nvmlDeviceGetPcieThroughput(h, c): raise AssertionError("never sampled")
'''

# one busy row of the nvidia-smi sampler (the H200's, power-capped to 500 W)
SMI_ROW = ("0, NVIDIA H200, GPU-0000, 00000000:00:06.0, 550.54.15, P0, 1755 MHz, 1980 MHz, 3201 MHz, 3201 MHz, "
           "499.00 W, 500.00 W, 700.00 W, 61, 97 %, 2268 MiB, 143771 MiB, 4, 5, 16, 16, 0x0000000000000006, "
           "Enabled, Enabled")


@pytest.fixture
def host_bin(tmp_path: Path) -> Path:
    """A folder put first on PATH: ``nvidia-smi`` printing ``SMI_ROW``, ``python3`` without site-packages (so it
    cannot import pynvml), and ``nvml-python``, an interpreter whose pynvml is ``FAKE_PYNVML``."""
    b = tmp_path / "bin"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pynvml.py").write_text(FAKE_PYNVML)
    b.mkdir()
    scripts = {
        "nvidia-smi": f"#!/bin/sh\necho '{SMI_ROW}'\n",
        "python3": f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n",
        # -I (the first argument) ignores PYTHONPATH: drop it so the fake module is found
        "nvml-python": f"#!/bin/sh\nshift\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} -S \"$@\"\n",
    }
    for name, text in scripts.items():
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    return b


def _run(command: str, path: Path) -> CommandResult:
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    return CommandResult(command=command, stdout=p.stdout, stderr=p.stderr, exit_code=p.returncode, duration_ms=0.0, host="local")


def test_h200_nvml_capture_parses_to_gpu_states():
    """The sampler's output on the H200: idle at 345 MHz while PyTorch started, then busy at 1980 MHz, no reason;
    the limits read once; the benchmark's process by pid; the reasons API of current bindings."""
    out = parse_nvml((H200 / "nvml_under_load.json").read_text())
    assert out.source == "nvml" and out.api == "nvmlDeviceGetCurrentClocksEventReasons"
    assert len(out.samples) == 76 and out.loaded
    busy = out.per_gpu()[0]
    assert (busy.sm_clock, busy.sm_clock_max, busy.mem_clock_max) == (1980, 1980, 3201)
    assert (busy.power_limit, busy.power_limit_max) == (700.0, 700.0)
    assert (busy.pcie_gen, busy.pcie_gen_max, busy.pcie_width, busy.pcie_width_max) == (5, 5, 16, 16)
    assert busy.event_reasons == [] and busy.driver_version == "580.159.04" and busy.pstate == "P0"
    assert out.samples[0].event_reasons == ["gpu_idle"]
    assert [(p.pid, p.used_mib) for p in out.processes] == [(644, 1644)]
    assert out.sample_us is not None and out.sample_us < 5000


def test_reason_bits_under_either_prefix():
    """The module's own constants decide the bits, under the current or the deprecated prefix; masks (All, None)
    are not reasons."""
    event = reason_bits({"nvmlClocksEventReasonSwPowerCap": 4, "nvmlClocksEventReasonAll": 511,
                         "nvmlClocksEventReasonNone": 0})
    throttle = reason_bits({"nvmlClocksThrottleReasonSwPowerCap": 4, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": 128})
    assert event[4] == throttle[4] == "sw_power_cap" and throttle[128] == "hw_power_brake_slowdown"
    assert 511 not in event and 0 not in event
    raw = json.loads((H200 / "nvml_under_load.json").read_text())
    raw["reason_names"] = {k: v for k, v in raw["reason_names"].items() if "Throttle" in k}
    for s, mask in zip(raw["samples"], (0x2, 0x4, 0x8, 0x80, 0x20, 0x40), strict=False):
        s["reasons"] = mask
    got = [s.event_reasons for s in parse_nvml(json.dumps(raw)).samples[:6]]
    assert got == [["applications_clocks_setting"], ["sw_power_cap"], ["hw_slowdown"], ["hw_power_brake_slowdown"],
                   ["sw_thermal_slowdown"], ["hw_thermal_slowdown"]]


def test_sampler_runs_with_the_servers_python_and_matches_nvidia_smi_in_shape(host_bin: Path):
    """The command the tool sends, run for real: with an interpreter that imports pynvml (deprecated names only) it
    reads through NVML at 10 Hz while the load runs; with none it samples with nvidia-smi in the same call. Both give
    the same GPU fields, and the rules see the same facts (power capped, limit lowered, PCIe degraded under load)."""
    inp = dict(load="sleep 0.4", seconds=0.4, attempts=1)
    nv = _run(GpuNvmlUnderLoad(python="nvml-python", **inp).command(), host_bin)
    assert nv.exit_code == 0, nv.stderr
    a = parse_under_load(nv.stdout)
    smi = _run(GpuNvmlUnderLoad(python="/nonexistent/python3", **inp).command(), host_bin)
    assert smi.exit_code == 0 and SMI_MARK in smi.stderr and "pynvml not importable" in smi.stderr
    b = parse_under_load(smi.stdout)
    assert (a.source, b.source) == ("nvml", "nvidia-smi") and a.api == "nvmlDeviceGetCurrentClocksThrottleReasons"
    assert len(a.samples) >= 2 and a.processes and a.processes[0].used_mib == 1645
    ga, gb = a.per_gpu()[0], b.per_gpu()[0]
    assert ga.model_dump() == gb.model_dump()
    fa = gpu_view({**ga.model_dump(), "under_load": True})
    fb = gpu_view({**gb.model_dump(), "under_load": True})
    assert fa == fb and fa["power_capped"] and fa["limit_lowered"] and fa["pcie_degraded"]
    assert fa["reasons"] == ["applications_clocks_setting", "sw_power_cap"]


def test_sampler_refuses_nothing_it_was_not_given():
    """No output, or text that is neither the sampler's JSON nor nvidia-smi rows, is a parse error, not a reading."""
    for text in ("", "{\"api\": null}", "Traceback (most recent call last):"):
        with pytest.raises(ParseError):
            parse_under_load(text)
    assert isinstance(parse_under_load(vector("sample_under_load.txt").split("\n", 1)[1]), NvmlLoadSample)


def test_q_xml_h200_matches_q_text():
    """`nvidia-smi -q -x` on the H200 gives what `nvidia-smi -q` gives (the driver, CUDA, reasons, power, PCIe)."""
    x = parse_q_xml((H200 / "nvsmi_q.xml").read_text())
    assert (x.driver_version, x.cuda_version) == ("580.159.04", "13.0")
    (g,) = x.gpus
    assert g.bus_id == "00000000:00:06.0" and g.reasons_section == "Clocks Event Reasons"
    assert g.event_reasons == ["gpu_idle"] and (g.power_limit, g.power_limit_default, g.power_limit_max) == (700.0, 700.0, 700.0)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    t = parse_q(vector("nvsmi_q.txt")).gpus[0]
    assert (t.event_reasons, t.power_limit, t.pcie_gen, t.pcie_width_max) == (g.event_reasons, g.power_limit, g.pcie_gen,
                                                                              g.pcie_width_max)


def test_q_xml_older_driver_throttle_tags():
    """Older drivers (nvsmi_device_v11.dtd, driver 470/525) write `clocks_throttle_reasons` with
    `clocks_throttle_reason_*` children and `power_readings` with `power_limit`: the same reasons and limits."""
    text = (H200 / "nvsmi_q.xml").read_text()
    text = text.replace("clocks_event_reasons_counters", "clocks_counters").replace("clocks_event_reason", "clocks_throttle_reason")
    text = text.replace("<clocks_throttle_reason_sw_power_cap>Not Active", "<clocks_throttle_reason_sw_power_cap>Active")
    text = text.replace("gpu_power_readings", "power_readings").replace(
        "<current_power_limit>700.00 W</current_power_limit>", "<power_limit>450.00 W</power_limit>", 1)
    (g,) = parse_q_xml(text).gpus
    assert g.reasons_section == "Clocks Throttle Reasons"
    assert g.event_reasons == ["gpu_idle", "sw_power_cap"] and g.power_limit == 450.0


def test_q_xml_bad_input():
    for text in ("", "<html></html>", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."):
        with pytest.raises(ParseError):
            parse_q_xml(text)


def test_xid_lines_read_and_an_unreadable_log_recorded(tmp_path: Path):
    """The real command through a real shell: Xid lines (as NVIDIA's Xid catalogue prints them, docs.nvidia.com/deploy/
    xid-errors) are read with their PCI address and code; a kernel log this user may not read is recorded as such."""
    b = tmp_path / "bin"
    b.mkdir()
    (b / "dmesg").write_text(textwrap.dedent("""\
        #!/bin/sh
        echo '[ 1.0] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04'
        echo '[ 812.5] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.'
        echo '[ 9.1] NVRM: Xid (PCI:0000:3b:00): 119, pid=1582, name=python3, Timeout after 6s of waiting for RPC response from GPU0 GSP!'
        """))
    (b / "dmesg").chmod(0o755)
    r = _run(GpuXid().command(), b)
    rep = parse_xid(GpuXid(), r)
    assert rep.readable and [(x.pci, x.code) for x in rep.xids] == [("0000:18:00", 79), ("0000:3b:00", 119)]
    assert rep.xids[0].text == "pid=0, GPU has fallen off the bus."
    (b / "dmesg").write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    rep = parse_xid(GpuXid(), _run(GpuXid().command(), b))
    assert not rep.readable and "Operation not permitted" in rep.why
