"""The hypothesis vocabulary belongs to the playbook: tools/ names no hypothesis, scenarios name the playbook's ids."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from debugagent.agent.playbook import OTHER, glob_matches_some_path, load_playbook, parse_playbook, restored
from debugagent.tools.errors import PlaybookError
from debugagent.tools.sim import builtin_names, load_scenario
from debugagent.tools.sim.scenario import parse_scenario
from debugagent.tools.snapshot import DIFF_PATHS, Change

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "playbooks" / "gpu-inference-regression.yaml"
SCENARIOS = sorted((ROOT / "tools" / "sim" / "scenarios").glob("*.yaml")) + sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))


def playbook_ids() -> set[str]:
    return {h.id for h in load_playbook(None).hypotheses}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_answers_are_playbook_ids(path):
    """Every scenario's expected root cause and `also` causes are hypothesis ids of the default playbook."""
    exp = parse_scenario(path.read_text(), str(path)).expect
    named = {exp.root_cause, *exp.also} - {None}
    assert named <= playbook_ids(), f"{path.name}: {sorted(named - playbook_ids())} not in the default playbook"


def test_builtin_scenarios_cover_every_playbook_hypothesis():
    """Each of the default playbook's hypotheses is the answer of some built-in scenario."""
    answers = {load_scenario(n).expect.root_cause for n in builtin_names()}
    assert playbook_ids() <= answers


def test_scenario_root_cause_is_a_plain_word():
    """The sim checks an expected cause only as a plain word (the playbook knows which ids exist)."""
    text = (ROOT / "tools" / "sim" / "scenarios" / "launch-blocking.yaml").read_text()
    assert parse_scenario(text.replace("root_cause: env_var", "root_cause: my_own_cause")).expect.root_cause == "my_own_cause"
    with pytest.raises(Exception, match="root_cause"):
        parse_scenario(text.replace("root_cause: env_var", "root_cause: 'env var!'"), "s.yaml")


def test_tools_name_no_hypothesis_id():
    """No file under tools/ names a hypothesis id, except a scenario's `expect:` line (data the tests above check)."""
    word = re.compile(r"\b(" + "|".join(sorted(playbook_ids())) + r")\b")
    hits = []
    for p in sorted((ROOT / "tools").rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if word.search(line) and not (p.suffix == ".yaml" and line.startswith("expect:")):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)



def test_agent_names_no_hypothesis_id():
    """No file of the engine (agent/) names a hypothesis id: which hypothesis does what is the playbook's to say."""
    word = re.compile(r"\b(" + "|".join(sorted(playbook_ids())) + r")\b")
    hits = []
    for p in sorted((ROOT / "agent").rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix in (".yaml", ".pyc"):
            continue
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if word.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)

# What docs/verdicts.md's hypothesis list says each area of a host bears on; the default playbook's evidence must file them so.
DOCUMENTED = {
    "packages.torch.version": "compiled_dependency", "packages.flashinfer-python.build": "compiled_dependency",
    "repo.head": "code_change", "repo.dirty": "code_change", "server.args.attention-backend": "serving_config",
    "server.env.CUDA_LAUNCH_BLOCKING": "env_var", "gpus.0.sm_clock": "gpu_clocks", "gpus.3.power_limit": "gpu_clocks",
    "gpus.0.event_reasons": "gpu_clocks", "gpus.1.name": "gpu_clocks", "gpus.0.temperature": "gpu_clocks",
    "gpus.0.pcie_gen": "pcie_link", "gpus.7.pcie_width_max": "pcie_link", "gpu_processes": "gpu_contention",
    "cpu.governor": "host_cpu", "driver.version": "driver_cuda", "driver.cuda": "driver_cuda",
    "server_view.attention_backend": "changed_default", "server_view.versions.flashinfer": "changed_default",
}


@pytest.mark.parametrize("path,hid", sorted(DOCUMENTED.items()))
def test_default_playbook_files_each_change_under_its_hypothesis(path, hid):
    """The default playbook's `evidence` globs file a change as docs/verdicts.md's hypothesis list describes."""
    assert load_playbook(None).evidence_of(Change(path=path)) == hid


def test_an_editable_package_is_evidence_of_a_code_change():
    """A package installed from a source checkout is code (`editable:`), any other package a compiled dependency."""
    pb = load_playbook(None)
    assert pb.evidence_of(Change(path="packages.sglang.version", editable=True)) == "code_change"
    assert pb.evidence_of(Change(path="packages.sglang.version")) == "compiled_dependency"


def test_every_diff_path_is_some_hypothesis_evidence():
    """Each path the snapshot diff can report is claimed by a hypothesis of the default playbook."""
    pb = load_playbook(None)
    for template in DIFF_PATHS:
        path = template.replace("NAME", "torch").replace("FLAG", "tp").replace("VAR", "NCCL_ALGO").replace(".N.", ".0.")
        assert pb.evidence_of(Change(path=path)) != OTHER, path


def test_factor_paths_of_the_scenarios_are_snapshot_paths():
    """Every factor path of a built-in scenario (the diff reports exactly these) matches a snapshot path."""
    for name in builtin_names():
        for f in load_scenario(name).factors:
            if not f.path.startswith("bench."):
                assert glob_matches_some_path(f.path), f"{name}: {f.path}"


def test_group_keeps_unclaimed_changes_under_other():
    """A change that no hypothesis's evidence matches is listed under `other`, not dropped."""
    pb = parse_playbook("version: 1\nname: m\nhypotheses:\n  - id: a\n    title: A\n    evidence: [repo.head]\n"
                        "    rules: [{when: 'true', verdict: ruled_out, because: fine}]\n")
    groups = pb.group([Change(path="repo.head", a="1", b="2"), Change(path="cpu.governor", a="performance", b="powersave")])
    assert [c.path for c in groups["a"]] == ["repo.head"] and [c.path for c in groups[OTHER]] == ["cpu.governor"]


BAD_GLOB = """version: 1
name: typo
hypotheses:
  - id: env
    title: the environment
    evidence: ["server.args.*",
               "env.*"]
    rules:
      - {when: "true", verdict: ruled_out, because: "fine"}
"""


def test_unknown_evidence_glob_names_line_and_suggests_the_path(tmp_path):
    """An evidence glob that matches no snapshot path is refused with file:line and a did-you-mean."""
    p = tmp_path / "typo.yaml"
    p.write_text(BAD_GLOB)
    with pytest.raises(PlaybookError) as e:
        load_playbook(str(p))
    msg = str(e.value)
    assert f"{p}:7:" in msg and "hypotheses[0].evidence[1]" in msg
    assert "`env.*` matches no snapshot path" in msg and "did you mean `server.env.*`?" in msg
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "playbook", "validate", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and f"{p}:7:" in r.stderr and "server.env.*" in r.stderr


def test_editable_glob_must_name_packages():
    """`editable:` applies to packages only; on another path it matches nothing and is refused."""
    with pytest.raises(PlaybookError, match="matches no snapshot path"):
        parse_playbook(BAD_GLOB.replace('"env.*"', '"editable:repo.*"'))
    assert glob_matches_some_path("editable:packages.*") and glob_matches_some_path("packages.flashinfer*.build")


def test_restore_experiment_takes_path_globs():
    """A restore_baseline_* experiment puts back the changes its `paths` globs match (default: its kind's area)."""
    changes = [Change(path=p, a="1", b="2").model_dump() for p in
               ("server.args.disable-cuda-graph", "server.args.tp", "server.env.NCCL_ALGO")]
    every = restored({"kind": "restore_baseline_flags"}, changes)
    assert [c["path"] for c in every] == ["server.args.disable-cuda-graph", "server.args.tp"]
    one = restored({"kind": "restore_baseline_flags", "paths": ["server.args.disable-*"]}, changes)
    assert [c["path"] for c in one] == ["server.args.disable-cuda-graph"]
    assert restored({"kind": "restore_baseline_env"}, changes) == [changes[2]]


def test_restore_paths_outside_the_kind_area_are_refused():
    """A `paths` glob a restoring experiment cannot put back, or `paths` on another kind, is refused at load."""
    head = ("version: 1\nname: m\nhypotheses:\n  - id: a\n    title: A\n    rules:\n"
            "      - when: 'true'\n        verdict: suspect\n        because: x\n        experiment: ")
    with pytest.raises(PlaybookError, match="puts back changes under `server.args.\\*`; `server.env.\\*` matches none"):
        parse_playbook(head + "{kind: restore_baseline_flags, paths: ['server.env.*']}\n")
    with pytest.raises(PlaybookError, match="did you mean `server.args.\\*`"):
        parse_playbook(head + "{kind: restore_baseline_flags, paths: ['server.arg.*']}\n")
    with pytest.raises(PlaybookError, match="`paths` applies to"):
        parse_playbook(head + "{kind: governor, governor: performance, paths: ['cpu.*']}\n")
    assert parse_playbook(head + "{kind: restore_baseline_flags, paths: ['server.args.disable-*']}\n")


def test_default_playbook_declares_evidence_for_every_hypothesis():
    """Every hypothesis of the default playbook says which snapshot paths are its evidence."""
    raw = yaml.safe_load(DEFAULT.read_text())
    assert all(h.get("evidence") for h in raw["hypotheses"])


# ---------------------------------------------------------------- the playbook's checks and knowledge at work
def test_checks_choose_the_probes(tmp_path):
    """A playbook whose hypotheses check no packages and no driver files makes the run collect neither."""
    from debugagent.agent.run import RunOptions, investigate
    from debugagent.agent.transcript import read_events
    text = DEFAULT.read_text().replace("checks: [python_packages]", "checks: []").replace(
        "checks: [gpu_q, driver_files]", "checks: [gpu_q]")
    assert text.count("checks: []") == 1
    p = tmp_path / "fewer-checks.yaml"
    p.write_text(text)
    sc = load_scenario("gpu-contention")
    out = investigate(RunOptions(host="sim:gpu-contention", symptom=sc.symptom, baseline=sc.baseline, as_json=True,
                                 out=str(tmp_path / "run"), playbook=str(p)))
    events = read_events(Path(out["transcript"]) / "events.jsonl")
    tools = {e["tool"] for e in events if e["event"] == "tool_call"}
    assert "gpu_q" in tools and "git_state" in tools and not tools & {"python_packages", "driver_files"}
    said = " ".join(e.get("text", "") for e in events if e["event"] == "reasoning")
    assert "left out, since no hypothesis checks them: driver_files, python_packages" in said
    verdicts = {e["hypothesis"]: e["status"] for e in events if e["event"] == "verdict"}
    assert verdicts["compiled_dependency"] == "inconclusive"
    kept = read_events(ROOT / "transcripts" / "gpu-contention" / "events.jsonl")
    assert {"python_packages", "driver_files"} <= {e["tool"] for e in kept if e["event"] == "tool_call"}


def test_thermal_reasons_decide_what_is_thermal():
    """`knowledge.thermal_reasons` is what makes a GPU's event reason count as a thermal slowdown."""
    from debugagent.agent.facts import build_facts
    from debugagent.tools.snapshot import GpuFacts, Snapshot
    snap = Snapshot(host="h", gpus=[GpuFacts(index=0, event_reasons=["hw_thermal_slowdown"], under_load=True)])

    def thermal(knowledge):
        f = build_facts(snap, baseline=None, regression=None, knowledge=knowledge, symptom={}, group=lambda cs: {})
        return f["gpus"][0]["thermal"]
    assert thermal(load_playbook(None).knowledge) is True
    assert thermal({"thermal_reasons": ["sw_thermal_slowdown"]}) is False


def test_unknown_thermal_reason_is_refused():
    """A thermal reason nvidia-smi never reports is refused with a did-you-mean."""
    bad = DEFAULT.read_text().replace("thermal_reasons: [sw_thermal_slowdown,", "thermal_reasons: [sw_thermal_slowdwn,")
    with pytest.raises(PlaybookError, match="unknown event reason `sw_thermal_slowdwn`; did you mean `sw_thermal_slowdown`"):
        parse_playbook(bad, "t.yaml")


def differ(argv: list[str]) -> str:
    """`debugagent diff`'s stdout, checking it exits 1 (the snapshots differ, as diff(1))."""
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    return r.stdout


def test_cli_diff_groups_by_the_given_playbook(tmp_path):
    """`debugagent diff --playbook` files each change under that playbook's hypotheses; no playbook claim: `other`."""
    from debugagent.tools.snapshot import Snapshot, dump
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(dump(Snapshot(host="h", cpu={"governor": "performance"}, driver={"version": "580.1", "cuda": "13.0"})))
    b.write_text(dump(Snapshot(host="h", cpu={"governor": "powersave"}, driver={"version": "575.2", "cuda": "13.0"})))
    pb = tmp_path / "cpu-only.yaml"
    pb.write_text("version: 1\nname: cpu-only\nhypotheses:\n  - id: cpu_clocks\n    title: CPU\n"
                  "    evidence: [cpu.governor]\n    rules: [{when: 'true', verdict: ruled_out, because: fine}]\n")
    run = [sys.executable, "-m", "debugagent.agent.cli", "diff", str(a), str(b), "--json"]
    mine = yaml.safe_load(differ(run + ["--playbook", str(pb)]))
    assert [c["path"] for c in mine["cpu_clocks"]] == ["cpu.governor"] and [c["path"] for c in mine[OTHER]] == ["driver.version"]
    default = yaml.safe_load(differ(run))
    assert set(default) == {"host_cpu", "driver_cuda"} and default["host_cpu"][0]["b"] == "powersave"
    assert default["host_cpu"][0]["hypothesis"] == "host_cpu"  # each change still names its group, as before
