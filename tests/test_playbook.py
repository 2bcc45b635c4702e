"""Playbooks: strict schema, clear errors, rule semantics, the default tree's order."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.playbook import Hypothesis, evaluate, load_playbook, parse_playbook
from tools.errors import PlaybookError

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
    """The default playbook holds every hypothesis id docs/verdicts.md lists, code revert first, then clocks and PCIe, then flags."""
    pb = load_playbook(None)
    order = pb.order()
    assert set(order) == {"code_change", "gpu_clocks", "pcie_link", "gpu_contention", "serving_config",
                          "compiled_dependency", "driver_cuda", "env_var", "host_cpu"}
    assert order[:5] == ["code_change", "gpu_clocks", "pcie_link", "serving_config", "compiled_dependency"]


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
    cli = [sys.executable, "-m", "agent.cli", "playbook"]
    r = subprocess.run(cli + ["validate", "gpu-inference-regression"], capture_output=True, text=True)
    assert r.returncode == 0 and "9 hypotheses" in r.stdout
    p = tmp_path / "bad.yaml"
    p.write_text(MINI.replace("[git_state]", "[gpu_clock]"))
    r = subprocess.run(cli + ["validate", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "gpu_clock" in r.stderr
    r = subprocess.run(cli + ["show", "gpu-inference-regression"], capture_output=True, text=True)
    assert r.returncode == 0 and "1. code_change" in r.stdout
    new = tmp_path / "mine.yaml"
    assert subprocess.run(cli + ["new", str(new)], capture_output=True).returncode == 0
    assert load_playbook(str(new)).name == "mine"
