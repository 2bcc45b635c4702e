"""Representative cases of the fault suite over the host shapes (tests/realhost/faultsuite.py; ``bench/faults`` runs
every shape × phase × signal): the run is killed at one phase, ``undo`` follows, and the host is compared with what
it was before the run, read from /proc, the supervisor's files and supervisorctl, the venv, /tmp and the lock."""

from __future__ import annotations

import os

import pytest

from .faultsuite import SHAPES, run_case

# the one case runs in every suite (slow: the run gets to its experiment first); DEBUGAGENT_FAULTS_FULL=1 adds two
# more (one per other shape), as it runs every case of the signal matrices (tests/faults.py)
pytestmark = pytest.mark.slow

CASES = [("supervisor", "restart", "SIGKILL")]
if os.environ.get("DEBUGAGENT_FAULTS_FULL") == "1":
    CASES += [("console", "undo", "SIGTERM"), ("container", "revert", "SIGHUP")]


@pytest.mark.parametrize(("name", "phase", "sig"), CASES, ids=["-".join(c) for c in CASES])
def test_a_signal_at_a_phase_leaves_the_shape_as_found(tmp_path, name, phase, sig):
    """SIGKILL while supervisord's program section is being rewritten for an experiment (then `undo`): the config's
    bytes, mode and mtime, RUNNING, one server with its argv, environment and folder, the listening socket, nothing
    of the run's left running or in /tmp, and the lock free."""
    shape = SHAPES[name](name=name, dir=tmp_path / "host")
    shape.setup()
    try:
        c = run_case(shape, phase, sig, tmp_path / "run")
    finally:
        shape.close()
    print(f"\n[fault] {c}")
    assert not c["problems"], c["problems"]
    assert c["changed"] == [], c["changed"]
    assert c["undo"] == 0 and c["exit"] in (-9, 130)
