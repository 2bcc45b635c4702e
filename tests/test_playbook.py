"""Playbooks: strict schema, clear errors, rule semantics, the default tree's order."""

from __future__ import annotations

import subprocess
import sys

import pytest
from debugagent.agent.playbook import Hypothesis, evaluate, load_playbook, parse_playbook
from debugagent.tools.errors import PlaybookError

MINI = """
version: 1
name: mini
hypotheses:
  - id: a
    title: A
    checks: [git_state]
    rules:
      - {when: "x > 1", verdict: suspect, because: "x is {{ x }}"}
      - {when: "true", verdict: ruled_out, because: "x is small"}
    next: b
  - id: b
    title: B
    rules:
      - {when: "true", verdict: ruled_out, because: "fine"}
"""


def test_default_playbook_follows_the_seeds_order():
    """The default playbook holds every hypothesis id docs/verdicts.md lists, code revert first, then clocks and PCIe, then
    flags, then the defaults the engine chose behind equal flags."""
    pb = load_playbook(None)
    order = pb.order()
    assert set(order) == {"code_change", "gpu_clocks", "pcie_link", "gpu_contention", "serving_config", "changed_default",
                          "compiled_dependency", "driver_cuda", "env_var", "host_cpu"}
    assert order[:6] == ["code_change", "gpu_clocks", "pcie_link", "serving_config", "changed_default", "compiled_dependency"]


def test_unknown_key_is_refused_with_field():
    """An unknown key names file:line:column and field path."""
    with pytest.raises(PlaybookError, match=r"my.yaml:\d+:\d+`, hypotheses\[0\].rules\[0\].verdcit: unknown key"):
        parse_playbook(MINI.replace("verdict: suspect", "verdcit: suspect, verdict: suspect"), "my.yaml")


def test_misspelt_key_suggests_the_right_one_at_its_line():
    """`verdit:` instead of `verdict:` is named as an unknown key with a did-you-mean, at its line and column."""
    text = MINI.replace("verdict: suspect", "verdit: suspect")
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "verdit" in ln)
    col = text.splitlines()[line - 1].index("verdit") + 1
    with pytest.raises(PlaybookError) as e:
        parse_playbook(text, "my.yaml")
    assert f"my.yaml:{line}:{col}" in str(e.value)
    assert "unknown key `verdit`; did you mean `verdict`?" in str(e.value)
    assert e.value.fix == "rename `verdit:` to `verdict:`" and e.value.exit_code == 2


def test_unknown_tool_suggests_the_right_one():
    """A misspelt check names the tool and suggests the closest one."""
    with pytest.raises(PlaybookError, match="unknown tool `git_sate`; did you mean `git_state`"):
        parse_playbook(MINI.replace("[git_state]", "[git_sate]"), "my.yaml")


def test_bad_edge_is_refused():
    """A `next` that names no hypothesis is refused."""
    with pytest.raises(PlaybookError, match="`c` is not a hypothesis id"):
        parse_playbook(MINI.replace("next: b", "next: c"), "my.yaml")


def test_bad_jinja_names_the_rule():
    """A rule expression that does not compile names the rule and field."""
    with pytest.raises(PlaybookError, match=r"hypotheses\[0\] \(a\).rules\[0\].when"):
        parse_playbook(MINI.replace("x > 1", "x >"), "my.yaml")


def test_rules_first_weak_match_ends_and_suspects_accumulate():
    """Suspects above a matching ruled_out rule win; otherwise the first weak rule decides."""
    h = parse_playbook(MINI).hypotheses[0]
    (f,) = evaluate(h, {"x": 5})
    assert (f.verdict, f.because) == ("suspect", "x is 5")
    (f,) = evaluate(h, {"x": 0})
    assert (f.verdict, f.because) == ("ruled_out", "x is small")


def test_foreach_and_experiment_templates():
    """foreach binds item; experiment fields are rendered with it."""
    h = Hypothesis.model_validate({"id": "e", "title": "E", "rules": [
        {"foreach": "env", "when": "item.v == '1'", "verdict": "suspect", "because": "{{ item.k }} set",
         "experiment": {"kind": "server_restart", "unset_env": ["{{ item.k }}"]}}]})
    out = evaluate(h, {"env": [{"k": "A", "v": "1"}, {"k": "B", "v": "0"}, {"k": "C", "v": "1"}]})
    assert [f.because for f in out] == ["A set", "C set"]
    assert out[1].experiment["unset_env"] == ["C"]


def test_rule_error_on_facts_names_the_rule():
    """A rule that fails on this host's facts is an error naming it, never skipped."""
    h = parse_playbook(MINI).hypotheses[0]
    with pytest.raises(PlaybookError, match=r"a.rules\[0\]"):
        evaluate(h, {})


def test_sandbox_refuses_unsafe_access():
    """Rules run in Jinja's immutable sandbox: no attribute escapes, no mutation."""
    bad = MINI.replace("x > 1", "x.__class__.__mro__")
    h = parse_playbook(bad).hypotheses[0]
    with pytest.raises(PlaybookError):
        evaluate(h, {"x": 5})


def test_cli_validate_and_show(tmp_path):
    """`playbook validate` exits 0 on the default and 2 on a broken file; `show` prints the tree."""
    cli = [sys.executable, "-m", "debugagent.agent.cli", "playbook"]
    r = subprocess.run(cli + ["validate", "gpu-inference-regression"], capture_output=True, text=True)
    assert r.returncode == 0 and "10 hypotheses" in r.stdout
    p = tmp_path / "bad.yaml"
    p.write_text(MINI.replace("[git_state]", "[gpu_clock]"))
    r = subprocess.run(cli + ["validate", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "gpu_clock" in r.stderr
    r = subprocess.run(cli + ["show", "gpu-inference-regression"], capture_output=True, text=True)
    assert r.returncode == 0 and "1. code_change" in r.stdout
    new = tmp_path / "mine.yaml"
    assert subprocess.run(cli + ["new", str(new)], capture_output=True).returncode == 0
    assert load_playbook(str(new)).name == "mine"


# ---------------------------------------------------------------- experiments: one model per kind
EXP_HEAD = ("version: 1\nname: m\nhypotheses:\n  - id: a\n    title: A\n    rules:\n"
            "      - when: 'true'\n        verdict: suspect\n        because: x\n        experiment: ")


def test_experiment_is_checked_against_its_kinds_own_model():
    """An unknown kind is named with a did-you-mean; a misspelt key is checked against the kind's own fields."""
    with pytest.raises(PlaybookError, match="unknown experiment kind `power_limt`; did you mean `power_limit`"):
        parse_playbook(EXP_HEAD + "{kind: power_limt, gpu: 0, watts: 500}\n")
    with pytest.raises(PlaybookError, match=r"experiment\.governer: unknown key `governer`; did you mean `governor`"):
        parse_playbook(EXP_HEAD + "{kind: governor, governer: performance}\n")
    with pytest.raises(PlaybookError, match="`to` applies to code_revert, not to governor"):
        parse_playbook(EXP_HEAD + "{kind: governor, governor: performance, to: abc}\n")


def test_an_older_playbooks_experiment_with_every_field_still_loads():
    """Before each kind had its own model, one model held all their fields: those left at their defaults load."""
    pb = parse_playbook(EXP_HEAD + "{kind: governor, governor: performance, to: null, bisect: true, set_flags: {}, "
                        "unset_env: [], gpu: null, paths: null}\n")
    (f,) = evaluate(pb.hypotheses[0], {})
    assert f.experiment == {"kind": "governor", "title": "", "governor": "performance"}


def test_experiment_fix_stays_a_template_until_the_report():
    """A rule renders its experiment's fields on the facts, but not its `fix:` (that reads the run's results)."""
    pb = parse_playbook(EXP_HEAD + "{kind: governor, governor: '{{ g }}', fix: {text: 'set {{ experiment.spec.governor }}'}}\n")
    (f,) = evaluate(pb.hypotheses[0], {"g": "performance"})
    assert f.experiment["governor"] == "performance" and f.experiment["fix"]["text"] == "set {{ experiment.spec.governor }}"


def test_bad_fix_template_is_refused_at_load():
    """A `fix:` that is not valid Jinja is refused naming the field."""
    with pytest.raises(PlaybookError, match=r"hypotheses\[0\] \(a\)\.fix\.commands\[0\]: bad Jinja template"):
        parse_playbook(MINI.replace("    next: b\n", "    next: b\n    fix: {text: t, commands: ['{{ x ']}\n"))


# ---------------------------------------------------------------- fixes from the playbook
def _facts(hid: str, experiment: dict | None = None, **outputs):
    from debugagent.agent.runfacts import ExperimentView, HypothesisView, RunFacts
    xs = [ExperimentView(title=experiment.get("title") or experiment["kind"], spec=experiment, significant=True)] if experiment else []
    return RunFacts(target="root@gpu-1", outputs=outputs, hyps={hid: HypothesisView(id=hid, experiments=xs)},
                    conclusion={"root_causes": [{"hypothesis": hid, "summary": "fan at 20%", "evidence": []}]})


FAN = MINI.replace("    next: b\n", "    next: b\n    fix:\n      text: 'Set the fan of {{ server.pid }} back to auto:'\n"
                   "      commands: ['fanctl --pid {{ server.pid }} auto {{ \"a b\" | quote }}', '{% if false %}never{% endif %}']\n")


def test_a_new_hypothesis_brings_its_own_fix():
    """A hypothesis' `fix:` is rendered on what the run saw; each command runs on the host (empty ones are left out)."""
    from debugagent.agent.fixes import fixes_for
    (fx,) = fixes_for(_facts("a", server_details={"pid": 42}), parse_playbook(FAN))
    assert fx.hypothesis == "a" and fx.text == "Set the fan of 42 back to auto:"
    assert fx.commands == ["ssh root@gpu-1 \"fanctl --pid 42 auto 'a b'\""]


def test_an_experiments_fix_then_its_kinds_come_before_the_hypothesis_fix():
    """The experiment that confirmed the cause: its own `fix:` first, else its kind's, else the hypothesis'."""
    from debugagent.agent.fixes import fixes_for
    pb = parse_playbook(FAN)
    own = {"kind": "governor", "governor": "performance", "fix": {"text": "Pin {{ experiment.spec.governor }}."}}
    assert fixes_for(_facts("a", own), pb)[0].text == "Pin performance."
    (fx,) = fixes_for(_facts("a", {"kind": "governor", "governor": "performance"}), pb)
    assert fx.text.startswith("Set the CPU governor to performance") and "scaling_governor" in fx.commands[0]
    (fx,) = fixes_for(_facts("b", {"kind": "governor", "governor": "performance"}) .model_copy(
        update={"conclusion": {"root_causes": [{"hypothesis": "zzz", "summary": ""}]}}), pb)
    assert fx.text == "Undo what zzz names above." and fx.commands == []   # no template anywhere: the words alone


# ---------------------------------------------------------------- which hypothesis tests the not-judged groups
def test_the_playbook_says_which_hypothesis_tests_the_groups():
    """The built-in playbook gives the flags' group to serving_config and the variables' to env_var; a playbook of
    its own may give them to its own hypotheses."""
    import debugagent.agent.verdicts as vd
    assert load_playbook(None).group_targets() == {"serving_config": "flags", "env_var": "env"}
    pb = parse_playbook(MINI.replace("    next: b\n", "    next: b\n    groups: env\n"))
    assert pb.group_targets() == {"a": "env"}
    hyps = {"a": vd.Hyp(status="inconclusive"), "b": vd.Hyp(status="inconclusive")}
    assert vd.add_groups(hyps, vd.NotJudged(flags=["x"], env=["Y"]), pb.group_targets()) == [("a", ["Y"])]
    assert hyps["a"].experiments[0]["unset_env"] == ["Y"] and not hyps["b"].experiments


def test_a_playbook_without_groups_gives_them_by_evidence():
    """A playbook written before `groups:` keeps today's behaviour: the hypotheses whose evidence covers the server's
    flags and its environment test them."""
    from pathlib import Path

    import yaml
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "playbooks" / "gpu-inference-regression.yaml").read_text())
    for h in data["hypotheses"]:
        h.pop("groups", None)
    assert parse_playbook(yaml.safe_dump(data)).group_targets() == {"serving_config": "flags", "env_var": "env"}
    assert parse_playbook(MINI).group_targets() == {}


OMP = """
  - id: omp_threads
    title: OpenMP threads of the server
    cost: 1
    checks: [server_details]
    rules:
      - when: "server is not none and server.env.get('OMP_NUM_THREADS')"
        verdict: suspect
        because: "OMP_NUM_THREADS={{ server.env.get('OMP_NUM_THREADS') }} is set"
        experiment: {kind: server_restart, title: "restart the server without OMP_NUM_THREADS", unset_env: [OMP_NUM_THREADS]}
      - when: "true"
        verdict: ruled_out
        because: "OMP_NUM_THREADS is not set"
"""


def test_playbook_test_reports_a_new_hypothesis_as_new_and_takes_what_a_shell_makes_of_a_glob(tmp_path):
    """Adding a hypothesis is no changed conclusion: `playbook test` says it is new, with its verdict in words
    (never Python's None), and exits 0; `--transcript transcripts/*` as a shell expands it (several folders after
    one --transcript) is taken, a folder named twice replayed once."""
    from pathlib import Path

    from debugagent.agent.replay import run_folders
    from debugagent.tools.errors import UsageError
    root = Path(__file__).resolve().parents[1]
    pb = tmp_path / "omp.yaml"
    pb.write_text((root / "playbooks" / "gpu-inference-regression.yaml").read_text() + OMP)
    run = str(root / "transcripts" / "pcie-degraded")
    from debugagent.agent.cli import app
    from typer.testing import CliRunner
    r = CliRunner().invoke(app, ["playbook", "test", str(pb), "--transcript", run, run])
    assert r.exit_code == 0, r.output
    assert "new hypotheses (not in the recording, so not compared): omp_threads ruled out" in r.output
    assert r.output.count("same conclusion (pcie_link;") == 1 and "None" not in r.output
    # the forms a person types: a quoted glob, a folder of run folders (transcripts/h200), a name that gives none
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "events.jsonl").write_text("")
    (tmp_path / "runs" / "lab" / "b").mkdir(parents=True)
    (tmp_path / "runs" / "lab" / "b" / "events.jsonl").write_text("")
    (tmp_path / "runs" / "notes.txt").write_text("")
    assert run_folders([str(tmp_path / "runs" / "*")]) == [tmp_path / "runs" / "a", tmp_path / "runs" / "lab" / "b"]
    with pytest.raises(UsageError, match="no recorded run"):
        run_folders([str(tmp_path / "runs" / "notes.txt")])


def test_validate_warns_of_evidence_a_glob_listed_before_always_takes(tmp_path):
    """A hypothesis added after env_var with evidence `server.env.OMP_*` never sees a change (env_var's
    `server.env.*` claims it first): `playbook validate` warns naming both, and still exits 0; the default playbook
    (whose `editable:packages.*` leaves the other packages to compiled_dependency) gets no warning."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    text = (root / "playbooks" / "gpu-inference-regression.yaml").read_text()
    assert load_playbook(None).shadow_warnings() == []
    pb = tmp_path / "omp.yaml"
    pb.write_text(text + OMP.replace("    checks: [server_details]\n", "    checks: [server_details]\n    evidence: ['server.env.OMP_*']\n"))
    (w,) = load_playbook(str(pb)).shadow_warnings()
    assert w.startswith("omp_threads: evidence `server.env.OMP_*` is shadowed by `server.env.*` of env_var")
    from debugagent.agent.cli import app
    from typer.testing import CliRunner
    r = CliRunner().invoke(app, ["playbook", "validate", str(pb)])
    assert r.exit_code == 0 and "warning:" in r.output and "omp_threads" in r.output
