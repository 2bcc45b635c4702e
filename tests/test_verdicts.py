"""Verdicts and the conclusion: the promises of each word, as pure functions."""

from __future__ import annotations

from pathlib import Path

from debugagent.agent import conclusion as concl
from debugagent.agent import verdicts as vd
from debugagent.agent.playbook import Finding, evaluate, load_playbook
from debugagent.agent.results import ExperimentResult, Regression

from debugagent_testing import event_lines

ORDER = ["code_change", "serving_config", "compiled_dependency"]
REG = Regression(measured=True, real=True, delta=10.0, outcome="regression")


def hyps(**status: str) -> dict[str, vd.Hyp]:
    return {h: vd.Hyp(status=status.get(h, "ruled_out"), because=[f"{h} evidence"]) for h in ORDER}


def run(hs: dict[str, vd.Hyp], snapshot: bool = False) -> concl.Conclusion:
    return concl.conclude(hs, ORDER, REG, baseline_snapshot=snapshot, next_steps={"compiled_dependency": "reinstall it"},
                          not_judged=vd.NotJudged())


def test_elimination_ranks_but_never_confirms():
    """The only suspect left is ranked first with explains null and exit 3, and the step that would confirm it."""
    c = run(hyps(compiled_dependency="suspect"))
    assert c.exit_code == 3 and c.root_cause is None and c.root_causes == []
    top = c.suspects[0]
    assert top.hypothesis == "compiled_dependency" and "does not confirm" in top.rank and top.next == "reinstall it"
    assert c.to_json()["schema"] == 2


def test_with_a_baseline_snapshot_it_is_the_remaining_difference():
    """With a baseline snapshot the last untested difference is called the remaining difference, still unconfirmed."""
    c = run(hyps(compiled_dependency="suspect"), snapshot=True)
    assert "remaining difference" in c.suspects[0].rank and c.exit_code == 3


def test_an_open_hypothesis_stops_elimination():
    """With something undecided, the last suspect is not 'the only one not ruled out'."""
    c = run(hyps(compiled_dependency="suspect", code_change="inconclusive"))
    assert c.suspects[0].rank is None and [o.hypothesis for o in c.inconclusive] == ["code_change"]


def result(outcome: str, share: float = 0.0, ci=None, **found) -> ExperimentResult:
    return ExperimentResult(kind="server_restart", title="t", samples=[1.0] * 6, share=share, outcome=outcome,
                            share_ci=ci, share_se=0.05 if ci else None, significant=outcome == "cause",
                            text=f"with the change: {outcome}", **found)


SPEC = {"kind": "server_restart", "title": "t"}


def test_undecided_experiment_is_inconclusive_never_ruled_out():
    """An experiment still undecided at its budget leaves the hypothesis inconclusive, with the next step."""
    h = vd.apply_result(vd.Hyp(status="suspect", experiments=[SPEC]), SPEC, result("more"))
    assert h.status == "inconclusive" and "--max-runs" in h.next


def test_undecided_against_too_few_reference_runs_names_more_of_them_not_more_changed_runs():
    """An H200 lab's package experiment ran 24 runs of the good build against the reproduce step's 2 runs of the
    slow one and was undecided: 92% of the variance of the difference of the means was the reference's, so
    --max-runs 48 would not have decided it; more runs of the host as found would."""
    def undecided(runs: int, reference: int, **more) -> str | None:
        res = ExperimentResult(kind="server_restart", title="t", samples=[1.0] * runs, outcome="more",
                               text="undecided", reference_runs=reference, **more)
        return vd.apply_result(vd.Hyp(status="suspect", experiments=[SPEC]), SPEC, res).next
    said = undecided(24, 2)
    assert said is not None and "--min-reproduce-runs 12" in said and "--max-runs" not in said
    assert "reference state's 2 runs" in said and "92%" in said
    assert "--min-reproduce-runs 8" in (undecided(8, 3) or "")
    # balanced enough: more changed runs still narrow it
    assert "--max-runs 16" in (undecided(8, 6) or "")
    # compared with a control's runs (the server as found, restarted), not the reproduce step's: not this advice
    assert "--max-runs" in (undecided(24, 2, control=[1.0, 1.0]) or "")
    # a result from before the field (a recording): the advice as it was
    assert "--max-runs" in (undecided(24, 0) or "")


def test_a_failed_experiment_keeps_its_suspect_when_a_later_one_finds_nothing():
    """On a real H200 the known-cost flag's experiment failed (the server would not start with `--dtype auto`) and
    the group of other flags tested next recovered nothing: the flag was never measured, so the hypothesis stays a
    suspect with the failed experiment as its next step; never 'ruled out'."""
    dtype = {"kind": "server_restart", "title": "restart the server with --dtype auto"}
    group = {"kind": "server_restart", "title": "restart the server without the not-judged flags --backend"}
    h = vd.Hyp(status="suspect", experiments=[dtype, group])
    failed = ExperimentResult(kind="server_restart", title=dtype["title"], text="", error="the restarted server exited")
    h = vd.apply_result(h, dtype, failed)
    h = vd.apply_result(h, group, result("not_cause"))
    assert h.status == "suspect" and h.how != "experiment", (h.status, h.how)
    assert "--dtype auto" in (h.next or "")


def test_not_a_cause_rules_out_and_a_cause_confirms_with_its_interval():
    """'not a cause' rules out by experiment; 'cause' confirms with the measured share and interval."""
    h = vd.apply_result(vd.Hyp(status="suspect", experiments=[SPEC]), SPEC, result("not_cause"))
    assert (h.status, h.how) == ("ruled_out", "experiment")
    h = vd.apply_result(vd.Hyp(status="suspect", experiments=[SPEC]), SPEC, result("cause", 0.3, [0.2, 0.4]))
    assert (h.status, h.how, h.share) == ("confirmed", "experiment", 0.3) and h.share_ci[0] < 0.3 < h.share_ci[1]
    c = run({**hyps(), "serving_config": h})
    assert c.exit_code == 0 and c.root_cause.explains == 0.3 and c.root_cause.explains_ci is not None


def test_evidence_confirms_with_explains_null():
    """A cause confirmed by decisive evidence has no measured share: explains and its interval are null."""
    hs = hyps()
    hs["code_change"] = vd.Hyp(status="confirmed", how="evidence", because=["thermal slowdown under load"])
    c = run(hs)
    assert c.exit_code == 0 and c.root_cause.explains is None and c.root_cause.explains_ci is None


def test_partial_causes_do_not_explain_enough_until_they_add_up():
    """30% explained keeps testing; 95% stops."""
    a = vd.Hyp(status="confirmed", how="experiment", share=0.3, share_se=0.05)
    assert not vd.explains_enough({"a": a})
    b = vd.Hyp(status="confirmed", how="experiment", share=0.65, share_se=0.05)
    assert vd.explains_enough({"a": a, "b": b})


KNOWLEDGE = load_playbook(None).knowledge


def test_not_judged_lists_what_no_knowledge_list_names():
    """Unknown flags and performance variables are not judged; model flags, harmless env and costly matches are not."""
    server = {"flags": {"model-path": "x", "tp": 8, "enable-mixed-chunk": True, "disable-cuda-graph": True,
                        "speculative-attention-mode": "decode"},
              "env": {"HF_TOKEN": "[REDACTED]", "CUDA_VISIBLE_DEVICES": "0", "SGLANG_ENABLE_TORCH_COMPILE": "0",
                      "CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "WARN"}}
    nj = vd.not_judged(server, KNOWLEDGE)
    assert nj.flags == ["enable-mixed-chunk", "speculative-attention-mode"]
    assert nj.env == ["NCCL_DEBUG", "SGLANG_ENABLE_TORCH_COMPILE"]


def test_an_unlisted_flag_is_never_a_reason_to_rule_out():
    """Without a baseline snapshot, an unlisted flag leaves serving_config not judged (inconclusive), not ruled out."""
    pb = load_playbook(None)
    server = {"flags": {"model-path": "x", "enable-mixed-chunk": True}, "env": {}}
    facts = {"server": server, "diff": None, "knowledge": pb.knowledge,
             "not_judged": vd.not_judged(server, pb.knowledge).model_dump()}
    f = evaluate(pb.get("serving_config"), facts)
    assert [x.verdict for x in f] == ["inconclusive"] and "enable-mixed-chunk" in f[0].because


def test_groups_split_like_a_bisection():
    """A group of not-judged flags that recovers is split in halves; one that does not is not split."""
    spec = vd.group_experiment("flags", ["a", "b", "c"])
    assert spec["unset_flags"] == ["a", "b", "c"]
    halves = vd.split_group(spec, result("cause"))
    assert [h["group"] for h in halves] == [["a"], ["b", "c"]]
    assert vd.split_group(spec, result("not_cause")) == []


def test_experiments_ordered_by_expected_value():
    """A baseline difference or a known-costly value first, then the playbook's cost; a reflog revert and groups last."""
    cands = [("code_change", {"kind": "code_revert", "to": "abc"}),
             ("serving_config", vd.group_experiment("flags", ["x"])),
             ("env_var", {"kind": "server_restart", "title": "without X"}),
             ("gpu_clocks", {"kind": "power_limit"})]
    order = ["code_change", "gpu_clocks", "serving_config", "env_var"]
    costs = {"code_change": 3, "gpu_clocks": 1, "serving_config": 2, "env_var": 2}
    got = [h for h, _ in vd.order_experiments(cands, order, costs, None)]
    assert got == ["gpu_clocks", "env_var", "code_change", "serving_config"]
    got = [h for h, _ in vd.order_experiments(cands, order, costs, "abc")]
    assert got[:2] == ["gpu_clocks", "env_var"] and got[2] == "code_change"


def test_findings_decide_the_first_verdict():
    """Suspect findings give a suspect with its experiments; an inconclusive finding carries the next step."""
    h = vd.from_findings([Finding(verdict="suspect", because="b", rule=1, experiment=SPEC)], "next")
    assert h.status == "suspect" and h.experiments == [SPEC]
    h = vd.from_findings([Finding(verdict="inconclusive", because="no reading", rule=0)], "read it under load")
    assert h.status == "inconclusive" and h.next == "read it under load"


# ---------------------------------------------------------------- end to end on simulated hosts
def _events(out) -> list[dict]:
    from pathlib import Path
    return event_lines(Path(out["transcript"]) / "events.jsonl")


def test_max_runs_caps_every_experiment(tmp_path):
    """`--max-runs 3` runs at most 3 benchmark runs per experiment, the re-measured reference included."""
    from debugagent.agent.run import RunOptions, investigate
    out = investigate(RunOptions(host="sim:two-causes", symptom="decode 69 tok/s", baseline="decode 89 tok/s",
                                 as_json=True, out=str(tmp_path / "run"), max_runs=3))
    per: dict[str, int] = {}
    current = None
    for e in _events(out):
        if e["event"] == "experiment" and e.get("phase") == "start":
            current = e["text"]
            per[current] = 0
        elif e["event"] == "experiment" and e.get("phase") == "result":
            current = None
        elif e["event"] == "tool_call" and e["tool"] == "bench" and current:
            per[current] += 1
    assert per and all(n <= 3 for n in per.values()), per


def test_snapshot_without_numbers_measures_no_share(tmp_path):
    """A baseline snapshot with no benchmark numbers gives causes with explains null, never an absurd share."""
    from debugagent.agent.run import RunOptions, investigate
    from debugagent.tools.registry import Runner
    from debugagent.tools.sim import SimTransport
    from debugagent.tools.snapshot import collect, dump
    snap = tmp_path / "good.json"
    with SimTransport("sim:launch-blocking@good") as t:
        snap.write_text(dump(collect(Runner(t), bench_runs=0)))
    out = investigate(RunOptions(host="sim:launch-blocking", symptom="verify 30ms", baseline_snapshot=str(snap),
                                 as_json=True, out=str(tmp_path / "run")))
    assert out["root_cause"]["hypothesis"] == "env_var" and out["exit_code"] == 0
    assert out["root_cause"]["explains"] is None and out["root_cause"]["explains_ci"] is None
    assert "share not measured" in out["summary"]


def test_min_reproduce_runs_takes_that_many_runs_of_the_host_as_found(tmp_path):
    """--min-reproduce-runs N: the reproduce step runs N times even where 2 decide it (a baseline snapshot's runs
    estimate the noise), and every experiment compares with those N; it is recorded, so a replay asks the same."""
    from debugagent.agent.run import RunOptions, investigate
    from debugagent.tools.registry import Runner
    from debugagent.tools.sim import SimTransport
    from debugagent.tools.snapshot import collect, dump
    snap = tmp_path / "good.json"
    with SimTransport("sim:launch-blocking@good") as t:
        snap.write_text(dump(collect(Runner(t), bench_runs=3)))
    runs = {}
    for least in (None, 5):
        out = investigate(RunOptions(host="sim:launch-blocking", symptom="verify 30ms", baseline_snapshot=str(snap),
                                     min_reproduce_runs=least, read_only=True, as_json=True,
                                     out=str(tmp_path / f"run-{least}")))
        runs[least] = out["regression"]["runs"]
        inputs = next(e for e in event_lines(tmp_path / f"run-{least}" / "events.jsonl")
                      if e["event"] == "run_started")["inputs"]
        assert inputs.get("min_reproduce_runs") == least
    assert runs[None] == 2 and runs[5] == 5


def _gpu_facts_against_the_h200_baseline(**gpu_changes):
    from debugagent.agent.facts import build_facts
    from debugagent.tools.snapshot import Snapshot
    base = Snapshot.load(str(Path(__file__).parent / "vectors" / "h200" / "lab_baseline_snapshot.json"))
    now = base.model_copy(deep=True)
    now.gpus[0] = now.gpus[0].model_copy(update=gpu_changes)
    pb = load_playbook(None)
    facts = build_facts(now, baseline=base, regression=None, knowledge=pb.knowledge, symptom={}, group=pb.group)
    return vd.judge(pb, "gpu_clocks", facts)


def test_a_lower_power_draw_at_full_clocks_is_no_evidence_against_the_gpu():
    """On the H200 the slow build of a compiled extension drew 207 W where the healthy server drew 239 W, at the
    same 1980 MHz and no event reason: the GPU had less work, it did not slow the server. That was once the run's
    'top suspect'."""
    h = _gpu_facts_against_the_h200_baseline(power_draw=206.57, temperature=33)
    assert h.status == "ruled_out", h
    assert "gpus.0.power_draw 239.43 -> 206.57" in " ".join(h.because) and "follows the load" in " ".join(h.because)


def test_lower_clocks_under_load_than_the_baseline_stay_a_suspect():
    h = _gpu_facts_against_the_h200_baseline(sm_clock=1500, power_draw=206.57)
    assert h.status == "suspect" and "gpus.0.sm_clock 1980 -> 1500" in " ".join(h.because)
    assert "power_draw" not in " ".join(h.because)


def test_identity_is_narrow_performance_flags_are_suspects_and_workload_flags_are_never_removed():
    """Only what is served and where names the server; dtype, speculative settings, chunked prefill, batch sizes are
    performance flags (not judged, tested by removal); dtype float32 is a known cost; a value as fast as the default
    is nothing to test; an offline script's --batch-size, and a flag the benchmark's own command gives, are the
    workload's and never removed. The rules say which are which."""
    pb = load_playbook(None)
    server = {"flags": {"model-path": "x", "tp": "8", "port": "30000", "speculative-algorithm": "EAGLE3",
                        "speculative-num-steps": "3", "chunked-prefill-size": "512", "max-running-requests": "64",
                        "kv-cache-dtype": "auto", "batch-size": "64", "num-prompts": "2000"}, "env": {}}
    nj = vd.not_judged(server, pb.knowledge, bench_cmd="python /root/offline.py --num-prompts 2000")
    assert nj.flags == ["chunked-prefill-size", "max-running-requests", "speculative-algorithm", "speculative-num-steps"]
    assert nj.workload == ["batch-size", "num-prompts"] and nj.at_default == ["kv-cache-dtype"]
    assert vd.not_judged({"flags": {"model-path": "x", "dtype": "float32"}, "env": {}}, pb.knowledge).flags == []
    facts = {"server": server, "diff": None, "knowledge": pb.knowledge, "not_judged": nj.model_dump()}
    f = evaluate(pb.get("serving_config"), facts)
    assert [x.verdict for x in f] == ["inconclusive"]
    assert "--speculative-algorithm EAGLE3" in f[0].because and "never removed" in f[0].because
    assert "--batch-size 64" in f[0].because
    fp32 = {"model-path": "x", "dtype": "float32"}
    facts = {"server": {"flags": fp32, "env": {}}, "diff": None, "knowledge": pb.knowledge,
             "not_judged": vd.not_judged({"flags": fp32, "env": {}}, pb.knowledge).model_dump()}
    f = evaluate(pb.get("serving_config"), facts)
    assert f[0].verdict == "suspect" and f[0].experiment["set_flags"] == {"dtype": "auto"}
    quiet = {"model-path": "x", "tp": "2", "dtype": "bfloat16"}
    facts = {"server": {"flags": quiet, "env": {}}, "diff": None, "knowledge": pb.knowledge,
             "not_judged": vd.not_judged({"flags": quiet, "env": {}}, pb.knowledge).model_dump()}
    f = evaluate(pb.get("serving_config"), facts)
    assert f[0].verdict == "inconclusive" and "model-path=x tp=2" in f[0].because and "--dtype bfloat16" in f[0].because


def test_confirmed_causes_are_reverted_together_and_the_joint_share_is_reported():
    """Two causes confirmed by restarts are merged into one restart (every flag and variable of each, a restoring
    spec turned into what it puts back); the joint share, its interval and the unexplained rest reach the summary,
    the headline and --json; a cause of another kind (a governor) is not combined, and says why."""
    from debugagent.agent.answer import headline
    flag = {"kind": "server_restart", "title": "restart the server with --dtype auto", "set_flags": {"dtype": "auto"},
            "unset_flags": [""], "set_env": {}, "unset_env": []}
    env1 = {"kind": "server_restart", "title": "without CUDA_LAUNCH_BLOCKING", "unset_env": ["CUDA_LAUNCH_BLOCKING"]}
    env2 = {"kind": "restore_baseline_env", "title": "the baseline's environment"}
    hs = {"serving_config": vd.Hyp(status="confirmed", how="experiment", share=0.6, share_se=0.05, share_ci=(0.5, 0.7),
                                   because=["--dtype float32"], cause_specs=[flag]),
          "env_var": vd.Hyp(status="confirmed", how="experiment", share=0.3, share_se=0.05, share_ci=(0.2, 0.4),
                            because=["CUDA_LAUNCH_BLOCKING=1"], cause_specs=[env1, env2]),
          "code_change": vd.Hyp(status="ruled_out")}
    resolve = lambda sp: {**sp, "unset_env": ["NCCL_PROTO"]} if sp["kind"] == "restore_baseline_env" else sp  # noqa: E731
    spec, why = vd.joint_experiment(hs, resolve)
    assert spec is not None and not why
    assert spec["kind"] == "server_restart" and spec["set_flags"] == {"dtype": "auto"} and spec["unset_flags"] == []
    assert spec["unset_env"] == ["CUDA_LAUNCH_BLOCKING", "NCCL_PROTO"] and spec[vd.JOINT] == ["serving_config", "env_var"]
    res = ExperimentResult(kind="server_restart", title=spec["title"], text="with …: recovers 80%", share=0.8,
                           share_ci=(0.7, 0.9), outcome="cause", significant=True)
    joint = vd.joint_result(spec[vd.JOINT], res, hs)
    assert joint["share"] == 0.8 and joint["unexplained"] == 0.2 and joint["sum_alone"] == 0.9
    c = concl.conclude({**hs, "compiled_dependency": vd.Hyp(status="ruled_out")}, ORDER + ["env_var"], REG,
                       baseline_snapshot=False, next_steps={}, not_judged=vd.NotJudged(), joint=joint)
    assert c.joint is not None and "Together they recover 80% (95% CI 70% to 90%); 20% unexplained." in c.summary
    h = headline(c.model_dump(mode="json", by_alias=True))
    assert h.startswith("Root causes: serving_config (explains 60%), env_var (explains 30%); together they recover 80% "
                        "(95% CI 70% to 90%)")
    assert h.endswith("20% unexplained") and len(h) <= 160
    hs["env_var"].cause_specs = [{"kind": "governor", "governor": "performance"}]
    spec, why = vd.joint_experiment(hs, resolve)
    assert spec is None and "governor" in why
    # a package overlay and a variable: one restart onto the overlay with the variable unset (two overlays: not)
    hs["env_var"].cause_specs = [{"kind": "server_restart", "title": "u", "unset_env": ["CUDA_LAUNCH_BLOCKING"]}]
    hs["serving_config"].cause_specs = [{"kind": "package_restore", "title": "the baseline build", "package": "flashinfer"}]
    spec, why = vd.joint_experiment(hs, resolve)
    assert spec is not None and spec["kind"] == "package_restore" and spec["package"] == "flashinfer", why
    assert spec["unset_env"] == ["CUDA_LAUNCH_BLOCKING"] and spec["set_flags"] == {} and spec[vd.JOINT]
    hs["env_var"].cause_specs = [{"kind": "package_restore", "title": "another"}]
    assert vd.joint_experiment(hs, resolve)[0] is None


def test_a_suspect_ruled_out_alone_is_judged_by_what_it_adds_with_the_confirmed_causes_reverted():
    """A suspect ruled out alone keeps its experiment's spec; where the confirmed cause leaves the regression
    unexplained it may be tested again with that cause reverted in the same restart. What it adds to the cause's own
    share decides: a cause only where that is far beyond both measurements' noise and at least 20%; not a cause where
    its 80% upper bound stays below 20%; undecided between."""
    flag = {"kind": "server_restart", "title": "restart the server with --dtype auto", "set_flags": {"dtype": "auto"}}
    env = {"kind": "server_restart", "title": "restart the server without CUDA_LAUNCH_BLOCKING",
           "unset_env": ["CUDA_LAUNCH_BLOCKING"]}
    alone = ExperimentResult(kind="server_restart", title=env["title"], text="recovers 2%", share=0.02,
                             outcome="not_cause", rule="the 80% upper bound ... 3%")
    h = vd.apply_result(vd.Hyp(status="suspect", experiments=[env]), env, alone)
    assert h.status == "ruled_out" and h.how == "experiment" and h.ruled_specs == [env]
    hs = {"serving_config": vd.Hyp(status="confirmed", how="experiment", share=0.64, share_se=0.025,
                                   share_ci=(0.59, 0.69), cause_specs=[flag]), "env_var": h}
    assert vd.hidden_suspects(hs, ["serving_config", "env_var"]) == ["env_var"]
    assert vd.unexplained_by(hs, None) == (0.64, (0.69 - 0.59) / 3.92)
    spec, why = vd.joint_experiment(hs, lambda sp: sp, ("env_var", h.ruled_specs[-1]))
    assert spec is not None and spec["set_flags"] == {"dtype": "auto"} and spec["unset_env"] == ["CUDA_LAUNCH_BLOCKING"]
    assert spec[vd.JOINT] == ["serving_config", "env_var"] and spec[vd.ON_TOP] == "env_var", why

    def together(share: float, half: float) -> ExperimentResult:
        return ExperimentResult(kind="server_restart", title=spec["title"], text=f"recovers {share:.0%}", share=share,
                                share_ci=(share - half, share + half), share_se=half / 1.96, outcome="cause",
                                significant=True)
    base = vd.unexplained_by(hs, None)
    assert base is not None
    found = vd.on_top_result("env_var", h, ["serving_config"], together(1.0, 0.04), base)
    assert found.status == "confirmed" and found.how == "experiment" and found.cause_specs == [env]
    assert found.share is not None and abs(found.share - 0.36) < 1e-9 and found.share_ci is not None
    assert "adds 36% of the regression" in found.because[-1] and "hidden while serving_config was in place" in found.because[-1]
    # now both are measured, together they may explain it: nothing left to look for
    assert vd.unexplained_by({**hs, "env_var": found}, {"causes": ["serving_config", "env_var"], "share": 1.0,
                                                         "share_ci": (0.96, 1.04)}) is None
    # a run that has seen the server's speed move between starts: one start of it cannot show what it adds
    moved = vd.on_top_result("env_var", h, ["serving_config"], together(1.0, 0.04), base,
                             "in this run the server as found, restarted for a control, read 735")
    assert moved.status == "inconclusive" and moved.next and "over more starts" in moved.next and "read 735" in moved.next
    same = vd.on_top_result("env_var", h, ["serving_config"], together(0.66, 0.04), base)
    assert same.status == "ruled_out" and same.rule and "with serving_config reverted too" in same.rule
    assert same.rule in same.because[-1]
    assert "not a cause with serving_config reverted either" in same.because[-1]
    wide = vd.on_top_result("env_var", h, ["serving_config"], together(0.85, 0.3), base)
    assert wide.status == "inconclusive" and wide.next and wide.next.startswith('repeat "')
    failed = vd.on_top_result("env_var", h, ["serving_config"],
                              ExperimentResult(kind="server_restart", text="", error="the server did not start"), base)
    assert failed.status == "ruled_out" and "not measured: the server did not start" in failed.because[-1]
    # an interval that reaches 100% leaves nothing to look for; no confirmed cause, nothing to revert
    assert vd.unexplained_by({**hs, "serving_config": hs["serving_config"].model_copy(update={"share_ci": (0.6, 1.01)})},
                             None) is None
    assert vd.unexplained_by({"env_var": h}, None) is None


def test_a_ruled_out_experiment_says_the_bound_that_decided_it():
    """'Not a cause' names the bound that decided it, in the result's text and as its rule; the verdict keeps it."""
    from debugagent.agent.stats import decide
    d = decide([30.0, 30.2, 29.9, 30.1], [29.95, 30.05, 30.1, 30.0], 10.0, True)
    assert d.outcome == "not_cause" and d.rule.startswith("the 80% upper bound of what it recovers is ")
    assert "of the regression, below the 20% a cause must recover" in d.rule and d.rule in d.text
    h = vd.Hyp(status="suspect", experiments=[{"kind": "server_restart", "title": "t"}])
    res = ExperimentResult(kind="server_restart", title="t", text=d.text, outcome="not_cause", rule=d.rule)
    h = vd.apply_result(h, {"kind": "server_restart", "title": "t"}, res)
    assert h.status == "ruled_out" and h.rule == d.rule
    c = concl.conclude({**hyps(), "code_change": h}, ORDER, REG, baseline_snapshot=False, next_steps={},
                       not_judged=vd.NotJudged())
    assert c.ruled_out[0].rule == d.rule


def test_a_hypothesis_ruled_out_on_its_known_flag_still_tests_the_flags_no_list_judges():
    """The quick start's case: serving_config ruled out by removing its one known-costly flag, the speculative flags
    no knowledge list names left. With no confirmed cause, their group is added and runs: a ruled-out verdict covers
    what was measured, not the flags it never touched."""
    spec = {"kind": "server_restart", "title": "restart the server with --speculative-attention-mode decode"}
    hs = {"serving_config": vd.apply_result(vd.Hyp(status="suspect", experiments=[spec]), spec, result("not_cause")),
          "env_var": vd.Hyp(status="inconclusive")}
    assert hs["serving_config"].status == "ruled_out"
    nj = vd.NotJudged(flags=["speculative-algorithm", "speculative-num-steps"])
    targets = {"serving_config": "flags", "env_var": "env"}
    assert vd.add_groups(hs, nj, targets) == [("serving_config", nj.flags)]
    cands = vd.candidates(hs, ["serving_config", "env_var"], [], {}, None)
    assert [(h, e.get("group")) for h, e in cands] == [("serving_config", nj.flags)]


def test_ruled_out_never_stands_while_flags_of_its_evidence_are_not_judged():
    """A group target ruled out on what it measured, while flags no list judges were never decided by removal (not
    run, failed, or undecided), is "not decided" and says how many and which; once their group is decided "not a
    cause" the ruled-out stands; with a baseline snapshot nothing changes (equal flags exclude them all)."""
    ruled = vd.Hyp(status="ruled_out", how="experiment", because=["--speculative-attention-mode decode: no change"],
                   rule="the 80% upper bound …")
    nj = vd.NotJudged(flags=["speculative-algorithm", "speculative-num-steps"])
    targets = {"serving_config": "flags", "env_var": "env"}
    got = vd.unjudged_left({"serving_config": ruled}, nj, targets)
    h = got["serving_config"]
    assert h.status == "inconclusive" and h.how is None and h.rule is None
    assert "2 flags not judged" in h.because[-1] and "--speculative-algorithm, --speculative-num-steps" in h.because[-1]
    assert h.next and "--speculative-algorithm" in h.next
    c = concl.conclude(got, ["serving_config"], REG, baseline_snapshot=False, next_steps={}, not_judged=nj)
    assert [o.hypothesis for o in c.inconclusive] == ["serving_config"] and not c.ruled_out
    group = vd.group_experiment("flags", nj.flags)
    for bad in (result("more"), ExperimentResult.failed("server_restart", "the server did not come back")):
        tried = vd.apply_result(ruled.model_copy(update={"experiments": [group]}), group, bad)
        assert vd.unjudged_left({"serving_config": tried}, nj, targets)["serving_config"].status == "inconclusive"
    decided = vd.apply_result(ruled.model_copy(update={"experiments": [group]}), group, result("not_cause"))
    assert vd.unjudged_left({"serving_config": decided}, nj, targets) == {}
    assert vd.unjudged_left({"serving_config": ruled}, vd.NotJudged(), targets) == {}
    assert vd.unjudged_left({"serving_config": ruled}, vd.NotJudged(env=["NCCL_X"]), targets) == {}


def test_flags_a_group_removal_decided_are_said_as_removed_not_as_not_judged():
    """Once their group's removal decided "not a cause", the flags no list names are said so (`removed` in --json,
    the summary and the answer), not "not judged"; a failed removal leaves them not judged."""
    from debugagent.agent.answer import evidence_lines
    nj = vd.NotJudged(flags=["speculative-algorithm", "speculative-num-steps"], env=["NCCL_X"])
    targets = {"serving_config": "flags", "env_var": "env"}
    group = vd.group_experiment("flags", nj.flags)
    ruled = vd.Hyp(status="ruled_out", how="experiment", experiments=[group])
    hs = {"serving_config": vd.apply_result(ruled, group, result("not_cause")),
          "env_var": vd.apply_result(vd.Hyp(status="inconclusive", experiments=[vd.group_experiment("env", ["NCCL_X"])]),
                                     vd.group_experiment("env", ["NCCL_X"]),
                                     ExperimentResult.failed("server_restart", "the server did not come back"))}
    got = vd.removed_not_cause(hs, nj, targets)
    assert got.removed == ["speculative-algorithm", "speculative-num-steps"]
    c = concl.conclude(hs, ["serving_config", "env_var"], REG, baseline_snapshot=False, next_steps={}, not_judged=got)
    assert "Not judged: NCCL_X." in c.summary
    assert "not a cause (no knowledge list names them): --speculative-algorithm, --speculative-num-steps." in c.summary
    lines = evidence_lines(c.to_json())
    assert "- not judged (no knowledge list names them): NCCL_X" in lines
    assert ("- removed by experiment, not a cause (no knowledge list names them): --speculative-algorithm, "
            "--speculative-num-steps") in lines


def test_a_value_a_hypothesis_experiment_decided_is_not_said_not_judged():
    """A playbook's own hypothesis whose experiment unset OMP_NUM_THREADS and decided it: the summary names it as the
    root cause and no longer as "not judged"; a failed experiment judged nothing."""
    spec = {"kind": "server_restart", "title": "restart the server without OMP_NUM_THREADS", "unset_env": ["OMP_NUM_THREADS"]}
    h = vd.apply_result(vd.Hyp(status="suspect", experiments=[spec]), spec, result("cause", 0.9, (0.7, 1.1)))
    nj = vd.NotJudged(env=["NCCL_X", "OMP_NUM_THREADS"])
    got = vd.without_judged({"omp_threads": h}, nj)
    assert got.env == ["NCCL_X"]
    c = concl.conclude({"omp_threads": h}, ["omp_threads"], REG, baseline_snapshot=False, next_steps={}, not_judged=got)
    assert c.summary.startswith("Root cause: omp_threads") and "OMP_NUM_THREADS" not in c.summary.split("Not judged")[1]
    failed = vd.apply_result(vd.Hyp(status="suspect", experiments=[spec]), spec,
                             ExperimentResult.failed("server_restart", "the server did not come back"))
    assert vd.without_judged({"omp_threads": failed}, nj).env == ["NCCL_X", "OMP_NUM_THREADS"]


def test_a_driver_that_differs_from_the_peer_stays_a_suspect_with_the_interleaved_runs_as_evidence():
    """No experiment changes a driver: against a peer, the driver's difference is a suspect whose evidence is the
    interleaved measurement, and its next step says why it is not confirmed and how to confirm it."""
    pb = load_playbook(None)
    diff = {"driver_cuda": [{"path": "driver.version", "a": "580.159.04", "b": "575.57.08"}]}
    driver = {"version": "575.57.08", "cuda": "12.9"}
    peer = {"mean": 23.5617, "baseline": 19.6775, "peer": {"host": "gpu-01", "samples": [19.5, 19.9], "interleaved": True}}
    h = vd.judge(pb, "driver_cuda", {"driver": driver, "diff": diff, "regression": peer})
    assert h.status == "suspect"
    assert h.because[0] == ("the driver differs from the peer gpu-01: driver.version 580.159.04 -> 575.57.08; measured "
                            "against that peer now, runs interleaved: 23.56 on the host against 19.68 on the peer (2 "
                            "peer runs)")
    assert (h.next or "").startswith("a driver is not changed by an experiment; to confirm: ")
    # against a snapshot taken earlier (no peer): the snapshot named, no measurement claimed
    h = vd.judge(pb, "driver_cuda", {"driver": driver, "diff": diff, "regression": {"mean": 23.5, "baseline": 20.0}})
    assert h.because[0] == "the driver differs from the baseline snapshot: driver.version 580.159.04 -> 575.57.08"
