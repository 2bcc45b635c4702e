"""Test helpers for playbook authors, the same ones the project's own tests use.

* ``FakeTransport``: a transport driven by a plain function (refuses what it does not know).
* ``TranscriptBuilder``: writes a small ``events.jsonl`` recording by hand.
* ``event_lines``: a finished ``events.jsonl`` as its raw events (dicts), one a line.
* pytest fixtures (``pytest -p debugagent_testing.fixtures``): ``sim_host`` opens a simulated
  host, ``replay_recording`` replays a recorded run against a playbook.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from debugagent.tools.transport import CommandResult, FakeTransport

__all__ = ["CommandResult", "FakeTransport", "TranscriptBuilder", "event_lines"]


def event_lines(path: Path | str) -> list[dict[str, Any]]:
    """The events of a finished ``events.jsonl`` as written (dicts), strictly: a line that is no JSON raises. Split on
    ``\n`` only: a value may hold U+2028, U+2029 or U+0085 (a process's command line, a server's output), where
    ``str.splitlines`` would cut the line in two."""
    return [json.loads(ln) for ln in Path(path).read_bytes().decode("utf-8").split("\n") if ln]


class TranscriptBuilder:
    """Build a recording: a run_started header, tool results, a conclusion."""

    def __init__(self, symptom: str, baseline: str | None = None, host: str = "fake", playbook: str = "gpu-inference-regression") -> None:
        self.events: list[dict[str, Any]] = [{
            "event": "run_started", "run_id": "built", "schema_version": 1, "debugagent_version": "test", "host": host,
            "symptom": symptom, "baseline": baseline, "playbook": playbook, "playbook_digest": "0" * 16, "inputs": {}}]
        self.n = 0

    def result(self, command: str, stdout: str = "", stderr: str = "", exit_code: int = 0, tool: str = "raw") -> TranscriptBuilder:
        self.n += 1
        self.events.append({"event": "tool_call", "call_id": self.n, "tool": tool, "command": command, "display": command})
        self.events.append({"event": "tool_result", "call_id": self.n, "tool": tool, "command": command, "stdout": stdout,
                            "stderr": stderr, "exit_code": exit_code, "duration_ms": 1.0})
        return self

    def write(self, folder: Path, conclusion: dict[str, Any] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        events = self.events + [{"event": "conclusion", "root_causes": [], "exit_code": 3, "table": [],
                                 **(conclusion or {})}]
        for i, e in enumerate(events, 1):
            e.setdefault("seq", i)
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return folder
