"""``debugagent replay RUN``: the agent again, against a recorded run's outputs.

Same conclusion: exit 0. A different one: the verdicts that changed, exit 5. A command the
recording lacks: exit 5 naming the step. A tampered or truncated recording: exit 2 with the
line number.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from debugagent.tools.errors import ReplayMiss, UsageError

from .events import Conclusion, Event
from .graph import RECURSION_LIMIT, build_graph
from .session import open_replay
from .sinks import console
from .state import RunState, conclusion_of
from .transcript import read_events, write_markdown

err = console(stderr=True)


def outcome(conclusion: dict[str, Any]) -> dict[str, Any]:
    """What must match between a recording and its replay."""
    return {
        "exit_code": conclusion.get("exit_code"),
        "root_causes": [(c["hypothesis"], c.get("how")) for c in conclusion.get("root_causes") or []],
        "verdicts": {h["id"]: h["status"] for h in conclusion.get("table") or []},
    }


def word(status: str | None) -> str:
    """A verdict as the transcript says it; a hypothesis one side lacks is "absent" (never Python's None)."""
    return status.replace("_", " ") if status else "absent"


def verdict_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for hid in sorted(set(a["verdicts"]) | set(b["verdicts"])):
        x, y = a["verdicts"].get(hid), b["verdicts"].get(hid)
        if x != y:
            lines.append(f"  {hid}: {word(x)} (recorded) -> {word(y)} (replayed)")
    if a["root_causes"] != b["root_causes"]:
        lines.append(f"  root causes: {a['root_causes']} (recorded) -> {b['root_causes']} (replayed)")
    if a["exit_code"] != b["exit_code"]:
        lines.append(f"  exit code: {a['exit_code']} (recorded) -> {b['exit_code']} (replayed)")
    return lines


def replay_events(events: list[Event], *, playbook: str | None, out: Path, file: str = "events.jsonl") -> dict[str, Any]:
    recorded = next((e for e in reversed(events) if isinstance(e, Conclusion)), None)
    ctx, transport = open_replay(events, playbook=playbook, out=out, file=file)
    transcript = ctx.transcript
    t0 = time.monotonic()
    try:
        state = build_graph(ctx).invoke(RunState(), {"recursion_limit": RECURSION_LIMIT})
    finally:
        transcript.close()
    write_markdown(out)
    conclusion = conclusion_of(state)
    a = outcome(recorded.model_dump(mode="json", by_alias=True) if recorded is not None else {})
    b = outcome(conclusion)
    # a hypothesis the playbook gained since the recording (or a changed playbook adds) is new, not a changed
    # conclusion: its verdict is reported apart; a new root cause or exit code still changes the conclusion
    new = {h: v for h, v in b["verdicts"].items() if a["verdicts"] and h not in a["verdicts"]}
    for h in new:
        del b["verdicts"][h]
    return {"same": a == b and recorded is not None, "recorded": a, "replayed": b, "diff": verdict_diff(a, b),
            "gained": sorted(new), "new": dict(sorted(new.items())),
            "commands": ctx.commands, "replay_s": round(time.monotonic() - t0, 3),
            "recorded_s": max((e.t for e in events), default=0), "conclusion": conclusion,
            "unused_results": transport.unused, "transcript": str(out), "events": len(events)}


def run_folders(given: list[str]) -> list[Path]:
    """The recorded runs named: each folder holding an events.jsonl (or the file itself), a glob's matches, or a
    folder of run folders (one level down, as transcripts/h200); a name that gives none is exit 2 naming it."""
    import glob
    if not given:
        raise UsageError("no recorded run given", fix="give --transcript RUN (repeatable, or a glob: --transcript 'transcripts/*')")
    out: list[Path] = []
    for g in given:
        names = sorted(glob.glob(g)) if glob.has_magic(g) else [g]
        found: list[Path] = []
        for n in map(Path, names):
            if n.is_file() and n.name == "events.jsonl" or (n / "events.jsonl").is_file():
                found.append(n)
            elif n.is_dir():
                found += sorted(p.parent for p in n.glob("*/events.jsonl"))
        if not found:
            raise UsageError(f"--transcript {g}: no recorded run (no events.jsonl in it nor in a folder under it)",
                             fix="give a folder `debugagent run` wrote, or one of transcripts/")
        out += [f for f in found if f not in out]
    return out


def replay_run(run_dir: str, *, playbook: str | None = None, as_json: bool = False, out: str | None = None) -> int:
    p = Path(run_dir)
    path = p / "events.jsonl" if p.is_dir() else p
    if not path.exists():
        raise UsageError(f"{run_dir}: no events.jsonl", fix="give a transcript folder written by `debugagent run`")
    events = read_events(path)
    # without --out the replayed transcript goes to a temporary folder that is kept only when it differs
    temporary = not out
    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="debugagent-replay-"))
    keep = not temporary
    try:
        res = replay_events(events, playbook=playbook, out=folder, file=str(path))
        keep = keep or not res["same"]
    except ReplayMiss as exc:
        if as_json:
            print(json.dumps({"same": False, "miss": {"step": exc.step, "asked": exc.asked,
                                                      "recorded_next": exc.recorded_next}}))
        raise
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if not keep:
        res["transcript"] = None   # same conclusion: the replayed transcript was not kept
    if as_json:
        print(json.dumps({k: v for k, v in res.items() if k != "conclusion"}, indent=1))
        return 0 if res["same"] else 5
    if res["new"]:
        err.print(f"replay of {path}: new hypotheses (not in the recording, so not compared): "
                  + ", ".join(f"{h} {v.replace('_', ' ')}" for h, v in res["new"].items()), markup=False)
    if res["same"]:
        rc = res["recorded"]["root_causes"]
        err.print(f"replay of {path}: same conclusion ({', '.join(h for h, _ in rc) or 'no root cause'}; "
                  f"{res['commands']} commands answered from the recording in {res['replay_s']:.2f} s)")
    else:
        err.print(f"replay of {path}: the conclusion CHANGED" + (f" (playbook {playbook})" if playbook else ""))
        for line in res["diff"]:
            err.print(line, markup=False)
        err.print(f"replayed transcript: {folder}/transcript.md")
    return 0 if res["same"] else 5
