"""Faults: every signal at every phase of a power-limit experiment and of a worktree with bisection
(the helpers: tests/faults.py)."""

from __future__ import annotations

import signal

import pytest

from tests.faults import SKIP, kill_then_restore

pytestmark = [pytest.mark.ssh, SKIP]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["power-capped", "code-regression-bisect"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed", "measuring"])
def test_every_signal_at_every_phase_of_power_and_worktree(name, sig, phase, tmp_path):
    """A power limit and a worktree (with bisection): every signal at every phase leaves, after `undo`, the host as found."""
    kill_then_restore(name, sig, phase, tmp_path)
