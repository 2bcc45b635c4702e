"""`debugagent sim from-snapshots`: the H200 lab's recordings (transcripts/h200/*) -> their snapshots -> a scenario
-> the same diagnosis on the simulated host as on the real one.

A recording holds the baseline snapshot it was given (`run_started.baseline_snapshot_data`) and the outputs of the
probes it ran on the bad host; the bad snapshot is made again by the same probes answered from the recording.
The cases whose run had a number for a baseline (env, code, healthy, two) hold no snapshot of the good state, so no
scenario can be made from snapshots for them: the test checks that too. The shadow run's case (shadow-flag) holds
one; on the simulated host it is diagnosed by a restart, as a run without --shadow-gpus makes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools.errors import UsageError
from debugagent.tools.registry import Runner
from debugagent.tools.sim import SimTransport
from debugagent.tools.sim.fromsnap import scenario_from_snapshots, snapshots_from_recording
from debugagent.tools.sim.scenario import parse_scenario
from debugagent.tools.snapshot import collect, dump

from debugagent_testing import event_lines

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "transcripts" / "h200"
SUMMARY = {c["case"]: c for c in json.loads((H200 / "summary.json").read_text())["cases"]}
POWER_CAP = "gpus.0.event_reasons"


def recording(case: str) -> list[dict]:
    return event_lines(H200 / case / "events.jsonl")


def real_cause(case: str) -> str | None:
    end = next(e for e in reversed(recording(case)) if e["event"] == "conclusion")
    return (end.get("root_cause") or {}).get("hypothesis")


@pytest.mark.parametrize("case", ["flag", "package", "shadow-flag"])
def test_an_h200_recording_round_trips(tmp_path, case):
    cause = real_cause(case)
    assert cause == SUMMARY[case]["expect"]   # what the real host's run concluded, and was right
    good, bad = snapshots_from_recording(recording(case))
    assert good is not None and bad.server is not None and len(bad.bench["samples"]) >= 2
    g, b = tmp_path / "good.json", tmp_path / "bad.json"
    g.write_text(dump(good))
    b.write_text(dump(bad))
    out = tmp_path / "sc.yaml"
    # the lab's float32 layers draw the GPU to its power limit, so the bad state's snapshot also shows the SW power cap
    # reason: a difference the change brings, which costs nothing of its own (told, else the change is shared)
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "sim", "from-snapshots", str(g), str(b),
                        "-o", str(out), "--expect", cause, "--effect", f"{POWER_CAP}=0"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    sc = parse_scenario(out.read_text(), str(out))
    # factors from the snapshots' diff (each case's change, and the power cap it brings), effects from the numbers
    paths = [f.path for f in sc.factors]
    assert paths == [{"flag": "server.args.dtype", "shadow-flag": "server.args.dtype",
                      "package": "packages.labkern.build"}[case], POWER_CAP], paths
    assert sc.factors[0].effect < 0 and abs(sc.bench.base + sc.factors[0].effect - sum(bad.bench["samples"]) /
                                            len(bad.bench["samples"])) < 1
    assert sc.host.server.cmd.endswith("-m labserve.server") and sc.host.python.startswith("/opt/gpu-lab-")
    # the diagnosis on the simulated host, as the real run made it: against a snapshot of the good state
    with SimTransport(f"sim:{out}@good") as t:
        (tmp_path / "simgood.json").write_text(dump(collect(Runner(t), bench_runs=3)))
    res = investigate(RunOptions(host=f"sim:{out}", symptom=sc.symptom, baseline_snapshot=str(tmp_path / "simgood.json"),
                                 wheelhouse="/root/wheelhouse" if case == "package" else None, as_json=True,
                                 out=str(tmp_path / "run")))
    rc = res["root_cause"]
    assert res["exit_code"] == 0 and rc and rc["hypothesis"] == cause and rc["how"] == "experiment", res["summary"]


@pytest.mark.parametrize("case", ["env", "code", "healthy", "two"])
def test_a_recording_with_a_number_for_baseline_has_no_good_snapshot(case):
    good, bad = snapshots_from_recording(recording(case))
    assert good is None and bad.server is not None


def test_several_differences_share_the_change_unless_told(tmp_path):
    good, bad = snapshots_from_recording(recording("flag"))
    assert good is not None and bad.server is not None
    bad = bad.model_copy(deep=True)
    bad.server.flags["backend"] = "eager"
    sc, notes = scenario_from_snapshots(good, bad, name="two", expect="serving_config")
    eff = {f["path"]: f["effect"] for f in sc["factors"]}
    assert set(eff) == {"server.args.dtype", "server.args.backend", POWER_CAP}
    assert eff["server.args.dtype"] == eff["server.args.backend"] == eff[POWER_CAP]
    assert any("shared equally" in n for n in notes)
    sc, _ = scenario_from_snapshots(good, bad, name="two", expect="serving_config",
                                    effects={"server.args.backend": 0.0, POWER_CAP: 0.0})
    eff = {f["path"]: f["effect"] for f in sc["factors"]}
    change = sum(bad.bench["samples"]) / len(bad.bench["samples"]) - sum(good.bench["samples"]) / len(good.bench["samples"])
    assert eff["server.args.backend"] == eff[POWER_CAP] == 0 and abs(eff["server.args.dtype"] - change) < 1, eff
    with pytest.raises(UsageError, match="no such factor"):
        scenario_from_snapshots(good, bad, name="two", expect=None, effects={"server.args.nope": 1.0})
    parse_scenario(yaml.safe_dump(sc), "two.yaml")
