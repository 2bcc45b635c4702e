"""Faults: `debugagent run` killed at each phase of an experiment, a second run, a dropped or hung peer.

A simulated host served behind a real sshd (``tools.sim.serve.start``) lives in the test
process, so it outlives the debugagent processes that change it: `debugagent run` is a
real subprocess, killed with a real signal; `debugagent undo` (or the next run) is
another subprocess; the host's snapshot must then equal the one taken before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import descendants, freeze_tree, signal_if_alive, thaw
from tools.registry import Runner
from tools.sim import load_scenario
from tools.sim.serve import SSHD, remote_command, start, start_sshd
from tools.snapshot import collect, diff
from tools.ssh import SSHTransport

pytestmark = [pytest.mark.ssh, pytest.mark.skipif(not Path(SSHD).is_file(), reason="needs Debian's openssh-server")]

# what each experiment kind changes, and the undo step it journals first
KINDS = {
    "launch-blocking": "restart_server",          # a server restart without CUDA_LAUNCH_BLOCKING
    "power-capped": "set_power_limit",            # the power limit raised
    "code-regression-bisect": "git_worktree_remove",  # a worktree, then bisection in it
    "flashinfer-wheelhouse": "remove_tree",       # a package overlay from the wheelhouse, then a restart onto it
    "governor-powersave": "set_governor",         # the CPU governor set to performance
}
CHANGE = {"restart_server": "restart_server", "set_power_limit": "set_power_limit",
          "git_worktree_remove": "git_worktree_add", "remove_tree": "overlay_install", "set_governor": "set_governor"}
# what an experiment leaves in the host's /tmp while it runs (all of it gone once the host is as found)
LEFT = "ls -d /tmp/debugagent-* 2>/dev/null; true"


def transport(s) -> SSHTransport:
    return SSHTransport.from_spec(s.target, identity_file=str(s.identity), known_hosts=str(s.known_hosts))


def state(s) -> dict:
    """What must be as found: the snapshot, the server's argv and environment, worktrees, servers, journals left."""
    from tools.transport import q
    with transport(s) as t:
        r = Runner(t)
        snap = collect(r)
        repo = snap.repo.repo if snap.repo else None
        wt = t.run(f"git -C {q(repo)} worktree list --porcelain").stdout if repo else ""
        journals = t.run('ls "$HOME/.cache/debugagent/" 2>/dev/null | grep journal; true').stdout
        left = t.run(LEFT).stdout
        fs = r.call("find_servers")
        servers = [p.argv for p in fs.output.processes] if fs.ok else None
    return {"snap": snap, "argv": snap.server.argv if snap.server else None, "env": snap.server.env if snap.server else None,
            "worktrees": wt, "journals": journals, "left": left, "servers": len(servers or [])}


# GPU readings that follow the load, not the host's settings: a benchmark the killed run started may still be
# running on the host when the snapshot is taken (a kill does not reach it), so these may read "under load"
LOAD_READINGS = ("sm_clock", "mem_clock", "power_draw", "temperature", "pcie_gen", "pcie_width", "event_reasons",
                 "utilization")


def assert_as_found(before: dict, after: dict) -> None:
    changes = [c for c in diff(before["snap"], after["snap"])
               if not (c.path.startswith("gpus.") and c.path.rsplit(".", 1)[-1] in LOAD_READINGS)]
    assert changes == []
    for k in ("argv", "env", "worktrees", "journals", "left", "servers"):
        assert before[k] == after[k], k


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", *args]


def run_args(s, name: str, out: Path, *extra: str) -> list[str]:
    sc = load_scenario(name)
    return cli("run", "--host", s.target, "--identity-file", str(s.identity), "--known-hosts", str(s.known_hosts),
               "--allow-mutations", "--symptom", sc.symptom, "--baseline", sc.baseline, "--reproduce-runs", "5",
               "--max-runs", "3" if name == "launch-blocking" else "8", "--json", "--out", str(out), *extra)


def events(out: Path) -> list[dict]:
    p = out / "events.jsonl"
    if not p.exists():
        return []
    lines = p.read_bytes().split(b"\n")
    evs = []
    for line in lines:
        try:
            evs.append(json.loads(line))
        except ValueError:
            continue   # the line being written
    return evs


def journal_steps(out: Path) -> list[dict]:
    try:
        return json.loads((out / "journal.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return []


def phase_reached(out: Path, tool: str, phase: str) -> bool:
    """journalled: the undo step is pending in the local journal; changed: the change's result is recorded;
    measuring: a benchmark runs after the change."""
    if phase == "journalled":
        return any(st["tool"] == tool and not st["done"] for st in journal_steps(out))
    evs = events(out)
    change = CHANGE[tool]
    idx = next((i for i, e in enumerate(evs) if e["event"] == "tool_result" and e.get("tool") == change), None)
    if idx is None:
        return False
    if phase == "changed":
        return True
    return any(e["event"] == "tool_call" and e.get("tool") == "bench" for e in evs[idx:])


def wait_for(pred, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def kill_then_restore(name: str, sig: signal.Signals, phase: str, tmp_path: Path) -> None:
    tool = KINDS[name]
    with start(name) as s:
        before = state(s)
        out = tmp_path / "run"
        p = subprocess.Popen(run_args(s, name, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        wait_for(lambda: phase_reached(out, tool, phase), p, f"{tool} {phase}")
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        recorded = [st for st in journal_steps(out)]
        if sig == signal.SIGKILL:
            assert p.returncode == -9
            r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        else:
            assert p.returncode == 130, err
            assert f"interrupted ({sig.name})" in err
            r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and "nothing to undo" in r.stderr, r.stderr
        steps = journal_steps(out)
        assert steps and all(st["done"] for st in steps), steps
        assert [st["id"] for st in steps] == list(range(1, len(steps) + 1))  # no step lost
        assert len(steps) >= len(recorded)
        assert any(st["tool"] == tool for st in steps)
        after = state(s)
    assert_as_found(before, after)


@pytest.mark.parametrize("phase", [pytest.param("journalled", marks=pytest.mark.slow), "changed", "measuring"])
def test_sigkill_during_a_restart_then_undo_restores(phase, tmp_path):
    """kill -9 after the undo step is journalled, after the restart, while measuring: `undo` restores the host."""
    kill_then_restore("launch-blocking", signal.SIGKILL, phase, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_undo_and_exit_130(sig, tmp_path):
    """SIGTERM and SIGHUP while measuring after a restart: the run restores the host itself and exits 130."""
    kill_then_restore("launch-blocking", sig, "measuring", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["power-capped", "code-regression-bisect"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed", "measuring"])
def test_every_signal_at_every_phase_of_power_and_worktree(name, sig, phase, tmp_path):
    """A power limit and a worktree (with bisection): every signal at every phase leaves, after `undo`, the host as found."""
    kill_then_restore(name, sig, phase, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flashinfer-wheelhouse", "governor-powersave"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed", "measuring"])
def test_every_signal_at_every_phase_of_a_package_overlay_and_the_governor(name, sig, phase, tmp_path):
    """A package overlay installed from the wheelhouse (then a restart onto it), and the CPU governor: every
    signal at every phase leaves, after `undo`, the host as found, the overlay's folder gone."""
    kill_then_restore(name, sig, phase, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["journalled", "changed"])
def test_sigterm_sighup_at_the_other_phases_of_a_restart(sig, phase, tmp_path):
    """SIGTERM and SIGHUP right after the restart's undo step is journalled, and right after the restart."""
    kill_then_restore("launch-blocking", sig, phase, tmp_path)


def test_next_run_finishes_a_killed_runs_journal(tmp_path):
    """kill -9 mid-experiment; the next run on the host refuses while the dead run's lock stands, then with
    --force-unlock restores what the dead run left before measuring anything, and concludes right."""
    name = "launch-blocking"
    with start(name) as s:
        before = state(s)
        a = tmp_path / "a"
        p = subprocess.Popen(run_args(s, name, a), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: phase_reached(a, "restart_server", "measuring"), p, "measuring")
        p.kill()
        p.communicate()
        r = subprocess.run(run_args(s, name, tmp_path / "b"), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "in use by run" in r.stderr and "--force-unlock" in r.stderr, r.stderr
        assert "no longer running here" in r.stderr
        r = subprocess.run(run_args(s, name, tmp_path / "c", "--force-unlock"), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["root_cause"]["hypothesis"] == "env_var"
        text = (tmp_path / "c" / "events.jsonl").read_text()
        assert "left 2 undo step(s) unfinished on this host" in text
        recovered = json.loads(next((tmp_path / "c").glob("recovered-*.json")).read_text())
        assert all(st["done"] for st in recovered["steps"])
        after = state(s)
    assert_as_found(before, after)


def test_second_concurrent_run_is_refused(tmp_path):
    """While a run holds the host, a second one exits 2 naming the holder; the first is unaffected."""
    name = "power-capped"
    with start(name) as s:
        before = state(s)
        a = tmp_path / "a"
        p = subprocess.Popen(run_args(s, name, a), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(e["event"] == "tool_result" for e in events(a)), p, "the first command")
        p.send_signal(signal.SIGSTOP)   # the first run holds the host however slow the second one starts
        try:
            r = subprocess.run(run_args(s, name, tmp_path / "b"), capture_output=True, text=True, timeout=120)
        finally:
            p.send_signal(signal.SIGCONT)
        assert r.returncode == 2, r.stderr
        run_id = events(a)[0]["run_id"]
        assert f"in use by run {run_id}" in r.stderr and f"pid {p.pid}" in r.stderr
        assert "no longer running" not in r.stderr
        assert not journal_steps(tmp_path / "b")
        assert not any(e["event"] == "tool_call" for e in events(tmp_path / "b"))   # nothing was sent
        outp, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert json.loads(outp)["root_cause"]["hypothesis"] == "gpu_clocks"
        after = state(s)
    assert_as_found(before, after)


def restart_sshd(s) -> None:
    s.proc = start_sshd(s.folder, s.port, force_command=remote_command(s.sim)).proc


def test_connection_dropped_for_good_leaves_a_journal_undo_finishes(tmp_path):
    """sshd dies for good while the restarted server is measured: the run exits 6 printing what is left;
    once sshd is back, `debugagent undo` finishes the journal and the host is as found."""
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
        pending = [st for st in journal_steps(out) if not st["done"]]
        assert [st["tool"] for st in pending] == ["remove_file", "restart_server"]
        restart_sshd(s)
        r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert all(st["done"] for st in journal_steps(out))
        after = state(s)
    assert_as_found(before, after)


@pytest.mark.slow
def test_hung_peer_is_reported_within_30s_and_undo_restores(tmp_path):
    """sshd stopped (SIGSTOP) while the restarted server is measured: the run reports a hung peer within
    30 s; killed then, and sshd resumed, `debugagent undo` restores the host."""
    name = "launch-blocking"
    with start(name) as s:
        before = state(s)
        out = tmp_path / "run"
        p = subprocess.Popen(run_args(s, name, out, "--connect-timeout", "3"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        wait_for(lambda: phase_reached(out, "restart_server", "measuring"), p, "measuring")
        stopped = freeze_tree(s.proc.pid)
        t0 = time.monotonic()
        try:
            wait_for(lambda: any(e.get("kind") == "hung" for e in events(out)), p, "the hung peer", timeout=60)
            noticed = time.monotonic() - t0
            p.kill()
            p.communicate()
        finally:
            thaw(stopped)
        assert noticed < 30, noticed
        r = subprocess.run(cli("undo", str(out)), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
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
