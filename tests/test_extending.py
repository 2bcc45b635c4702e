"""Extending the engine: a new experiment kind and a new output format each touch one new module and one line
of registration (with this test, three files), and the rest of the engine has them. (Probes: test_probes.py;
transports: test_hosts.py.)"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path) -> Path:
    """A copy of agent/ importable as ``debugagent.agent`` ahead of the installed package (tools/ and playbooks/
    linked as they are): the folder to put on PYTHONPATH."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "agent", tree / "debugagent" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("tools", "playbooks"):
        (tree / "debugagent" / name).symlink_to(ROOT / name, target_is_directory=True)
    return tree


def _changed(tree: Path) -> list[str]:
    def walk(d: filecmp.dircmp, at: str = "") -> list[str]:
        return [at + n for n in d.diff_files + d.left_only + d.right_only] + [
            x for n, sub in d.subdirs.items() for x in walk(sub, f"{at}{n}/")]
    return sorted(walk(filecmp.dircmp(ROOT / "agent", tree / "debugagent" / "agent", ignore=["__pycache__"])))


def _run(tree: Path, code: str, cwd: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------- an experiment kind
# A throwaway kind, written as a new kind would be: its spec model and its class. It changes nothing on the host:
# it journals an undo that is a no-op, then measures the benchmark again as it is.
RERUN = '''"""Re-run: measure the benchmark again with nothing changed (a control any playbook can ask for)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from debugagent.tools.registry import Runner

from ..spec import ExperimentSpec, Kind

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab


class RerunSpec(ExperimentSpec):
    kind: Literal["rerun"]  # pyright: ignore[reportIncompatibleVariableOverride]


class Rerun(Kind):
    spec = RerunSpec

    def apply(self, lab: Lab, r: Runner, spec: RerunSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why="the benchmark again, nothing changed")
        return lab.result(spec, vals, d, f"unchanged: {d.text}")
'''

KIND_CHECK = r'''
import json, sys
from pathlib import Path
from debugagent.agent.config import RunConfig
from debugagent.agent.run import investigate
from debugagent.agent.transcript import read_events
from debugagent.agent.lab import registry
from debugagent.agent.playbook import parse_playbook

TEXT = """version: 1
name: rerun-only
hypotheses:
  - id: again
    title: the same benchmark again
    rules:
      - when: "true"
        verdict: suspect
        because: "a control"
        experiment: {kind: rerun, title: "the benchmark once more"}
"""
pb = parse_playbook(TEXT, "rerun.yaml")
spec = pb.hypotheses[0].rules[0].experiment
bad = None
try:
    parse_playbook(TEXT.replace("title: \"the benchmark once more\"", "watts: 5"), "bad.yaml")
except Exception as exc:
    bad = str(exc)
folder = Path(sys.argv[1])
(folder / "rerun.yaml").write_text(TEXT)
out = investigate(RunConfig(host="sim:power-capped", symptom="decode 74 tok/s", baseline="decode 89 tok/s",
                            playbook=str(folder / "rerun.yaml"), as_json=True, out=str(folder / "run")))
ran = [e.model_dump(mode="json") for e in read_events(folder / "run" / "events.jsonl") if e.event == "experiment"]
print(json.dumps({"ran": ran, "root_cause": out["root_cause"], "kinds": "rerun" in registry.KINDS, "spec": type(spec).__name__, "dump": spec.dump(),
                  "kind_of": registry.kind_of(spec.dump()).__name__, "other_field": bad,
                  "file": registry.__file__}))
'''


def test_adding_an_experiment_kind_touches_one_module_and_its_registration(tmp_path):
    """A new kind module under agent/lab/kinds/ and its name in registry.ALL (with this test, three files): the
    kinds' table has it, a playbook's `experiment: {kind: rerun}` validates against the union built from ALL, and a
    run on a simulated host applies it."""
    tree = _tree(tmp_path)
    lab = tree / "debugagent" / "agent" / "lab"
    (lab / "kinds" / "rerun.py").write_text(RERUN)
    reg = lab / "registry.py"
    _edit(reg, "from .kinds.restart import", "from .kinds.rerun import Rerun\nfrom .kinds.restart import")
    _edit(reg, "Governor, PackageRestore)", "Governor, PackageRestore, Rerun)")
    assert _changed(tree) == ["lab/kinds/rerun.py", "lab/registry.py"]

    got = _run(tree, KIND_CHECK, tmp_path, str(tmp_path))
    assert got["file"].startswith(str(tree))     # the copy was imported, not the installed package
    assert got["kinds"] and got["spec"] == "RerunSpec" and got["kind_of"] == "Rerun"
    assert got["dump"] == {"kind": "rerun", "title": "the benchmark once more"}
    assert got["other_field"] and "watts" in got["other_field"]   # another kind's field is refused by name
    # a run on a simulated host chooses it, applies it and measures it (nothing changed: not a cause)
    start, result = [e for e in got["ran"] if e["hypothesis"] == "again"]
    assert (start["phase"], start["spec"]) == ("start", {"kind": "rerun", "title": "the benchmark once more"})
    assert result["phase"] == "result" and result["text"].startswith("unchanged: ") and result["significant"] is False
    assert got["root_cause"] is None


# ---------------------------------------------------------------- an output format
# A throwaway format: a plain-text summary, one line per event kind with its count.
SUMMARY = '''"""A plain-text summary of a run: how many events of each kind it wrote."""

from __future__ import annotations

from collections import Counter

from .events import Event


def render(events: list[Event]) -> str:
    counts = Counter(e.event for e in events)
    return "".join(f"{name}: {n}\\n" for name, n in sorted(counts.items()))
'''

OUTPUT_CHECK = r'''
import json, sys
from pathlib import Path
from debugagent.agent import outputs
folder = Path(sys.argv[1])
written = outputs.write_outputs(folder, ["summary"])
print(json.dumps({"formats": list(outputs.FORMATS), "written": [p.name for p in written],
                  "text": (folder / "summary.txt").read_text(), "file": outputs.__file__}))
'''


def test_adding_an_output_format_touches_one_module_and_its_register_line(tmp_path):
    """A new module with its render function and one `register` line in agent/outputs.py (with this test, three
    files): rendering a kept recording through the registry writes the new file."""
    tree = _tree(tmp_path)
    agent = tree / "debugagent" / "agent"
    (agent / "summary.py").write_text(SUMMARY)
    out = agent / "outputs.py"
    _edit(out, "from .events import Event\n", "from .events import Event\nfrom .summary import render as _summary\n")
    _edit(out, 'register("html", "report.html", _html)\n',
          'register("html", "report.html", _html)\nregister("summary", "summary.txt", _summary)\n')
    assert _changed(tree) == ["outputs.py", "summary.py"]

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ROOT / "transcripts" / "power-capped" / "events.jsonl", run / "events.jsonl")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", OUTPUT_CHECK, str(run)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(tree))
    assert got["formats"] == ["markdown", "html", "summary"] and got["written"] == ["summary.txt"]
    lines = got["text"].splitlines()
    assert lines and all(": " in line for line in lines)
    assert any(line.startswith("tool_call: ") for line in lines), lines
