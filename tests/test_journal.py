"""The undo journal and the host lock against a real shell (``--host local``, HOME in the test's folder)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from debugagent.agent.journal import (
    LOCK_FILE,
    HostFiles,
    HostLock,
    HostLocked,
    Journal,
    LockInfo,
    lock_command,
    others_on_host,
    parse_lock_reply,
)
from debugagent.agent.lab import Lab, Measure
from debugagent.tools.errors import ConnectError
from debugagent.tools.registry import Runner
from debugagent.tools.transport import CommandResult, LocalTransport


def host_dir() -> Path:
    return Path(os.environ["HOME"]) / ".cache" / "debugagent"


def lock_file() -> Path:
    """The host lock, in the test's own DEBUGAGENT_LOCK_DIR (conftest): one for every account, not under HOME."""
    return Path(os.environ["DEBUGAGENT_LOCK_DIR"]) / "debugagent-host.lock"


def own(tmp_path: Path, name: str, run_id: str = "r1") -> Path:
    """A path as debugagent makes them for run ``run_id`` (the undo runs no other), unique to the test."""
    return Path(f"/tmp/debugagent-{run_id}-{tmp_path.name}-{name}")


def lab(journal: Journal, transport) -> Lab:
    events: list[tuple] = []
    lab = Lab(lambda h: Runner(transport), lambda ev, **kw: events.append((ev, kw)), journal, Measure("", "", None),
              "r1", True)
    lab.events = events  # type: ignore[attr-defined]
    return lab


def test_step_is_on_both_sides_before_the_change_and_done_only_after(tmp_path):
    """push_undo writes the step locally (fsynced) and on the host; do_undo marks it done once it ran; the host copy
    goes when nothing is pending."""
    t = LocalTransport()
    j = Journal(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    target = own(tmp_path, "made-by-experiment")
    target.write_text("x")
    lab(j, t).push_undo("remove_file", {"path": str(target)}, "remove the file")
    local = json.loads((tmp_path / "journal.json").read_text())
    remote = json.loads((host_dir() / "journal-r1.json").read_text())
    assert local["steps"] == remote["steps"] and not local["steps"][0]["done"]
    assert (tmp_path / "journal.json").stat().st_mode & 0o777 == 0o600
    assert lab(j, t).do_undo(Runner(t)) == []
    assert not target.exists()
    assert json.loads((tmp_path / "journal.json").read_text())["steps"][0]["done"] is True
    assert not (host_dir() / "journal-r1.json").exists()


class Dropping(LocalTransport):
    """A local shell whose connection 'drops' at the Nth command: ConnectError, as the SSH transport raises."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.n, self.at = 0, at

    def run(self, command: str, **kw) -> CommandResult:
        self.n += 1
        if self.n >= self.at:
            raise ConnectError("connection lost", host="local")
        return super().run(command, **kw)


def test_a_lost_connection_mid_undo_keeps_the_step(tmp_path):
    """The connection drops while undoing: the step stays pending in the journal (never popped, never lost)."""
    t = LocalTransport()
    j = Journal(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    lab(j, t).push_undo("remove_file", {"path": str(own(tmp_path, "a"))}, "remove a")
    lab(j, t).push_undo("remove_file", {"path": str(own(tmp_path, "b"))}, "remove b")
    d = Dropping(at=1)
    j.remote = HostFiles(d)
    with pytest.raises(ConnectError):
        lab(j, d).do_undo(Runner(d))
    assert [s.text for s in j.pending()] == ["remove b", "remove a"]
    again = Journal.open(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    assert again.merge_host_copy() and [s.text for s in again.pending()] == ["remove b", "remove a"]


def test_a_failed_step_stops_the_undo_and_keeps_its_error(tmp_path):
    """A failed undo step keeps its error and stops there: the older steps (what it may need) stay."""
    t = LocalTransport()
    j = Journal(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    lab(j, t).push_undo("remove_file", {"path": str(own(tmp_path, "env"))}, "remove the saved environment")
    lab(j, t).push_undo("git_worktree_checkout", {"path": str(own(tmp_path, "no-worktree")), "commit": "HEAD"},
                        "move the worktree back")   # fails: there is no such worktree
    left = lab(j, t).do_undo(Runner(t))
    assert left and left[0].startswith("move the worktree back")
    assert [s.text for s in j.pending()] == ["move the worktree back", "remove the saved environment"]
    assert j.pending()[0].error


def test_the_host_copy_decides_inputs_and_either_copy_done(tmp_path):
    """Merging: a step missing locally comes from the host; done on either side is done."""
    t = LocalTransport()
    j = Journal(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    j.record("remove_file", {"path": "/nonexistent/a"}, "a")
    j.record("remove_file", {"path": "/nonexistent/b"}, "b")
    (tmp_path / "journal.json").unlink()   # the machine running debugagent lost its copy
    k = Journal.open(tmp_path / "journal.json", "r1", "local", HostFiles(t))
    assert k.merge_host_copy() and [s.text for s in k.pending()] == ["b", "a"]
    k.mark_done(k.pending()[0])
    assert [d.run_id for d in others_on_host(HostFiles(t), "other")] == ["r1"]


def test_lock_refuses_a_second_run_and_lets_its_owner_back(tmp_path):
    """The lock is taken once; another run is refused naming the holder; the same run takes it again; release
    removes only its own lock; --force-unlock takes over."""
    t = LocalTransport()
    a, b = HostLock(HostFiles(t), "run-a"), HostLock(HostFiles(t), "run-b")
    a.acquire()
    with pytest.raises(HostLocked) as e:
        b.acquire()
    assert "run-a" in str(e.value) and f"pid {os.getpid()}" in str(e.value) and "--force-unlock" in str(e.value)
    HostLock(HostFiles(t), "run-a").acquire()   # the same run (resume, undo) takes its own lock
    b.release()                                 # not held: nothing removed
    assert "run-a" in lock_file().read_text()
    b.acquire(force=True)
    assert "run-b" in lock_file().read_text()
    a.release()                                 # a's lock was taken over: it removes nothing
    assert "run-b" in lock_file().read_text()
    b.release()
    assert not lock_file().exists()


def test_one_lock_for_every_account_and_every_home(tmp_path, monkeypatch):
    """The lock is one file for the host, not one per account: a run of another HOME, and (as root) a run of
    another account (nobody, via setpriv), sees it, named by run id, pid, start time, user and uid (mode 644);
    without DEBUGAGENT_LOCK_DIR it is /run/lock's (/tmp's where that is missing)."""
    import shutil
    import stat
    import tempfile
    where = subprocess.run(["env", "-u", "DEBUGAGENT_LOCK_DIR", "bash", "-c", LOCK_FILE + 'echo "$f"'],
                           capture_output=True, text=True).stdout.strip()
    assert where == ("/run/lock" if os.path.isdir("/run/lock") else "/tmp") + "/debugagent-host.lock"
    shared = Path(tempfile.mkdtemp(prefix="debugagent-test-lock-"))   # a folder every account reaches, as /run/lock
    shared.chmod(0o1777)
    monkeypatch.setenv("DEBUGAGENT_LOCK_DIR", str(shared))
    try:
        mine = HostLock(HostFiles(LocalTransport()), "run-mine")
        mine.acquire()
        f = shared / "debugagent-host.lock"
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
        held = LockInfo.model_validate_json(f.read_text())
        assert (held.run_id, held.pid, held.uid) == ("run-mine", os.getpid(), os.getuid()) and held.start > 0 and held.user
        other = LockInfo(run_id="run-other", pid=1, machine="m", since="now", uid=65534, user="nobody")
        home = tmp_path / "other-home"
        home.mkdir()
        r = subprocess.run(["bash", "-c", lock_command(other, False)], capture_output=True, text=True,
                           env={**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")})
        ok, holder, _ = parse_lock_reply(r.stdout)
        assert not ok and holder is not None and holder.run_id == "run-mine", r.stdout
        if os.geteuid() == 0 and shutil.which("setpriv"):
            as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--init-groups", "env", "HOME=/nonexistent",
                         f"DEBUGAGENT_LOCK_DIR={shared}", "bash", "-c"]
            r = subprocess.run([*as_nobody, lock_command(other, False)], capture_output=True, text=True)
            ok, holder, _ = parse_lock_reply(r.stdout)
            assert not ok and holder is not None and holder.run_id == "run-mine", (r.stdout, r.stderr)
            mine.release()
            r = subprocess.run([*as_nobody, lock_command(other, False)], capture_output=True, text=True)
            assert r.stdout.startswith("acquired"), (r.stdout, r.stderr)
            assert f.stat().st_uid == 65534
            with pytest.raises(HostLocked) as e:    # nobody's run holds it: root's is refused, naming whose
                HostLock(HostFiles(LocalTransport()), "run-mine-again").acquire()
            assert "run run-other" in str(e.value) and "user nobody (uid 65534)" in str(e.value)
        else:
            mine.release()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_symbolic_link_at_the_lock_is_never_written_through(tmp_path):
    """Another account could leave a link where the lock goes (/run/lock is every account's): it is no lock of
    debugagent's, the run is refused, and nothing is written where it points."""
    lock = lock_file()
    lock.parent.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "victim"
    lock.symlink_to(target)
    with pytest.raises(HostLocked) as e:
        HostLock(HostFiles(LocalTransport()), "run-a").acquire()
    assert "symbolic link" in str(e.value) and not target.exists()
    HostFiles(LocalTransport()).unlock("run-a")
    assert lock.is_symlink()


def test_two_racing_runs_get_one_lock(tmp_path):
    """Eight shells racing for the lock: exactly one gets it (noclobber creates the file once)."""
    info = [LockInfo(run_id=f"r{i}", pid=i + 1, machine="m", since="now") for i in range(8)]
    procs = [subprocess.Popen(["bash", "-c", lock_command(x, False)], stdout=subprocess.PIPE, text=True) for x in info]
    outs = [p.communicate()[0] for p in procs]
    assert sum(o.startswith("acquired") for o in outs) == 1


def test_a_dead_holder_on_this_machine_is_taken_over(tmp_path):
    """A lock whose process is provably gone from this machine (a kill -9) is taken over, with a line saying
    whose; it needs no --force-unlock."""
    import socket
    t = LocalTransport()
    p = subprocess.Popen(["true"])
    p.wait()
    lock_file().parent.mkdir(parents=True, exist_ok=True)
    lock_file().write_text(LockInfo(run_id="gone", pid=p.pid, machine=socket.gethostname(),
                                                   since="then").model_dump_json())
    lock = HostLock(HostFiles(t), "new")
    lock.acquire()
    assert lock.held and "run gone" in lock.took_over and "no longer running" in lock.took_over
    assert '"new"' in lock_file().read_text()
    lock.release()


def test_a_reused_pid_or_a_reboot_is_a_gone_holder_and_a_live_one_is_not(tmp_path):
    """The holder is named by pid, start time and boot id: a live process with its pid but another start time
    (a reused pid), or a lock from before a reboot, is gone; this very process, or a holder on another machine,
    is not (those still need --force-unlock)."""
    import socket

    from debugagent.agent.journal import _boot_id, _start_ticks, owner_gone
    me = dict(pid=os.getpid(), machine=socket.gethostname(), since="now")
    start, boot = _start_ticks(os.getpid()), _boot_id()
    assert start > 0 and boot
    assert not owner_gone(LockInfo(run_id="live", boot=boot, start=start, **me))
    assert not owner_gone(LockInfo(run_id="old-lock-format", **me))            # no start time: cannot tell
    assert owner_gone(LockInfo(run_id="reused", boot=boot, start=start + 1, **me))
    assert owner_gone(LockInfo(run_id="rebooted", boot="another-boot", start=start, **me))
    assert not owner_gone(LockInfo(run_id="elsewhere", pid=1, machine="another-machine", since="now"))
    t = LocalTransport()
    HostLock(HostFiles(t), "live").acquire()
    with pytest.raises(HostLocked) as e:                                        # a live holder: refused
        HostLock(HostFiles(t), "second").acquire()
    assert "run live" in str(e.value) and "--force-unlock" in str(e.value)
    lock_file().unlink()


def test_the_same_run_id_held_by_a_live_process_is_refused(tmp_path):
    """`undo` or `resume` of a run whose process is still live: refused naming it (the same run id is not
    enough); once that process is gone, the same run id takes its lock back without --force-unlock."""
    import socket

    from debugagent.agent.journal import _boot_id, _start_ticks
    t = LocalTransport()
    lock_file().parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(["sleep", "60"])
    try:
        held = LockInfo(run_id="r1", pid=p.pid, machine=socket.gethostname(), since="then", boot=_boot_id(),
                        start=_start_ticks(p.pid))
        lock_file().write_text(held.model_dump_json())
        with pytest.raises(HostLocked) as e:
            HostLock(HostFiles(t), "r1").acquire()
        assert f"run r1 is still running (pid {p.pid}" in str(e.value) and f"kill -TERM {p.pid}" in str(e.value)
        assert lock_file().read_text() == held.model_dump_json()   # untouched
    finally:
        p.kill()
        p.wait()
    lock = HostLock(HostFiles(t), "r1")
    lock.acquire()
    assert lock.held and not lock.took_over     # its own lock: no "took over" line
    lock.release()
    assert not lock_file().exists()


def test_a_stale_lock_is_taken_over_only_if_unchanged(tmp_path):
    """The takeover removes the stale holder's lock only while the file still reads exactly that: a lock another
    run took in between stays."""
    t = LocalTransport()
    lock_file().parent.mkdir(parents=True, exist_ok=True)
    stale = LockInfo(run_id="stale", pid=1, machine="m", since="then").model_dump_json()
    lock_file().write_text(LockInfo(run_id="between", pid=2, machine="m", since="now").model_dump_json())
    ok, holder, _ = HostFiles(t).lock(LockInfo(run_id="me", pid=3, machine="m", since="now"), stale=stale)
    assert not ok and holder is not None and holder.run_id == "between"
    lock_file().write_text(stale)
    ok, _, _ = HostFiles(t).lock(LockInfo(run_id="me", pid=3, machine="m", since="now"), stale=stale)
    assert ok and '"me"' in lock_file().read_text()
    lock_file().unlink()


SLOW_STOP = ("import pathlib, signal, sys, time\n"
             "stopping = pathlib.Path(sys.argv[1][6:] + '/stopping')\n"
             "signal.signal(signal.SIGTERM, lambda *a: (stopping.touch(), time.sleep(1.5), sys.exit(0)))\n"
             "(stopping.parent / 'ready').touch()\n"
             "while True: time.sleep(1)\n")


def wait_ready(folder: Path) -> None:
    """Until SLOW_STOP's process has its SIGTERM handler (a slow start on a loaded machine would die of the
    default action instead)."""
    import time
    deadline = time.monotonic() + 60
    while not (folder / "ready").exists():
        assert time.monotonic() < deadline, "the slow-stopping server never started"
        time.sleep(0.05)


def running_as(argv: list[str]) -> list[int]:
    """The pids whose command line is exactly ``argv``."""
    want = b"".join(a.encode() + b"\0" for a in argv)
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "cmdline").read_bytes() == want:
                found.append(int(d.name))
        except OSError:
            continue
    return found


def test_an_undo_restart_waits_for_an_interrupted_runs_restart_still_under_way(tmp_path):
    """SIGTERM lands while the experiment's restart is still stopping the server (the host goes on with it):
    the undo restart sent then waits for that restart to end, stops what it started, and starts the server as
    found. Without the wait it saw the original still running, kept it, and the experiment's server stayed."""
    import threading
    import time

    from debugagent.tools.mutate import RestartServer
    t = LocalTransport()
    argv = [os.sys.executable, "-c", SLOW_STOP, f"--tag={tmp_path}"]
    proc = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", "MARK": "1"}, cwd=str(tmp_path), start_new_session=True)
    reaper = threading.Thread(target=proc.wait, daemon=True)   # reaped as init would: no zombie that looks alive
    reaper.start()
    env_file, pid_file, log = str(tmp_path / "debugagent-t.env"), str(tmp_path / "debugagent-t.pid"), str(tmp_path / "log")
    try:
        wait_ready(tmp_path)
        change = RestartServer(pid=proc.pid, argv=argv, cwd=str(tmp_path), env_file=env_file, unset=["MARK"],
                               save_env=True, pid_file=pid_file, log=log)
        undo = RestartServer(stop_pid_file=pid_file, expect_argv=argv, argv=argv, cwd=str(tmp_path), env_file=env_file,
                             keep_if_running=proc.pid, log=log)
        th = threading.Thread(target=lambda: t.run(change.command(), timeout=60))
        th.start()
        deadline = time.monotonic() + 30
        while not (tmp_path / "stopping").exists():   # the restart is under way: the original is being stopped
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert reaper.is_alive()
        r = t.run(undo.command(), timeout=60)
        th.join()
        assert r.ok and "started pid=" in r.stdout, r.stdout + r.stderr
        pids = running_as(argv)
        assert len(pids) == 1, pids                       # the experiment's server was stopped, not left beside it
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pids[0]}/environ").read_text().split("\0") if kv)
        assert env.get("MARK") == "1"                     # the server as found, with its environment
        assert not Path(pid_file).exists()
    finally:
        for pid in running_as(argv):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        reaper.join()


def test_a_home_that_cannot_be_written_keeps_the_host_journal_under_tmpdir(tmp_path, monkeypatch):
    """A container with a read-only root filesystem (only /tmp written): the host's copy of the journal goes to this
    account's folder under $TMPDIR, `undo` finds it there, and once it is removed nothing of it is left in /tmp.
    (Before: every experiment there failed, "the undo step could not be journalled".)"""
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked / "cache"))   # under a file: it can never be made
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    files = HostFiles(LocalTransport())
    files.write("journal-r9.json", '{"run_id": "r9"}')
    mine = tmp_path / "tmp" / f"debugagent-{os.getuid()}"
    assert (mine / "journal-r9.json").read_text() == '{"run_id": "r9"}'
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    assert files.journals() == {"journal-r9.json": '{"run_id": "r9"}'}
    files.remove("journal-r9.json")
    assert files.journals() == {} and os.listdir(tmp_path / "tmp") == []
    # a folder there that is a link is never written through
    os.symlink(tmp_path / "elsewhere", mine)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(OSError, match="not a folder of this account"):
        files.write("journal-r9.json", "{}")
    assert os.listdir(tmp_path / "elsewhere") == []
