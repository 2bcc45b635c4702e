"""GPU parsers on the real H200 outputs and on older drivers' format."""

from __future__ import annotations

import pytest
from debugagent.tools.errors import ParseError
from debugagent.tools.gpu import (
    decode_reasons,
    parse_compute_apps,
    parse_load_samples,
    parse_q,
    parse_query_csv,
    parse_query_noheader,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import vector


def csv_block() -> str:
    lines = vector("nvsmi_csv.txt").splitlines()
    return "\n".join(lines[:2])


def test_query_csv_h200():
    """The 40-field H200 query parses: units stripped, [N/A] is None, duplicate reason columns agree."""
    (g,) = parse_query_csv(csv_block())
    assert g.name == "NVIDIA H200"
    assert (g.sm_clock, g.sm_clock_max, g.mem_clock_max) == (1980, 1980, 3201)
    assert g.power_draw == pytest.approx(127.39)
    assert (g.power_limit, g.power_limit_max) == (700.0, 700.0)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.event_reasons == ["gpu_idle"]
    assert g.driver_version == "580.159.04"


def test_query_csv_old_driver_header():
    """Older drivers print `clocks_throttle_reasons.active`: it parses to the same names."""
    text = csv_block().replace("clocks_event_reasons.active", "clocks_throttle_reasons.active")
    (g,) = parse_query_csv(text)
    assert g.event_reasons == ["gpu_idle"]


def test_q_h200():
    """`nvidia-smi -q` gives driver, CUDA, reasons, power limits and PCIe of each GPU."""
    info = parse_q(vector("nvsmi_q.txt"))
    assert (info.driver_version, info.cuda_version) == ("580.159.04", "13.0")
    (g,) = info.gpus
    assert g.bus_id == "00000000:00:06.0"
    assert g.reasons_section == "Clocks Event Reasons"
    assert g.event_reasons == ["gpu_idle"]
    assert (g.power_limit, g.power_limit_max) == (700.0, 700.0)
    assert (g.pcie_gen, g.pcie_width, g.pcie_width_max) == (5, 16, 16)


def test_q_old_driver_throttle_reasons():
    """The "Clocks Throttle Reasons" section of older drivers parses the same way."""
    text = vector("nvsmi_q.txt").replace("Clocks Event Reasons", "Clocks Throttle Reasons")
    text = text.replace("        SW Power Cap                                   : Not Active",
                        "        SW Power Cap                                   : Active")
    (g,) = parse_q(text).gpus
    assert g.reasons_section == "Clocks Throttle Reasons"
    assert g.event_reasons == ["gpu_idle", "sw_power_cap"]


def test_idle_load_trace_reasons():
    """The H200 idle/load trace decodes 0x1 as idle and 0x4 as SW power cap."""
    rows = vector("idle_load_trace.csv").splitlines()
    assert "0x0000000000000004" in "\n".join(rows)
    assert decode_reasons(0x4) == ["sw_power_cap"]
    assert decode_reasons(0x61) == ["gpu_idle", "sw_thermal_slowdown", "hw_thermal_slowdown"]


def test_load_samples_keep_only_busy_rows():
    """Samples taken while the GPU was idle are not counted as readings under load."""
    from debugagent.tools.gpu import QUERY_FIELDS
    n = len(QUERY_FIELDS)
    idle = ["0", "NVIDIA H200", "GPU-x", "00000000:18:00.0", "580.159.04", "P0", "345 MHz", "1980 MHz", "3201 MHz",
            "3201 MHz", "79.00 W", "700.00 W", "700.00 W", "37", "0 %", "0 MiB", "143771 MiB", "1", "5", "16", "16",
            "0x0000000000000001", "Enabled", "Enabled"]
    busy = list(idle)
    busy[6], busy[10], busy[14], busy[17], busy[21] = "1500 MHz", "690.00 W", "97 %", "5", "0x0000000000000004"
    assert len(idle) == n
    s = parse_load_samples("\n".join([", ".join(idle), ", ".join(busy)]))
    assert len(s.samples) == 2 and len(s.loaded) == 1
    assert s.per_gpu()[0].sm_clock == 1500
    assert s.per_gpu()[0].event_reasons == ["sw_power_cap"]


def test_compute_apps():
    """Compute processes parse; the empty answer is no process."""
    assert parse_compute_apps("") == []
    (p,) = parse_compute_apps("GPU-abc, 48211, /usr/bin/python3 -m ipykernel_launcher, 18432\n")
    assert (p.pid, p.used_memory_mib) == (48211, 18432)


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(min_value=0, max_value=4000), junk=st.text(max_size=40))
def test_csv_truncated_or_malformed_is_a_parse_error(cut, junk):
    """Truncated or garbled CSV gives ParseError or a valid result, never another exception."""
    text = csv_block()[:cut] + junk
    try:
        parse_query_csv(text)
    except ParseError:
        pass


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(min_value=0, max_value=14000), junk=st.text(max_size=40))
def test_q_truncated_or_malformed_is_a_parse_error(cut, junk):
    """Truncated `nvidia-smi -q` gives ParseError or a valid result, never another exception."""
    text = vector("nvsmi_q.txt")[:cut] + junk
    try:
        parse_q(text)
    except ParseError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_noheader_and_apps_never_crash(text):
    """Any text into the headerless and process parsers: a result or ParseError."""
    for fn in (parse_query_noheader, parse_compute_apps):
        try:
            fn(text)
        except ParseError:
            pass


def test_samples_under_load_from_a_real_h200():
    """Samples taken on an H200 while a decode-like benchmark ran: idle rows first, busy rows after."""
    s = parse_load_samples(vector("sample_under_load.txt"))
    assert len(s.samples) == 9 and len(s.loaded) >= 2
    g = s.per_gpu()[0]
    assert g.sm_clock == 1980 and g.power_draw > 200 and g.pcie_gen == 5 and g.event_reasons == []
