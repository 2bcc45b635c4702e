"""Faults: every signal at every phase of a package overlay from the wheelhouse (with a restart onto
it) and of the CPU governor (the helpers: tests/faults.py)."""

from __future__ import annotations

import pytest

from tests.faults import SKIP, every_signal_at_every_phase, kill_then_restore

pytestmark = [pytest.mark.ssh, SKIP]


@every_signal_at_every_phase(["flashinfer-wheelhouse", "governor-powersave"])
def test_every_signal_at_every_phase_of_a_package_overlay_and_the_governor(fault_hosts, name, sig, phase, tmp_path):
    """A package overlay installed from the wheelhouse (then a restart onto it), and the CPU governor: every
    signal at every phase leaves, after `undo`, the host as found, the overlay's folder gone."""
    kill_then_restore(fault_hosts, name, sig, phase, tmp_path)
