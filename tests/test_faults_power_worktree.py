"""Faults: every signal at every phase of a power-limit experiment and of a worktree with bisection
(the helpers: tests/faults.py)."""

from __future__ import annotations

import pytest

from tests.faults import SKIP, every_signal_at_every_phase, kill_then_restore

pytestmark = [pytest.mark.ssh, SKIP]


@every_signal_at_every_phase(["power-capped", "code-regression-bisect"])
def test_every_signal_at_every_phase_of_power_and_worktree(fault_hosts, name, sig, phase, tmp_path):
    """A power limit and a worktree (with bisection): every signal at every phase leaves, after `undo`, the host as found."""
    kill_then_restore(fault_hosts, name, sig, phase, tmp_path)
