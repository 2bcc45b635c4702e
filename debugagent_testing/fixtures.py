"""pytest fixtures for playbook authors: ``pytest -p debugagent_testing.fixtures``."""

from __future__ import annotations

import pytest


@pytest.fixture
def sim_host():
    """Open simulated hosts by spec (``sim:NAME``, ``sim:PATH.yaml``, ``…@good``); closed after the test."""
    from debugagent.tools.sim import SimTransport
    opened = []

    def make(spec: str):
        t = SimTransport(spec if spec.startswith("sim:") else f"sim:{spec}")
        opened.append(t)
        return t

    yield make
    for t in opened:
        t.close()


@pytest.fixture
def replay_recording(tmp_path):
    """Replay a recorded run (folder) against a playbook; returns the result with `same` and `diff`."""
    from debugagent.agent.replay import replay_events
    from debugagent.agent.transcript import read_events

    def run(folder, playbook=None):
        return replay_events(read_events(folder / "events.jsonl" if hasattr(folder, "joinpath") else folder),
                             playbook=playbook, out=tmp_path / "replay")
    return run
