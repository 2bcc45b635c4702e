"""A signal over a real SSH connection: it stops the command where paramiko holds no lock, and the connection (which
the undo needs next) still answers. The gate itself (tools/interrupts.py) is tested here too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from debugagent.agent.signals import Interrupted, Signals, held
from debugagent.tools.interrupts import GATE, Gate, check, shielded
from debugagent.tools.sim.serve import SSHD, start_sshd

from tests.faults import ended
from tests.test_ssh import connect

NEEDS_SSHD = pytest.mark.skipif(not Path(SSHD).is_file(), reason="needs Debian's openssh-server")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A private sshd without a simulated host (plain shell)."""
    s = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield s
    s.stop()


# A process of its own (a signal's handler runs on the main thread, and a hang must not take the test's with it).
# The signal is sent from a profile hook at the one instant that breaks paramiko: `_send_user_message` has taken
# `clear_to_send_lock` and calls `clear_to_send.is_set()` before its `try`. An exception raised there left the lock
# taken, and closing the interrupted command's channel then waited for it for ever.
IN_PARAMIKOS_LOCK = textwrap.dedent('''
    import getpass, os, signal, sys
    from debugagent.agent.entry import _stop
    from debugagent.agent.signals import Signals
    from debugagent.tools.ssh import SSHTransport

    port, identity, known, sig, who = sys.argv[1:6]
    sig = signal.Signals[sig]
    t = SSHTransport.from_spec(f"{getpass.getuser()}@127.0.0.1:{port}", identity_file=identity, known_hosts=known)
    t.run("true")   # a shell of the pool is open: the next command's frame is sent on it
    fired = []

    def hook(frame, event, arg):
        if (event == "call" and not fired and frame.f_code.co_name == "is_set" and frame.f_back is not None
                and frame.f_back.f_code.co_name == "_send_user_message"):
            fired.append(1)
            os.kill(os.getpid(), sig)

    if who == "entry":   # before a run's handlers: the command's own, while it starts
        signal.signal(sig, _stop)
    else:
        Signals().__enter__()
    sys.setprofile(hook)
    try:
        t.run("sleep 2; echo one")
        print("not stopped", flush=True)
    except KeyboardInterrupt as exc:
        print("stopped", exc.args[0], flush=True)
    finally:
        sys.setprofile(None)
    print("sent inside the lock:", len(fired), flush=True)
    print("then:", t.run("echo two", timeout=20).stdout.strip(), flush=True)
    t.close()
    print("closed", flush=True)
''')


@pytest.mark.ssh
@NEEDS_SSHD
@pytest.mark.parametrize(("sig", "who"), [(signal.SIGHUP, "run"), (signal.SIGTERM, "run"), (signal.SIGINT, "run"),
                                          (signal.SIGTERM, "entry")], ids=lambda v: getattr(v, "name", v))
def test_a_signal_inside_paramikos_lock_stops_the_command_and_the_connection_still_answers(plain, tmp_path, sig, who):
    script = tmp_path / "probe.py"
    script.write_text(IN_PARAMIKOS_LOCK)
    p = subprocess.Popen([sys.executable, str(script), str(plain.port), str(plain.identity), str(plain.known_hosts),
                          sig.name, who], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    out, err = ended(p, f"the command stopped by {sig.name} inside paramiko's lock", timeout=90)
    assert p.returncode == 0, err[-3000:]
    assert out.splitlines() == [f"stopped {sig.name}", "sent inside the lock: 1", "then: two", "closed"], err[-3000:]


def later(seconds: float, sig: signal.Signals) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), sig))
    timer.start()
    return timer


@pytest.mark.ssh
@NEEDS_SSHD
def test_a_signal_stops_a_long_command_within_moments_and_the_connection_answers(plain):
    t = connect(plain)
    try:
        with Signals():
            timer = later(0.5, signal.SIGTERM)
            started = time.monotonic()
            with pytest.raises(Interrupted):
                t.run("sleep 30; echo late")
            timer.join()
            # the command is stopped between two reads of its output (every 50 ms), not at its end
            assert time.monotonic() - started < 15
            assert t.run("echo again").stdout == "again\n"
        assert GATE.depth == 0 and GATE.pending is None
    finally:
        t.close()


@pytest.mark.ssh
@NEEDS_SSHD
def test_a_held_command_over_ssh_runs_to_its_end_before_the_signal_is_raised(plain):
    t = connect(plain)
    told: list[int] = []
    results = []
    try:
        with Signals(on_held=told.append):
            timer = later(0.3, signal.SIGHUP)
            with pytest.raises(Interrupted) as exc, held():
                results.append(t.run("sleep 1.5; echo whole"))
            timer.join()
        assert exc.value.signum == signal.SIGHUP and told == [signal.SIGHUP]
        assert [r.stdout for r in results] == ["whole\n"]   # the transport's stops do not cut a held section
    finally:
        t.close()


# ---------------------------------------------------------------- the gate itself
def test_outside_a_section_a_signal_is_raised_at_once_inside_it_waits_for_check_or_the_end():
    g = Gate()
    assert g.defer(KeyboardInterrupt("a")) is False
    with pytest.raises(KeyboardInterrupt, match="first"), g.section():
        with g.section():
            assert g.defer(KeyboardInterrupt("first")) and g.defer(KeyboardInterrupt("second"))
        ran = True   # the inner section's end is not the outermost: nothing raised yet
    assert ran and g.pending is None and g.depth == 0
    with pytest.raises(KeyboardInterrupt, match="now"), g.section():
        g.defer(KeyboardInterrupt("now"))
        g.check()
        pytest.fail("check() did not raise")
    assert g.pending is None and g.depth == 0


def test_a_holding_section_is_not_cut_at_check_and_raises_at_its_end_over_its_own_error():
    g = Gate()
    reached = []
    with pytest.raises(KeyboardInterrupt, match="stop"), g.section(holds=True):
        with g.section():
            g.defer(KeyboardInterrupt("stop"))
            g.check()   # inside a holding section: not here
            reached.append("after check")
        reached.append("after the inner end")
        raise ValueError("the section's own error")   # the interrupt comes first
    assert reached == ["after check", "after the inner end"] and g.holding == 0


def test_off_the_main_thread_a_section_is_plain_and_check_raises_nothing():
    seen = []

    def worker():
        with shielded():
            seen.append(GATE.depth)
        check()
        seen.append("done")
    GATE.pending = None
    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen == [0, "done"]
