"""Locked clocks and downgrades: the clock-event reasons decide gpu_clocks, the ``clock_reset`` experiment resets a
lock and puts back exactly the lock it read, and ``package_restore`` measures the previous version a wheelhouse
holds, with a baseline snapshot naming it and without one. Over sealed simulated hosts and real-format outputs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from debugagent.agent.facts import LabFacts
from debugagent.agent.journal import HostFiles, Journal
from debugagent.agent.lab import Lab, Measure
from debugagent.agent.lab.asfound import compare, parse_reading, read_command
from debugagent.agent.lab.kinds.clocks import lock_of
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools import gpu
from debugagent.tools.mutate import FindWheels, LockClocks, ResetClocks, release_key, wheel_version
from debugagent.tools.probes.gpu import GpuFacts, gpu_view
from debugagent.tools.registry import Runner
from debugagent.tools.sim import SimTransport, parse_scenario
from debugagent.tools.snapshot import collect, dump

from tests.test_agent import check

HERE = Path(__file__).parent
VECTORS = HERE / "vectors" / "h200"
LOCKED = HERE / "scenarios" / "locked-clocks.yaml"
DOWNGRADE = HERE / "scenarios" / "downgrade-in-wheelhouse.yaml"


def scenario(path: Path):
    return parse_scenario(path.read_text(), str(path))


# ---------------------------------------------------------------- parsers, on the formats real drivers print
def test_the_idle_reading_of_a_real_h200_reads_as_no_lock():
    """The H200 capture (idle, unlocked: 1980 of 1980 MHz, only the idle reason) gives the idle clocks and the
    memory maximum; a GPU read idle, or under load without the applications-clocks reason, has no lock to reset."""
    idle = gpu.parse_query_csv("\n".join((VECTORS / "nvsmi_csv.txt").read_text().splitlines()[1:3]))[0]
    assert (idle.sm_clock, idle.mem_clock, idle.mem_clock_max) == (1980, 3201, 3201)
    assert idle.event_reasons == ["gpu_idle"]
    g = GpuFacts(index=0, sm_clock=1980, sm_clock_max=1980, mem_clock=3201, mem_clock_max=idle.mem_clock_max,
                 idle_sm_clock=idle.sm_clock, idle_mem_clock=idle.mem_clock, event_reasons=[], under_load=True)
    assert lock_of(g) is None and not gpu_view(g.model_dump())["clocks_locked"]
    locked = g.model_copy(update={"sm_clock": 1650, "idle_sm_clock": 1650, "event_reasons": ["applications_clocks_setting"]})
    assert gpu_view(locked.model_dump())["clocks_locked"]
    assert lock_of(locked) == {"gpu": 0, "sm_min": 1650, "sm_max": 1650, "mem_min": None, "mem_max": None}
    assert lock_of(locked.model_copy(update={"under_load": False})) is None   # an idle reading proves nothing


def test_the_reason_mask_decodes_applications_clocks_in_both_spellings():
    """0x2 is NVML's applications-clocks reason (a lock, or lowered applications clocks), whether the header says
    clocks_event_reasons (newer drivers) or clocks_throttle_reasons (older ones)."""
    for head in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        text = f"index, clocks.current.sm [MHz], {head}\n0, 1650 MHz, 0x0000000000000002\n"
        assert gpu.parse_query_csv(text)[0].event_reasons == ["applications_clocks_setting"]


def test_the_as_found_reading_of_clocks_parses_what_nvidia_smi_prints():
    """`--format=csv,noheader,nounits` prints `1980, 3201, 0x0000000000000001` (as the H200 capture's noheader rows);
    a lock left different, or a reason left on, is a difference whose fix is the lock as found."""
    cmd = read_command("clocks:1", {"gpu": 1})
    assert "nvidia-smi -i 1 --query-gpu=clocks.sm,clocks.mem,clocks_throttle_reasons.active" in cmd
    before = parse_reading("clocks:1", "clocks=1650, 3201, 0x0000000000000001\n", lambda b: "")
    assert before == {"sm": 1650, "mem": 3201, "applications_clocks": False}
    assert parse_reading("clocks:1", "clocks=\n", lambda b: "") is None   # nothing read: not "as found"
    how = {"gpu": 1, "sm_min": 1650, "sm_max": 1650, "mem_min": None, "mem_max": None}
    assert compare("clocks:1", {"how": how, **before}, dict(before)) == []
    moved = compare("clocks:1", {"how": how, **before}, {"sm": 345, "mem": 3201, "applications_clocks": False})
    assert len(moved) == 1 and moved[0].fix == "nvidia-smi -i 1 -lgc 1650,1650"


def test_the_clock_commands_are_the_exact_nvidia_smi_ones():
    assert ResetClocks(gpu=2).command() == "nvidia-smi -i 2 -rgc"
    assert ResetClocks(gpu=0, memory=True).command() == "nvidia-smi -i 0 -rgc && nvidia-smi -i 0 -rmc"
    assert LockClocks(gpu=1, sm_min=1200, sm_max=1650).command() == "nvidia-smi -i 1 -lgc 1200,1650"
    assert (LockClocks(gpu=0, sm_min=1650, sm_max=1650, mem_min=2619, mem_max=2619).command()
            == "nvidia-smi -i 0 -lgc 1650,1650 && nvidia-smi -i 0 -lmc 2619,2619")


def test_wheel_versions_and_their_order():
    """PEP 427 file names; a .postN after its release, an rc before it, a local label left out."""
    assert wheel_version("/w/flashinfer_python-0.6.8.post1-cp39-abi3-linux_x86_64.whl") == "0.6.8.post1"
    assert wheel_version("/w/not-a-wheel.tar.gz") is None
    assert release_key("0.6.8.post1") < release_key("0.6.12") < release_key("0.6.12.post1")
    assert release_key("2.10.0rc1") < release_key("2.10.0") == release_key("2.10.0+cu130")
    assert release_key("2.9.1+cu130") < release_key("2.10.0+cu130")
    every = FindWheels(name="flashinfer-python", places=["/srv/wheels; rm -rf /"]).command()
    assert "'flashinfer_python-*.whl'" in every and "'/srv/wheels; rm -rf /'" in every
    assert "'flashinfer_python-0.6.12-*.whl'" in FindWheels(name="flashinfer-python", version="0.6.12").command()


# ---------------------------------------------------------------- the experiment on a sealed simulated host
def test_clock_reset_recovers_and_its_undo_locks_the_clocks_exactly_as_found(sim_host, tmp_path):
    """GPU 0 found locked at SM 1200,1650 and memory 2619,2619, GPU 1 at SM 1650,1650: the experiment resets both
    (memory too where it was held), measures the recovery, and its undo locks each again with the values it read,
    so the idle and loaded clocks and the reasons read exactly as before it."""
    t = sim_host(f"sim:{LOCKED}")
    r = Runner(t)
    assert t.run("nvidia-smi -i 0 -lgc 1200,1650").exit_code == 0
    assert t.run("nvidia-smi -i 0 -lmc 2619,2619").exit_code == 0

    def clocks() -> tuple[list[gpu.GpuState], list[gpu.GpuState]]:
        idle = r.call("gpu_query", {}).output.gpus
        load = r.call("gpu_sample_under_load", {"load": "gpu-bench", "seconds": 0.4}).output.per_gpu()
        return idle, [load[i] for i in sorted(load)]

    found_idle, found_load = clocks()
    assert [(g.sm_clock, g.mem_clock) for g in found_idle] == [(1200, 2619), (1650, 3201)]
    assert [(g.sm_clock, g.mem_clock) for g in found_load] == [(1650, 2619), (1650, 3201)]
    assert all("applications_clocks_setting" in g.event_reasons for g in found_load)

    snap = collect(r)
    facts = LabFacts.of(snap, None)
    events: list = []
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append((ev, kw)),
              Journal(tmp_path / "journal.json", "clk1", "sim", HostFiles(t)), Measure("gpu-bench", "decode", None),
              "clk1", False)
    bad = [float(r.call("bench", {"cmd": "gpu-bench", "metric": "decode"}).output.value) for _ in range(3)]
    result = lab.run("gpu_clocks", {"kind": "clock_reset", "title": "reset the locked clocks"}, facts, bad,
                     89.0 - statistics.fmean(bad))
    assert result.significant and result.share > 0.5, result.text
    assert result.fix == "nvidia-smi -i 0 -rgc; nvidia-smi -i 0 -rmc; nvidia-smi -i 1 -rgc"
    undo = [kw["input"] for ev, kw in events if ev == "experiment" and kw.get("phase") == "undo_recorded"]
    assert {"gpu": 0, "sm_min": 1200, "sm_max": 1650, "mem_min": 2619, "mem_max": 2619} in undo
    assert {"gpu": 1, "sm_min": 1650, "sm_max": 1650, "mem_min": None, "mem_max": None} in undo
    assert any("the host is as it was found" in kw.get("text", "") and "GPU 0's clocks" in kw.get("text", "")
               for ev, kw in events if ev == "experiment")
    idle, load = clocks()
    assert [g.model_dump(include={"sm_clock", "mem_clock", "event_reasons"}) for g in idle] == \
        [g.model_dump(include={"sm_clock", "mem_clock", "event_reasons"}) for g in found_idle]
    assert [g.model_dump(include={"sm_clock", "mem_clock", "event_reasons"}) for g in load] == \
        [g.model_dump(include={"sm_clock", "mem_clock", "event_reasons"}) for g in found_load]


# ---------------------------------------------------------------- the scenarios, diagnosed end to end
def test_locked_clocks_are_confirmed_by_resetting_them(tmp_path):
    """1650 of 2032 MHz with the applications-clocks reason active: no longer "ruled out" for a lack of power cap
    or heat, but a suspect that the reset confirms, with the reset as the fix."""
    sc = scenario(LOCKED)
    out = investigate(RunOptions(host=f"sim:{LOCKED}", symptom=sc.symptom, baseline=sc.baseline, as_json=True,
                                 out=str(tmp_path / "run")))
    check(sc, out)
    assert out["root_cause"]["how"] == "experiment" and "gpu_clocks" not in {x["hypothesis"] for x in out["ruled_out"]}
    assert out["root_cause"]["fix"] == "nvidia-smi -i 0 -rgc; nvidia-smi -i 1 -rgc"


@pytest.mark.parametrize("mode", ["numbers", "snapshot"])
def test_a_downgrade_in_the_wheelhouse_is_measured(mode, tmp_path):
    """flashinfer-python 0.6.8.post1 -> 0.6.12, the old wheel in the wheelhouse: with a baseline snapshot its
    version is the baseline's; with numbers only, the newest older version the wheelhouse holds (not 0.6.6)."""
    sc = scenario(DOWNGRADE)
    opts = RunOptions(host=f"sim:{DOWNGRADE}", symptom=sc.symptom, as_json=True, out=str(tmp_path / "run"))
    if mode == "numbers":
        opts.baseline = sc.baseline
    else:
        snap = tmp_path / "good.json"
        with SimTransport(f"sim:{DOWNGRADE}@good") as good:
            snap.write_text(dump(collect(Runner(good), bench_runs=3)))
        opts.baseline_snapshot = str(snap)
    out = investigate(opts)
    check(sc, out)
    assert out["root_cause"]["how"] == "experiment"
    assert "flashinfer_python-0.6.8.post1-" in out["root_cause"]["fix"] and "0.6.6" not in out["root_cause"]["fix"]


def test_a_shadow_run_never_resets_the_production_gpus_clocks(sim_host, tmp_path):
    """With --shadow-gpus the production server and what it uses stay untouched: an experiment on a knob of the host
    itself (here the locked clocks) is refused before it changes anything, and the clocks read as they were."""
    from debugagent.agent.lab.errors import ExperimentError
    t = sim_host(f"sim:{LOCKED}")
    r = Runner(t)
    assert t.run("nvidia-smi -i 0 -lgc 1200,1650").exit_code == 0
    before = [(g.sm_clock, g.mem_clock) for g in r.call("gpu_query", {}).output.gpus]
    events: list = []
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append((ev, kw)),
              Journal(tmp_path / "journal.json", "clk2", "sim", HostFiles(t)), Measure("gpu-bench", "decode", None),
              "clk2", False, shadow={"gpus": ["1"], "port": 9001, "ref_port": 9002, "server_port": 8000})
    with pytest.raises(ExperimentError, match="shadow"):
        lab.run("gpu_clocks", {"kind": "clock_reset", "title": "reset the locked clocks"}, LabFacts.of(collect(r), None),
                [80.0, 81.0, 79.0], 9.0)
    assert [(g.sm_clock, g.mem_clock) for g in r.call("gpu_query", {}).output.gpus] == before
    assert not any(kw.get("phase") == "undo_recorded" for ev, kw in events)
