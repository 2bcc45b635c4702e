"""A peer that stops answering for good: sshd frozen (SIGSTOP) while an experiment measures, and left
frozen. The run must report the hung peer within 30 s, give up within the time it promises, exit 6 (the host could not
be fully restored) with the undo journal kept, and print no traceback; once sshd answers again, `debugagent undo`
restores the host (the helpers: tests/faults.py)."""

from __future__ import annotations

import subprocess
import time

import pytest
from debugagent.tools.sim.serve import start

from tests.faults import (
    SKIP,
    assert_as_found,
    cli,
    events,
    freeze_sshd_while_measuring,
    journal_steps,
    state,
)
from tests.procs import thaw

pytestmark = [pytest.mark.ssh, SKIP]

# what docs/ssh.md promises once the peer stops answering: the hang noticed within 25 s, then each
# reconnection gives up after --connect-timeout, a bounded number of times
GIVE_UP_S = 90


@pytest.mark.slow
def test_a_peer_hung_for_good_ends_the_run_in_bounded_time_without_a_traceback(tmp_path):
    name = "launch-blocking"
    with start(name) as s:
        before = state(s)
        out = tmp_path / "run"
        p, stopped = freeze_sshd_while_measuring(s, name, out)
        t0 = time.monotonic()
        try:
            noticed = None   # when the run reported the hung peer (docs/ssh.md: within 25 s)
            while p.poll() is None and time.monotonic() - t0 < GIVE_UP_S + 120:
                if any(e.get("kind") == "hung" for e in events(out)):
                    noticed = time.monotonic() - t0
                    break
                time.sleep(0.05)
            try:
                _, err = p.communicate(timeout=max(1.0, GIVE_UP_S + 120 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            took = time.monotonic() - t0
        finally:
            thaw(stopped)
        assert any(e.get("kind") == "hung" for e in events(out))
        print(f"hung peer reported after {noticed} s; exit {p.returncode} after {took:.0f} s")
        assert noticed is not None and noticed < 30, (noticed, took)
        assert "Traceback" not in err, (took, p.returncode, err[-3000:])
        assert p.returncode == 6, (took, p.returncode, err[-2000:])
        assert took < GIVE_UP_S, f"the run took {took:.0f} s to give up"
        assert any(not st["done"] for st in journal_steps(out)), "the journal must keep the undo that did not run"
        assert "debugagent undo" in err
        r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        after = state(s)
    assert_as_found(before, after)
