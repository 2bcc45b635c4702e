"""Faults: `debugagent run` killed at each phase of a restart, a second run, a dropped or hung peer, a
kill mid-bisection (the helpers, and how a simulated host outlives the runs that change it: tests/faults.py;
the power limit, worktree, package overlay and governor at every phase: the other test_faults_*.py files).
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from debugagent.tools.sim.serve import start

from tests.faults import (
    SKIP,
    TO_A_VERDICT,
    assert_as_found,
    cli,
    events,
    journal_steps,
    kill_then_restore,
    phase_reached,
    restart_sshd,
    run_args,
    state,
    wait_for,
)
from tests.procs import descendants, signal_if_alive

pytestmark = [pytest.mark.ssh, SKIP]


@pytest.mark.parametrize("phase", [pytest.param("journalled", marks=pytest.mark.slow), "changed", "measuring"])
def test_sigkill_during_a_restart_then_undo_restores(fault_hosts, phase, tmp_path):
    """kill -9 after the undo step is journalled, after the restart, while measuring: `undo` restores the host."""
    kill_then_restore(fault_hosts, "launch-blocking", signal.SIGKILL, phase, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_undo_and_exit_130(fault_hosts, sig, tmp_path):
    """SIGTERM and SIGHUP while measuring after a restart: the run restores the host itself and exits 130."""
    kill_then_restore(fault_hosts, "launch-blocking", sig, "measuring", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed"])
def test_sigterm_sighup_at_the_other_phases_of_a_restart(fault_hosts, sig, phase, tmp_path):
    """SIGTERM and SIGHUP right after the restart's undo step is journalled, and right after the restart."""
    kill_then_restore(fault_hosts, "launch-blocking", sig, phase, tmp_path)


def test_next_run_finishes_a_killed_runs_journal(fault_hosts, tmp_path):
    """kill -9 mid-experiment; the next run on the host takes over the dead run's lock (its process is provably
    gone: no --force-unlock), says so, restores what the dead run left before measuring anything, and
    concludes right."""
    name = "launch-blocking"
    s, before = fault_hosts(name)
    a = tmp_path / "a"
    p = subprocess.Popen(run_args(s, name, a), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: phase_reached(a, "restart_server", "measuring"), p, "measuring")
    p.kill()
    p.communicate()
    dead = events(a)[0]["run_id"]
    r = subprocess.run(run_args(s, name, tmp_path / "c", *TO_A_VERDICT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["root_cause"]["hypothesis"] == "env_var"
    text = (tmp_path / "c" / "events.jsonl").read_text()
    assert f"took over the lock of run {dead} (pid {p.pid}" in text and "no longer running" in text
    assert "left 2 undo step(s) unfinished on this host" in text
    recovered = json.loads(next((tmp_path / "c").glob("recovered-*.json")).read_text())
    assert all(st["done"] for st in recovered["steps"])
    after = state(s)
    assert_as_found(before, after)
    fault_hosts.done(name)


def test_a_live_run_refuses_an_undo_and_a_second_run(fault_hosts, tmp_path):
    """While RUN is live (stopped mid-experiment, its lock held by its live process; stopped, it holds the host
    however slow the others start): `debugagent undo RUN` exits 2 naming the run and how to stop it, nothing undone
    under it (undo once took over the live run's lock and restored the server under it); a second run exits 2
    naming the holder, having sent nothing. The first then finishes on its own, right, and the host is as found."""
    name = "launch-blocking"
    s, before = fault_hosts(name)
    a = tmp_path / "a"
    p = subprocess.Popen(run_args(s, name, a, *TO_A_VERDICT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: phase_reached(a, "restart_server", "measuring"), p, "measuring")
    p.send_signal(signal.SIGSTOP)
    try:
        steps = journal_steps(a)
        r = subprocess.run(cli("undo", str(a)), capture_output=True, text=True, timeout=120)
        after_undo = journal_steps(a)
        second = subprocess.run(run_args(s, name, tmp_path / "b"), capture_output=True, text=True, timeout=120)
    finally:
        p.send_signal(signal.SIGCONT)
    assert r.returncode == 2, r.stderr
    run_id = events(a)[0]["run_id"]
    assert f"run {run_id} is still running (pid {p.pid}" in r.stderr and f"kill -TERM {p.pid}" in r.stderr, r.stderr
    assert [st["done"] for st in after_undo] == [st["done"] for st in steps]   # nothing undone under it
    assert second.returncode == 2, second.stderr
    assert f"in use by run {run_id}" in second.stderr and f"pid {p.pid}" in second.stderr
    assert "no longer running" not in second.stderr
    assert not journal_steps(tmp_path / "b")
    assert not any(e["event"] == "tool_call" for e in events(tmp_path / "b"))   # nothing was sent
    outp, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert json.loads(outp)["root_cause"]["hypothesis"] == "env_var"
    after = state(s)
    assert_as_found(before, after)
    fault_hosts.done(name)


def test_connection_dropped_for_good_leaves_a_journal_undo_finishes(tmp_path):
    """sshd dies for good while the restarted server is measured: the run exits 6 printing what is left (and
    writes its transcript.md and report.html); once sshd is back, `debugagent undo` finishes the journal and the host is as found."""
    name = "launch-blocking"
    with start(name) as s:
        before = state(s)
        out = tmp_path / "run"
        p = subprocess.Popen(run_args(s, name, out, "--connect-timeout", "3"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        wait_for(lambda: phase_reached(out, "restart_server", "measuring"), p, "measuring")
        tree = descendants(s.proc.pid)
        s.proc.kill()      # the listener first: no reconnect can land in between
        s.proc.wait()
        for pid in tree:
            signal_if_alive(pid, signal.SIGKILL)   # or it ended with its listener
        _, err = p.communicate(timeout=240)
        assert p.returncode == 6, err
        assert "could not be fully restored" in err and "left to undo: restart the server as it was found" in err
        assert (out / "report.html").is_file() and (out / "transcript.md").is_file()   # a run that exits 6 has both
        pending = [st for st in journal_steps(out) if not st["done"]]
        assert [st["tool"] for st in pending] == ["remove_file", "restart_server"]
        restart_sshd(s)
        r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert all(st["done"] for st in journal_steps(out))
        after = state(s)
    assert_as_found(before, after)


@pytest.mark.slow
def test_resume_after_a_kill_mid_bisect_restores_first_and_finishes(tmp_path):
    """kill -9 while bisecting in the worktree: `resume` removes the worktree first (no "worktree already
    exists"), runs the experiment again on the host as found, names the culprit, and leaves the host as found."""
    name = "code-regression-bisect"
    with start(name) as s:
        before = state(s)
        out = tmp_path / "run"
        p = subprocess.Popen(run_args(s, name, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(e["event"] == "tool_result" and e.get("tool") == "git_worktree_checkout"
                             for e in events(out)), p, "a bisection step")
        p.kill()
        p.communicate()
        assert any(not st["done"] for st in journal_steps(out))
        r = subprocess.run(cli("resume", str(out), "--json"), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        o = json.loads(r.stdout)
        assert o["root_cause"]["hypothesis"] == "code_change"
        assert "already exists" not in (out / "events.jsonl").read_text()
        assert "unfinished" in (out / "events.jsonl").read_text()
        assert all(st["done"] for st in journal_steps(out))
        after = state(s)
    assert_as_found(before, after)
