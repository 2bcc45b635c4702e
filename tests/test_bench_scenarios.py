"""bench/scenarios --noise X --draws N: each built-in scenario with its benchmark's noise scaled and the simulator's
draws seeded anew, diagnosed for real; a sweep fails only on a wrong answer (a false blame, the expected cause ruled
out), never on an honest "undecided"."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from debugagent.tools.sim import load_scenario, parse_scenario
from debugagent.tools.sim.scenario import builtin_dir

ROOT = Path(__file__).resolve().parents[1]


def bench() -> Any:
    loader = importlib.machinery.SourceFileLoader("bench_scenarios", str(ROOT / "bench" / "scenarios"))
    spec = importlib.util.spec_from_loader("bench_scenarios", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_a_variant_scales_the_noise_and_renames_the_scenario_and_nothing_else(tmp_path):
    mod = bench()
    f = mod.variant("launch-blocking", builtin_dir() / "launch-blocking.yaml", 2.5, 3, tmp_path)
    before, after = load_scenario("launch-blocking"), parse_scenario(f.read_text(), str(f))
    assert after.name == "launch-blocking-d3" and f.name == "launch-blocking-d3.yaml"
    assert after.bench.noise_pct == pytest.approx(before.bench.noise_pct * 2.5)
    assert after.factors == before.factors and after.expect == before.expect
    assert (after.symptom, after.baseline, after.host) == (before.symptom, before.baseline, before.host)
    raw = yaml.safe_load(f.read_text())
    raw["bench"].pop("noise_pct")
    orig = yaml.safe_load((builtin_dir() / "launch-blocking.yaml").read_text())
    orig["bench"].pop("noise_pct")
    assert {k: v for k, v in raw.items() if k != "name"} == {k: v for k, v in orig.items() if k != "name"}


def test_a_sweep_diagnoses_each_draw_and_counts_wrong_answers_apart(capsys):
    mod = bench()
    argv, sys.argv = sys.argv, ["bench/scenarios", "--mode", "numbers", "--only", "cuda-graph-disabled",
                                "--noise", "1.5", "--draws", "2"]
    try:
        rc = mod.main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if x.startswith(("PASS", "FAIL"))]
    assert [r.split()[1] for r in rows] == ["cuda-graph-disabled-d1", "cuda-graph-disabled-d2"]
    summary = next(x for x in out.splitlines() if x.startswith("noise x1.5, 2 draw(s) each:"))
    counts = re.search(r": (\d+) right \(of them (\d+) with a wrong answer beside\), (\d+) neither right nor wrong "
                       r".*, (\d+) false blame\(s\), the expected cause ruled out (\d+) time", summary)
    assert counts, summary
    right, right_and_wrong, neither, blames, ruled = map(int, counts.groups())
    assert right - right_and_wrong + neither + blames + ruled >= 2 and min(right, neither) >= 0
    assert "0 false blame(s), the expected cause ruled out 0 time(s)" in summary, out
    assert rc == 0


@pytest.mark.parametrize("sweep", [["--noise", "2"], ["--streaks", "1,0.8"]])
def test_against_takes_the_scenarios_as_written(capsys, monkeypatch, sweep):
    """--against compares the scenarios as written: a sweep's flags beside it are refused, naming them."""
    mod = bench()
    monkeypatch.setattr(sys, "argv", ["bench/scenarios", "--against", "HEAD", *sweep])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--against compares the scenarios as written" in err and "leave out --noise, --draws and --streaks" in err


def test_a_sweep_counts_an_also_cause_ruled_out_as_wrong():
    """The two-cause scenario at four times its noise once ruled its second cause (NCCL_PROTO) out: that is a wrong
    answer, though the root cause was confirmed."""
    mod = bench()
    sc = load_scenario("two-causes")
    assert sc.expect.root_cause == "serving_config" and "env_var" in sc.expect.also
    assert mod.ruled_out_expected(sc, {"ruled_out": [{"hypothesis": "env_var"}]})
    assert mod.ruled_out_expected(sc, {"ruled_out": [{"hypothesis": "serving_config"}]})
    assert not mod.ruled_out_expected(sc, {"ruled_out": [{"hypothesis": "gpu_clocks"}, {"hypothesis": "pcie_link"}]})
    assert not mod.ruled_out_expected(load_scenario("no-regression"), {"ruled_out": [{"hypothesis": "env_var"}]})


def test_a_variant_on_a_streaky_host_adds_the_streaks_and_nothing_else(tmp_path):
    """--streaks 1,0.8:4: the host's own speed in streaks (the scenario format's bench.streaks); a bad value is refused
    naming the flag and an example."""
    mod = bench()
    streaks = mod.parse_streaks("1,0.8:4")
    assert streaks == {"speeds": [1.0, 0.8], "runs": 4} and mod.parse_streaks("1,0.5")["runs"] == 4
    f = mod.variant("launch-blocking", builtin_dir() / "launch-blocking.yaml", 1.0, 1, tmp_path, streaks)
    before, after = load_scenario("launch-blocking"), parse_scenario(f.read_text(), str(f))
    assert after.bench.streaks is not None and after.bench.streaks.speeds == [1.0, 0.8] and after.bench.streaks.runs == 4
    assert after.bench.noise_pct == pytest.approx(before.bench.noise_pct) and after.factors == before.factors
    for bad in ("1", "1,0:4", "1,x", "1,0.8:0"):
        with pytest.raises(ValueError, match="e.g. 1,0.75:4"):
            mod.parse_streaks(bad)
