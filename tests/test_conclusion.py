"""The typed core without a graph: the conclusion from verdicts and the regression, a verdict from an
experiment's typed result, the plan's candidates, the facts per area, and the state's saved form."""

from __future__ import annotations

from debugagent.agent import conclusion as concl
from debugagent.agent import verdicts as vd
from debugagent.agent.facts import LabFacts
from debugagent.agent.playbook import restored
from debugagent.agent.results import ExperimentResult, Regression
from debugagent.agent.state import Current, RunState, to_jsonable
from debugagent.agent.stats import Reproduction
from debugagent.agent.steps import regression_of, reproduce_words
from debugagent.tools.host import ServerInfo
from debugagent.tools.probes.gpu import tenants
from debugagent.tools.probes.host import host_facts
from debugagent.tools.redact import redact
from debugagent.tools.snapshot import GpuFacts, Snapshot

ORDER = ["code_change", "serving_config", "env_var"]
REG = Regression(measured=True, real=True, samples=[30.0, 31.0, 29.0], delta=10.0, delta_se=0.5,
                 outcome="regression", why="worse")
GROUP = vd.group_experiment("flags", ["a", "b"])


def res(outcome: str | None, text: str, **kw) -> ExperimentResult:
    return ExperimentResult(kind="server_restart", text=text, outcome=outcome, samples=[20.0] * 4, **kw)


def ruled_out() -> dict[str, vd.Hyp]:
    return {h: vd.Hyp(status="ruled_out", how="evidence", because=[f"{h}: unchanged"]) for h in ORDER}


def conclude(hyps: dict[str, vd.Hyp], reg: Regression = REG) -> concl.RunConclusion:
    return concl.run_conclusion(hyps, ORDER, reg, baseline_snapshot=False, next_steps={}, not_judged=vd.NotJudged(),
                                commands=7, bench_runs=5, notes=["n"])


def test_the_cause_summary_is_the_last_result_decided_a_cause():
    """The summary is the narrowest cause's own text, read from the typed outcome, not from the wording."""
    h = vd.Hyp(status="suspect", because=["flags differ"], experiments=[GROUP])
    h = vd.after_experiment("serving_config", h, GROUP, res("cause", "both flags off: recovers all", share=0.9,
                                                              share_ci=(0.8, 1.0), share_se=0.05))
    half_a, half_b = h.experiments
    h = vd.after_experiment("serving_config", h, half_a, res("cause", "without --a: recovers all", share=0.9,
                                                              share_ci=(0.8, 1.0), share_se=0.05,
                                                              fix="drop --a from the unit"))
    h = vd.after_experiment("serving_config", h, half_b, res("not_cause", "without --b: nothing"))
    c = conclude({**ruled_out(), "serving_config": h})
    assert c.exit_code == 0 and c.root_cause is not None
    assert c.root_cause.summary == "without --a: recovers all" and c.root_cause.fix == "drop --a from the unit"
    assert c.root_cause.explains == 0.9   # the narrower group's share replaces the wider one's, not added to it


def test_a_culprit_commit_leads_the_summary():
    """A bisection's culprit is named before the experiment's text, with its confidence."""
    spec = {"kind": "code_revert", "title": "revert", "to": "abc"}
    culprit = {"sha": "1c9e0aa" * 5, "short": "1c9e0aa", "subject": "Validate LoRA requests", "confidence": 0.99}
    h = vd.apply_result(vd.Hyp(status="suspect", because=["head moved"], experiments=[spec]), spec,
                        res("cause", "at abc: recovers", culprit=culprit, share=1.0, share_ci=(0.9, 1.1)))
    c = conclude({**ruled_out(), "code_change": h})
    assert c.root_cause.summary.startswith('commit 1c9e0aa "Validate LoRA requests" (1c9e0aa1c9e0, confidence 99%)')
    assert c.root_cause.culprit == culprit


def test_a_failed_experiment_keeps_the_suspect_and_says_what_stopped_it():
    """An experiment that could not run measures nothing: the suspect stays one, named with what to fix."""
    spec = {"kind": "server_restart", "title": "restart"}
    h = vd.apply_result(vd.Hyp(status="suspect", because=["flag set"], experiments=[spec]), spec,
                        ExperimentResult.failed("server_restart", "the server runs under systemd"))
    assert h.status == "suspect" and h.because[-1] == "experiment failed: the server runs under systemd"
    assert h.next.startswith('"restart", once what stopped it')
    c = conclude({**ruled_out(), "env_var": h})
    assert c.exit_code == 3 and c.suspects[0].hypothesis == "env_var"


def test_run_conclusion_has_the_table_and_the_counts():
    """Every hypothesis in the playbook's order in the table; the regression without its samples; the counts."""
    c = conclude(ruled_out())
    assert [r.id for r in c.table] == ORDER and all(r.status == "ruled_out" for r in c.table)
    j = c.to_json()
    assert j["schema"] == 2 and j["commands"] == 7 and j["bench_runs"] == 5 and j["notes"] == ["n"]
    assert "samples" not in j["regression"] and j["regression"]["delta"] == 10.0
    assert j["summary"] == "No confirmed root cause." and j["exit_code"] == 3


def test_a_refuted_regression_blames_nothing():
    """Measured and not worse: exit 3, no cause even when a hypothesis was confirmed, and the words say why."""
    hyps = {**ruled_out(), "env_var": vd.Hyp(status="confirmed", how="evidence", because=["x"])}
    for outcome, words in (("none", "No reproducible regression: within noise"),
                           ("better", "were --symptom and --baseline swapped?"),
                           ("more", "run with --reproduce-runs 12")):
        reg = Regression(measured=True, real=False, samples=[1.0, 2.0], why="within noise", outcome=outcome,
                         runs_needed=12)
        c = conclude(hyps, reg)
        assert c.exit_code == 3 and c.root_causes == [] and words in c.summary, (outcome, c.summary)


def test_candidates_skip_what_is_done_and_what_an_experiment_confirmed():
    """Done experiments are not offered again; a hypothesis confirmed by experiment offers its groups' halves and
    its other values known to cost (a second costly value is a second cause), not its weaker evidence."""
    a, b = {"kind": "server_restart", "title": "a"}, {"kind": "server_restart", "title": "b"}
    weak = {"kind": "code_revert", "title": "w", "to": "HEAD@{1}"}   # the reflog's word, not the baseline's commit
    hyps = {"code_change": vd.Hyp(status="suspect", experiments=[a, b]),
            "serving_config": vd.Hyp(status="confirmed", how="experiment", experiments=[a, weak, GROUP]),
            "env_var": vd.Hyp(status="ruled_out", experiments=[a])}
    got = vd.candidates(hyps, ORDER, [vd.exp_key("code_change", a)], {}, "abc123")
    assert got == [("code_change", b), ("serving_config", a), ("serving_config", GROUP)]


def test_not_judged_groups_are_added_once():
    """The not-judged flags and variables become one group experiment each, the first time only."""
    hyps = {h: vd.Hyp(status="inconclusive") for h in ORDER}
    nj = vd.NotJudged(flags=["x"], env=["Y"])
    assert vd.add_groups(hyps, nj, {"serving_config": "flags", "env_var": "env"}) == [("serving_config", ["x"]), ("env_var", ["Y"])]
    assert hyps["env_var"].experiments[0]["unset_env"] == ["Y"]
    assert vd.add_groups(hyps, nj, {"serving_config": "flags", "env_var": "env"}) == []


def test_an_experiment_not_allowed_names_how_to_run_it():
    """Refused, the experiment is dropped and the hypothesis says how to run it; the input is not changed."""
    spec = {"kind": "server_restart", "title": "restart"}
    h = vd.Hyp(status="suspect", experiments=[spec])
    got = vd.not_run(h, spec, "restart")
    assert got.experiments == [] and got.next == 'run "restart" (give --allow-mutations)' and h.experiments == [spec]


def test_the_regression_keeps_only_what_was_measured():
    """Without a baseline number the regression has no delta and no size; measured, its size is the delta."""
    assert regression_of([], None, None, "") == Regression(measured=False, real=True, why="the benchmark failed")
    unmeasured = regression_of([30.0, 31.0], None, None, "")
    assert set(unmeasured.to_json()) == {"measured", "samples", "mean", "real", "why"} and unmeasured.size is None
    rep = Reproduction(outcome="regression", mean=30.0, sd=0.5, delta=10.0, delta_se=0.3, text="worse by 10")
    reg = regression_of([30.0] * 3, rep, 20.0, "verify 20ms")
    assert reg.size == 10.0 and not reg.refuted and reg.to_json(samples=False)["baseline_source"] == "verify 20ms"
    assert reproduce_words(reg, rep, 3) == "The regression is real: worse by 10."


def test_facts_per_area():
    """Tenants are other pids than the server's; a host without readings has the empty host facts."""
    snap = Snapshot(host="h", gpu_processes=[{"pid": 10}, {"pid": 11}, {"pid": 12}])
    assert tenants(snap, {"pid": 10, "workers": [11]}) == [{"pid": 12}]
    assert host_facts(snap) == {"governor": None, "cores": 0, "load1": 0.0, "hostname": ""}


def test_lab_facts_are_typed():
    """Experiments read the checkout, the GPUs and the baseline's differences as typed fields."""
    good = Snapshot(host="h", gpus=[GpuFacts(index=0, power_limit=700.0)],
                    server=ServerInfo(pid=1, argv=["python", "-m", "srv", "--tp", "8"], flags={"tp": "8"}))
    bad = good.model_copy(update={"server": ServerInfo(pid=1, argv=["python", "-m", "srv", "--tp", "4"],
                                                       flags={"tp": "4"}, python="/venv/bin/python")})
    f = LabFacts.of(bad, good)
    assert f.gpu(0).power_limit == 700.0 and f.server_python == "/venv/bin/python" and f.repo_path is None
    assert [(c.path, c.a, c.b) for c in f.changes] == [("server.args.tp", "8", "4")]
    assert restored({"kind": "restore_baseline_flags"}, f.changes) == f.changes
    assert restored({"kind": "restore_baseline_env"}, f.changes) == []


def test_the_state_round_trips_through_its_saved_form():
    """The state saved as redacted JSON (as the checkpointer saves it) loads back as the same models."""
    h = vd.apply_result(vd.Hyp(status="suspect", because=["b"], experiments=[GROUP]), GROUP,
                        res("cause", "recovers", share=0.5, share_ci=(0.4, 0.6), share_se=0.05))
    s = RunState(regression=REG, hyps={"serving_config": h}, current=Current(hyp="serving_config", spec=GROUP),
                 snapshot=Snapshot(host="h"), done=["x"])
    back = RunState.model_validate(redact(to_jsonable(dict(s))))
    assert back == s and back.hyps["serving_config"].because == ["b", "recovers"]
    assert back.hyps["serving_config"].results[0].outcome == "cause" and back.regression.size == 10.0
    assert back.regression.to_json() == REG.to_json()


def test_the_headline_rounds_a_share_as_the_experiment_sentence_does():
    """A share of 0.965 is "97%" in the experiment's own sentence (half up); the conclusion's headline once said "96%"
    (Python's format rounds the binary 0.965 down) beside it."""
    from debugagent.agent.stats import pct
    h = vd.Hyp(status="suspect", because=["flags differ"], experiments=[GROUP])
    h = vd.after_experiment("serving_config", h, GROUP, res("cause", "both flags off: recovers 97%", share=0.965,
                                                              share_ci=(0.885, 1.045), share_se=0.04))
    c = conclude({**ruled_out(), "serving_config": h})
    assert pct(0.965) == "97%" and pct(0.885) == "89%"
    assert "explains 97%, 95% CI 89% to 105%" in c.summary, c.summary
