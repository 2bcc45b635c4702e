"""``debugagent replay RUN``: the agent again, against a recorded run's outputs.

Same conclusion: exit 0. A different one: the verdicts that changed, exit 5. A command the
recording lacks: exit 5 naming the step. A tampered or truncated recording: exit 2 with the
line number.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tools.errors import RecordingError, ReplayMiss, UsageError
from tools.replay import ReplayTransport
from tools.snapshot import Snapshot

from .graph import RECURSION_LIMIT, Ctx, Overrides, build_graph
from .journal import Journal
from .playbook import load_playbook
from .state import conclusion_of
from .symptom import parse_symptom
from .transcript import Transcript, read_events, write_markdown

err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)


def outcome(conclusion: dict[str, Any]) -> dict[str, Any]:
    """What must match between a recording and its replay."""
    return {
        "exit_code": conclusion.get("exit_code"),
        "root_causes": [(c["hypothesis"], c.get("how")) for c in conclusion.get("root_causes") or []],
        "verdicts": {h["id"]: h["status"] for h in conclusion.get("table") or []},
    }


def verdict_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for hid in sorted(set(a["verdicts"]) | set(b["verdicts"])):
        x, y = a["verdicts"].get(hid), b["verdicts"].get(hid)
        if x != y:
            lines.append(f"  {hid}: {x} (recorded) -> {y} (replayed)")
    if a["root_causes"] != b["root_causes"]:
        lines.append(f"  root causes: {a['root_causes']} (recorded) -> {b['root_causes']} (replayed)")
    if a["exit_code"] != b["exit_code"]:
        lines.append(f"  exit code: {a['exit_code']} (recorded) -> {b['exit_code']} (replayed)")
    return lines


def replay_events(events: list[dict[str, Any]], *, playbook: str | None, out: Path, file: str = "events.jsonl") -> dict[str, Any]:
    head = events[0]
    recorded = next((e for e in reversed(events) if e["event"] == "conclusion"), None)
    pb = load_playbook(playbook or head.get("playbook"))
    direction = (head.get("inputs") or {}).get("direction")
    symptom = parse_symptom(head["symptom"], "--symptom", direction)
    baseline = parse_symptom(head["baseline"], "--baseline", direction) if head.get("baseline") else None
    try:
        snap = Snapshot.model_validate(head["baseline_snapshot_data"]) if head.get("baseline_snapshot_data") else None
    except ValueError as exc:
        raise RecordingError(f"run_started: baseline_snapshot_data is not a snapshot ({str(exc).splitlines()[0]})",
                             file=file, line=1, fix="the recording is edited or damaged; record the run again") from exc
    transport = ReplayTransport(events, file)
    out.mkdir(parents=True, exist_ok=True)
    transcript = Transcript(out, head["run_id"])
    transcript.emit("run_started", **{k: v for k, v in head.items() if k not in ("event", "seq", "t", "run_id")},
                    replay_of=file)
    inputs = head.get("inputs") or {}
    llm_answers = [e for e in events if e["event"] == "llm_call"]
    advisor = None
    if llm_answers:
        from .llm import RecordedAdvisor
        advisor = RecordedAdvisor(llm_answers)
    ctx = Ctx(transport=transport, transcript=transcript, playbook=pb, run_id=head["run_id"],
              undo=Journal(out / "journal.json", head["run_id"], transport.host), symptom=symptom, baseline=baseline, baseline_snapshot=snap,
              allow_mutations=True, advisor=advisor,
              overrides=Overrides(bench=inputs.get("bench"), repo=inputs.get("repo"), python=inputs.get("python"),
                                  server_pattern=inputs.get("server_pattern"), bench_regex=inputs.get("bench_regex"),
                                  reproduce_runs=inputs.get("reproduce_runs"), max_runs=inputs.get("max_runs")))
    t0 = time.monotonic()
    try:
        state = build_graph(ctx).invoke({}, {"recursion_limit": RECURSION_LIMIT})
    finally:
        transcript.close()
    write_markdown(out)
    conclusion = conclusion_of(state)
    a = outcome(recorded or {})
    b = outcome(conclusion)
    return {"same": a == b and recorded is not None, "recorded": a, "replayed": b, "diff": verdict_diff(a, b),
            "commands": ctx.commands, "replay_s": round(time.monotonic() - t0, 3),
            "recorded_s": max((e.get("t", 0) for e in events), default=0), "conclusion": conclusion,
            "unused_results": transport.unused, "transcript": str(out), "events": len(events)}


def replay_run(run_dir: str, *, playbook: str | None = None, as_json: bool = False, out: str | None = None) -> int:
    p = Path(run_dir)
    path = p / "events.jsonl" if p.is_dir() else p
    if not path.exists():
        raise UsageError(f"{run_dir}: no events.jsonl", fix="give a transcript folder written by `debugagent run`")
    events = read_events(path)
    folder = Path(out) if out else Path(tempfile.mkdtemp(prefix="debugagent-replay-"))
    try:
        res = replay_events(events, playbook=playbook, out=folder, file=str(path))
    except ReplayMiss as exc:
        if as_json:
            print(json.dumps({"same": False, "miss": {"step": exc.step, "asked": exc.asked,
                                                      "recorded_next": exc.recorded_next}}))
        raise
    if as_json:
        print(json.dumps({k: v for k, v in res.items() if k != "conclusion"}, indent=1))
    elif res["same"]:
        rc = res["recorded"]["root_causes"]
        err.print(f"replay of {path}: same conclusion ({', '.join(h for h, _ in rc) or 'no root cause'}; "
                  f"{res['commands']} commands answered from the recording in {res['replay_s']:.2f} s)")
    else:
        err.print(f"replay of {path}: the conclusion CHANGED" + (f" (playbook {playbook})" if playbook else ""))
        for line in res["diff"]:
            err.print(line, markup=False)
        err.print(f"replayed transcript: {folder}/transcript.md")
    return 0 if res["same"] else 5
