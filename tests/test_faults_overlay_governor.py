"""Faults: every signal at every phase of a package overlay from the wheelhouse (with a restart onto
it) and of the CPU governor (the helpers: tests/faults.py)."""

from __future__ import annotations

import signal

import pytest

from tests.faults import SKIP, kill_then_restore

pytestmark = [pytest.mark.ssh, SKIP]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flashinfer-wheelhouse", "governor-powersave"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed", "measuring"])
def test_every_signal_at_every_phase_of_a_package_overlay_and_the_governor(name, sig, phase, tmp_path):
    """A package overlay installed from the wheelhouse (then a restart onto it), and the CPU governor: every
    signal at every phase leaves, after `undo`, the host as found, the overlay's folder gone."""
    kill_then_restore(name, sig, phase, tmp_path)
