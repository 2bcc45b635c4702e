"""Probes as plugins: the tool table, a snapshot, its diff, the facts and the transcript are built from
``tools.probes``, and a new probe is one module and its entry in ``tools/probes/__init__.py``."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from debugagent.tools import probes, registry, snapshot
from debugagent.tools.probes.base import Gathering

ROOT = Path(__file__).resolve().parents[1]

# A throwaway probe, written as a new probe would be: its input model (the exact, quoted command), its pure
# parser, its snapshot field, its difference path, its facts and its transcript summary.
UPTIME = '''"""Uptime: how long the host has been up (a reboot between two snapshots shows as ``uptime.restarted``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import ParseError
from ..transport import q
from .base import Probe, Tool


class UptimeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "/proc/uptime"

    def command(self) -> str:
        return f"cat {q(self.path)}"


class Uptime(BaseModel):
    seconds: float


def parse_uptime(text: str) -> Uptime:
    try:
        return Uptime(seconds=float(text.split()[0]))
    except (IndexError, ValueError) as exc:
        raise ParseError("not /proc/uptime", tool="uptime", excerpt=text[:40]) from exc


class Fields(BaseModel):
    uptime_s: float | None = None


def _diff(a, b, add) -> None:
    if a.uptime_s is not None and b.uptime_s is not None and b.uptime_s < a.uptime_s:
        add("uptime.restarted", a.uptime_s, b.uptime_s, "the host rebooted")


def _summary(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("output")
    return [f"Output: up {out['seconds']:g} s"] if out else None


PROBE = Probe(
    "uptime",
    tools=(Tool("uptime", UptimeInput, lambda i, r: parse_uptime(r.stdout), summary=_summary, optional=True, wave=1),),
    first=lambda g: [("uptime", None, "how long the host has been up")],
    fill=lambda g: {"uptime_s": g.output("uptime").seconds if g.output("uptime") else None},
    diff_paths=("uptime.restarted",), diff=_diff, facts=lambda snap, fx: {"uptime_s": snap.uptime_s},
)
'''

# What the check runs with the tree that has the new probe: a snapshot from a fake host, a diff, the facts
# and the transcript's line.
CHECK = r'''
import json
from debugagent.agent.facts import build_facts
from debugagent.tools import probes, registry, snapshot
from debugagent.tools.transport import FakeTransport

up = {"now": "4242.5 100.0\n"}
def answer(cmd):
    return up["now"] if cmd == "cat /proc/uptime" else ("", "no such thing here", 1)
tr = FakeTransport(answer)
a = snapshot.collect(registry.Runner(tr))
up["now"] = "12.0 1.0\n"
b = snapshot.collect(registry.Runner(tr), probes=["uptime"])
c = snapshot.collect(registry.Runner(tr), probes=[])
ev = {"stdout": "12.0 1.0\n", "output": {"seconds": 12.0}, "exit_code": 0}
print(json.dumps({
    "tool": "uptime" in registry.TOOLS, "optional": "uptime" in snapshot.OPTIONAL_PROBES,
    "paths": "uptime.restarted" in snapshot.DIFF_PATHS, "sent": tr.calls.count("cat /proc/uptime"),
    "a": a.uptime_s, "b": b.uptime_s, "left_out": c.uptime_s,
    "dumped": json.loads(snapshot.dump(a)).get("uptime_s"),
    "loaded": snapshot.Snapshot.model_validate_json(snapshot.dump(b)).uptime_s,
    "diff": [ch.model_dump() for ch in snapshot.diff(a, b)],
    "facts": build_facts(b, baseline=a, regression=None, knowledge={}, symptom={}, group=lambda cs: {"x": cs})["uptime_s"],
    "summary": probes.render_output("uptime", ev),
}))
'''


def test_the_tool_table_is_the_probes_tools_and_the_mutations():
    """Every read-only tool is one probe's; the table adds only the mutations, each marked as such."""
    mine = probes.tools()
    assert set(registry.TOOLS) == set(mine) | {t.name for t in registry.MUTATIONS}
    assert not set(mine) & {t.name for t in registry.MUTATIONS}
    assert not any(t.mutates for t in mine.values()) and all(t.mutates for t in registry.MUTATIONS)
    owners = [t.name for p in probes.PROBES for t in p.tools]
    assert len(owners) == len(set(owners))


def test_snapshot_paths_and_optional_tools_come_from_the_probes():
    """DIFF_PATHS is every probe's paths, in order; the optional tools are the snapshot's, in the order it sends them."""
    assert snapshot.DIFF_PATHS == tuple(path for p in probes.PROBES for path in p.diff_paths)
    assert snapshot.OPTIONAL_PROBES == ("gpu_q", "driver_files", "python_packages", "git_state", "server_view", "server_env",
                                        "gpu_sample_under_load", "gpu_xid")
    fields = list(snapshot.Snapshot.model_fields)
    assert fields[:5] == ["snapshot_version", "host", "hostname", "taken_at", "commands"]
    assert fields[-2:] == ["errors", "discovery"]


def test_a_plan_leaves_out_the_optional_tools_not_asked_for():
    """The first wave keeps gpu_query (the GPUs need it) and drops gpu_q and driver_files when no check names them."""
    g = Gathering(runner=None, probes=[])  # type: ignore[arg-type]
    assert [c[0] for c in probes.plan(g, 1)] == ["gpu_query"]
    assert [c[0] for c in probes.plan(Gathering(runner=None), 1)] == ["gpu_query", "gpu_q", "driver_files"]  # type: ignore[arg-type]


def test_an_output_without_a_summary_is_rendered_plainly():
    """A tool with no summary (and a summary that declines) gets the plain rendering and the error tail."""
    ev = {"stdout": "a\nb\n", "exit_code": 1, "error": "host_info: bad cores"}
    assert probes.render_output("host_info", ev) == ["Output: `a` · `b`", "*exit 1; host_info: bad cores*"]
    assert probes.render_output("python_packages", {"stdout": "", "output": {}, "exit_code": 0}) == ["(no output)"]


def test_adding_a_probe_touches_two_files_and_its_test(tmp_path):
    """A new probe module and its entry in tools/probes/__init__.py (with this test, three files): the tool table,
    the snapshot (its call, its field, dumped and loaded), the diff, the facts and the transcript all have it."""
    tree = tmp_path / "tree"
    tools = tree / "debugagent" / "tools"   # the import name debugagent.tools, ahead of the installed one
    shutil.copytree(ROOT / "tools", tools, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("agent", "playbooks"):
        (tree / "debugagent" / name).symlink_to(ROOT / name, target_is_directory=True)
    (tools / "probes" / "uptime.py").write_text(UPTIME)
    init = tools / "probes" / "__init__.py"
    text = init.read_text()
    for old, new in (("from . import bench,", "from . import uptime\nfrom . import bench,"),
                     ("bench.PROBE, control.PROBE)", "bench.PROBE, control.PROBE, uptime.PROBE)"),
                     ("class Fields(driver.FileFields,", "class Fields(uptime.Fields, driver.FileFields,")):
        assert old in text, old
        text = text.replace(old, new)
    init.write_text(text)
    cmp = filecmp.dircmp(ROOT / "tools", tools, ignore=["__pycache__"])

    def changed(d: filecmp.dircmp, at: str = "") -> list[str]:
        return [at + n for n in d.diff_files + d.left_only + d.right_only] + [
            x for n, sub in d.subdirs.items() for x in changed(sub, f"{at}{n}/")]
    assert sorted(changed(cmp)) == ["probes/__init__.py", "probes/uptime.py"]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    where = subprocess.run([sys.executable, "-c", "import debugagent.tools.probes as p; print(p.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(tools)), where   # the copy is what runs, not the installed package
    run = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["tool"] and got["optional"] and got["paths"]
    assert got["sent"] == 2 and (got["a"], got["b"], got["left_out"]) == (4242.5, 12.0, None)
    assert got["dumped"] == 4242.5 and got["loaded"] == 12.0
    assert [c for c in got["diff"] if c["path"] == "uptime.restarted"] == [
        {"path": "uptime.restarted", "a": 4242.5, "b": 12.0, "note": "the host rebooted", "editable": False,
         "follows_load": False}]
    assert got["facts"] == 12.0
    assert got["summary"] == ["Output: up 12 s"]


def test_the_playbooks_checks_are_the_probes_checks():
    """The tools a playbook's `checks` may name are the probes' own (until playbook.CHECKS is made from them)."""
    from debugagent.agent.playbook import CHECKS
    assert set(probes.checks()) == set(CHECKS)
