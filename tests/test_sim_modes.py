"""One history and one answer: a scenario's good and bad hosts share their git history, sealed or not, and a
host that is not sealed (no bubblewrap) concludes what a sealed one does."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from debugagent.agent.run import RunOptions, investigate
from debugagent.tools.registry import Runner
from debugagent.tools.sim import SimTransport, load_scenario
from debugagent.tools.sim.sandbox import SimHost
from debugagent.tools.sim.seal import available
from debugagent.tools.snapshot import collect, dump

BISECT = "code-regression-bisect"


def history(h: SimHost) -> tuple[list[str], list[str]]:
    repo = h.scenario.host.repo
    assert repo is not None
    log = h.exec(f"git -C {repo.path} log --format=%H%x20%s main@{{0}} --reflog").stdout.split("\n")
    reflog = h.exec(f"git -C {repo.path} reflog --format='%H %gs %gd' --date=unix").stdout.splitlines()
    return [x for x in log if x], reflog


def test_good_and_bad_share_one_history():
    """The good host's commits are the bad host's (same hashes, sealed or not), and its reflog is the bad host's
    up to where the repo.head factor moves HEAD: the bad one has one more entry, the fast-forward."""
    sc = load_scenario(BISECT)
    seen = {}
    for sealed in ([False, True] if available() else [False]):
        for which in ("good", "bad"):
            # a short root: the host's service socket path must fit AF_UNIX's 108 bytes under any tmp_path
            root = tempfile.mkdtemp(prefix=f"da-{which}-")
            h = SimHost(sc, which, root=root, sealed=sealed)
            try:
                seen[which, sealed] = history(h)
            finally:
                h.close()
                shutil.rmtree(root, ignore_errors=True)
    good, bad = seen["good", False], seen["bad", False]
    assert sorted(good[0]) == sorted(bad[0]) and len(good[0]) == 8
    assert bad[1][1:] == good[1] and "Fast-forward" in bad[1][0]
    if available():
        assert seen["good", True] == good and seen["bad", True] == bad


@pytest.mark.slow
def test_good_snapshot_as_baseline_makes_the_code_experiment_work(tmp_path, monkeypatch):
    """A snapshot of sim:X@good used as --baseline-snapshot for sim:X on hosts that are not sealed (sealed:
    test_agent's test_scenario_with_baseline_snapshot): the code experiment checks out the good commit the
    snapshot names (the same hash on the bad host) and confirms the commit by bisection."""
    monkeypatch.setenv("DEBUGAGENT_SIM_UNSEALED", "1")
    sealed = False
    sc = load_scenario(BISECT)
    snap = tmp_path / "good.json"
    with SimTransport(f"sim:{BISECT}@good") as t:
        assert t.sim.sealed == sealed
        snap.write_text(dump(collect(Runner(t), bench_runs=3)))
    out = investigate(RunOptions(host=f"sim:{BISECT}", symptom=sc.symptom, baseline_snapshot=str(snap), as_json=True,
                                 out=str(tmp_path / "run")))
    rc = out["root_cause"]
    assert out["exit_code"] == 0 and rc and rc["hypothesis"] == "code_change" and rc["how"] == "experiment", out["summary"]
    assert "top-k" in out["summary"].lower(), out["summary"]


def conclusion(out) -> dict:
    top = (out.get("suspects") or [{}])[0].get("hypothesis")
    return {"exit_code": out["exit_code"], "causes": sorted(c["hypothesis"] for c in out["root_causes"]),
            "top_suspect": top}


# A representative subset (an environment variable, no regression); every
# built-in scenario in both modes: `bench/scenarios --seal both` (docs/benchmarks.md).
SUBSET = ["launch-blocking", "no-regression"]


@pytest.mark.slow
@pytest.mark.skipif(not available(), reason="comparing needs a sealed host: bwrap")
@pytest.mark.parametrize("name", SUBSET)
def test_sealed_and_unsealed_conclude_the_same(tmp_path, monkeypatch, name):
    """The same scenario diagnosed on a sealed host and on one that is not sealed: one conclusion."""
    sc = load_scenario(name)
    got = {}
    for mode in ("sealed", "unsealed"):
        if mode == "unsealed":
            monkeypatch.setenv("DEBUGAGENT_SIM_UNSEALED", "1")
        out = investigate(RunOptions(host=f"sim:{name}", symptom=sc.symptom, baseline=sc.baseline, as_json=True,
                                     out=str(tmp_path / mode)))
        got[mode] = conclusion(out)
    assert got["sealed"] == got["unsealed"]
    want, c = sc.expect.root_cause, got["sealed"]
    assert (c["exit_code"] == 3 and not c["causes"]) if want is None else (want in c["causes"] or c["top_suspect"] == want)
