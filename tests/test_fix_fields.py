"""Fixes are built from the conclusion's fields (the culprit, the experiment's spec), never from its prose."""

from __future__ import annotations

from pathlib import Path

from debugagent.agent.fixes import fixes_for
from debugagent.agent.playbook import load_playbook
from debugagent.agent.runfacts import ExperimentView, HypothesisView, RunFacts, gather
from debugagent.agent.transcript import read_events

ROOT = Path(__file__).resolve().parents[1]
SERVER = {"pid": 7, "argv": ["/venv/bin/python3", "-m", "srv", "--port", "1"], "cwd": "/src"}
CULPRIT = {"sha": "3a5dc4ed1747c2a1954482d1fa3763ee42e14a88", "short": "3a5dc4e", "subject": "Fuse sampling",
           "confidence": 0.99}


def _facts(hid: str, spec: dict, cause: dict, **outputs) -> RunFacts:
    x = ExperimentView(title=spec.get("title") or spec["kind"], spec=spec, significant=True)
    return RunFacts(outputs={"server_details": SERVER, **outputs}, hyps={hid: HypothesisView(id=hid, experiments=[x])},
                    conclusion={"root_causes": [{"hypothesis": hid, "evidence": [], **cause}]})


def test_bisected_code_regression_reverts_the_culprit_and_restarts():
    """The kept bisection: `git revert` of the first bad commit (not a checkout of the good one), then the restart."""
    events = read_events(ROOT / "transcripts" / "code-regression-bisect" / "events.jsonl")
    (cause,) = next(e for e in events if e["event"] == "conclusion")["root_causes"]
    sha = cause["culprit"]["sha"]   # the bisection's first bad commit, as the recording found it
    (fx,) = fixes_for(gather(events))
    assert fx.commands[0].endswith(f'git -C /root/sglang revert --no-edit {sha}"')
    assert "checkout" not in " ".join(fx.commands) and "sglang.launch_server" in fx.commands[1]
    assert sha[:7] in fx.text and "branch main" in fx.text


def test_the_culprit_is_read_from_its_field_not_the_summary():
    """A culprit whose summary does not name it is still reverted; a summary naming a commit is no culprit."""
    spec = {"kind": "code_revert", "to": "6770061ef85e76d1bd6da5176b9e6d1fdff398e7"}
    (fx,) = fixes_for(_facts("code_change", spec, {"summary": "recovers 100%", "culprit": CULPRIT},
                             git_state={"repo": "/src", "branch": "main"}), load_playbook(None))
    assert fx.commands == [f"git -C /src revert --no-edit {CULPRIT['sha']}", "cd /src && /venv/bin/python3 -m srv --port 1"]
    (fx,) = fixes_for(_facts("code_change", spec, {"summary": 'commit 3a5dc4e "Fuse sampling" (3a5dc4ed1747): x'},
                             git_state={"repo": "/src", "branch": "main"}), load_playbook(None))
    # no culprit: the good commit on a branch of its own, never a detached HEAD
    assert fx.commands[0] == f"git -C /src switch -c debugagent-good {spec['to']}" and "revert" not in fx.commands[0]
    assert "debugagent-good" in fx.text and fx.commands[1].startswith("cd /src && ")


def test_a_variable_is_read_from_the_experiment_not_the_summary():
    """An environment cause whose restart was a hook: the variable the experiment unset, whatever the summary says."""
    spec = {"kind": "server_restart", "unset_env": ["NCCL_ALGO", ""]}
    (fx,) = fixes_for(_facts("env_var", spec, {"summary": "recovers 90%"}), load_playbook(None))
    assert fx.text.startswith("Unset NCCL_ALGO where the server is launched")
    assert fx.commands == ["cd /src && env -u NCCL_ALGO /venv/bin/python3 -m srv --port 1"]


def test_a_package_is_read_from_the_experiment_not_the_summary():
    """A package cause with no build found: the package the experiment tried, at the baseline's version."""
    pkgs = {"python": "/venv/bin/python3", "packages": [{"name": "flashinfer-python", "version": "0.5.3"},
                                                        {"name": "torch", "version": "2.9.0"}]}
    spec = {"kind": "package_restore", "package": "flashinfer-python"}
    (fx,) = fixes_for(_facts("compiled_dependency", spec, {"summary": "torch is fine; recovers 80%"},
                             python_packages=pkgs), load_playbook(None))
    assert fx.commands[0] == "/venv/bin/python3 -m pip install --force-reinstall --no-deps flashinfer-python==0.5.3"
    assert "torch" not in fx.commands[0] and fx.commands[1] == "cd /src && /venv/bin/python3 -m srv --port 1"


def test_a_group_split_down_to_one_flag_removes_only_that_flag():
    """A group of not-judged flags that recovered, split down to the one that matters: the fix removes that flag,
    not the group's others (--max-num-seqs stays; tests/scenarios/ngram-spec-config-throughput.yaml)."""
    argv = ["/venv/bin/python3", "-m", "srv", "--port", "1", "--max-num-seqs", "256", "--speculative-config", "{}"]
    wide = {"kind": "server_restart", "title": "restart the server without the not-judged flags --max-num-seqs, "
            "--speculative-config", "unset_flags": ["max-num-seqs", "speculative-config"],
            "group": ["max-num-seqs", "speculative-config"]}
    narrow = {"kind": "server_restart", "title": "restart the server without the not-judged flags --speculative-config",
              "unset_flags": ["speculative-config"], "group": ["speculative-config"]}
    def restarted(spec: dict) -> ExperimentView:   # the restart the experiment made: the command line without its flags
        drop = {f"--{f}" for f in spec["unset_flags"]}
        kept = [a for i, a in enumerate(argv) if a not in drop and not (i and argv[i - 1] in drop)]
        call = {"tool": "restart_server", "input": {"argv": kept, "cwd": "/src"}}
        return ExperimentView(title=spec["title"], spec=spec, significant=True, calls=[(call, {"exit_code": 0})])

    xs = [restarted(s) for s in (wide, narrow)]
    facts = RunFacts(outputs={"server_details": {**SERVER, "argv": argv}},
                     hyps={"serving_config": HypothesisView(id="serving_config", experiments=xs)},
                     conclusion={"root_causes": [{"hypothesis": "serving_config", "evidence": [], "summary": "x"}]})
    (fx,) = fixes_for(facts, load_playbook(None))
    assert "--speculative-config" not in " ".join(fx.commands) and "--max-num-seqs 256" in " ".join(fx.commands)
