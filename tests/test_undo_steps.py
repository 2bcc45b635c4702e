"""The undo's own steps against real processes on this machine (``--host local``): journalled and re-entrant,
"as found" checked after it, and only steps debugagent wrote are run."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from debugagent.agent.journal import HostFiles, Journal, undo_key
from debugagent.agent.lab import Lab, LabSetup, Measure, ServerRun, asfound
from debugagent.agent.signals import Interrupted, Signals
from debugagent.tools.errors import UsageError
from debugagent.tools.host import ServerInfo
from debugagent.tools.registry import Runner
from debugagent.tools.transport import CommandResult, LocalTransport

# a server that listens on its --port (with SO_REUSEPORT when --reuse is given: a second one binds beside it)
SERVER = ("import socket, sys, time\n"
          "a = sys.argv\n"
          "s = socket.socket()\n"
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT if '--reuse' in a else socket.SO_REUSEADDR, 1)\n"
          "s.bind(('127.0.0.1', int(a[a.index('--port') + 1])))\n"
          "s.listen()\n"
          "while True: time.sleep(1)\n")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def pids_with(tag: bytes) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and tag in cmdline(int(d.name)) and not cmdline(int(d.name)).startswith(b"bash"):
            out.append(int(d.name))
    return sorted(out)


def environ(pid: int) -> dict[bytes, bytes]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def listening(pid: int) -> bool:
    """The process holds a socket (it bound and listens: the script listens right after binding)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


class Found:
    """One server process as an operator started it: its command line (bytes), folder and environment."""

    def __init__(self, tmp_path: Path, reuse: bool = False, tag: bytes | None = None) -> None:
        self.run_id = "t" + secrets.token_hex(4)
        self.tag = tag or f"srv-{self.run_id}".encode()
        self.port = free_port()
        self.argv = [sys.executable.encode(), b"-c", SERVER.encode(), b"--tag=" + self.tag, b"--port",
                     str(self.port).encode(), *([b"--reuse"] if reuse else [])]
        self.cwd = tmp_path
        self.env = {b"PATH": b"/usr/bin:/bin", b"MARK": b"1", b"SECRET_TOKEN": b"s3cr3t-value"}
        p = subprocess.Popen(self.argv, cwd=str(tmp_path), env=self.env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.first = p
        threading.Thread(target=p.wait, daemon=True).start()   # reaped as init would: no zombie that looks alive
        self.wait(lambda: len(self.running()) == 1 and listening(self.running()[0]), "the server to listen")

    def running(self) -> list[int]:
        return pids_with(b"--tag=" + self.tag)

    def wait(self, pred, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def as_found(self) -> list[int]:
        """The processes running exactly as found: the command line's bytes, the folder and the environment."""
        want = b"".join(a + b"\0" for a in self.argv)
        return [p for p in self.running() if cmdline(p) == want and environ(p) == self.env
                and os.readlink(f"/proc/{p}/cwd") == str(self.cwd)]

    def info(self) -> ServerInfo:
        pid = self.running()[0]
        return ServerInfo(pid=pid, argv=[a.decode(errors="replace") for a in self.argv], cwd=str(self.cwd))

    def kill_all(self) -> None:
        for p in self.running():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for f in Path("/tmp").glob(f"debugagent-*{self.run_id}*"):
            f.unlink()


@pytest.fixture
def found(tmp_path):
    made: list[Found] = []

    def make(**kw) -> Found:
        f = Found(tmp_path, **kw)
        made.append(f)
        return f
    yield make
    for f in made:
        f.kill_all()


def lab_for(f: Found, tmp_path: Path, transport=None, settle_s: float = 20.0) -> tuple[Lab, list]:
    t = transport or LocalTransport()
    j = Journal(tmp_path / "journal.json", f.run_id, "local", HostFiles(t))
    events: list = []
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append((ev, kw)), j,
              Measure("", "", None, ready_timeout_s=settle_s), f.run_id, True,
              LabSetup(server_pattern=f"--tag={f.tag.decode(errors='replace')} "))
    return lab, events


def experiment(lab: Lab, f: Found) -> int:
    """The experiment's restart: the server without MARK (its undo journalled first)."""
    srv = f.info()
    return lab.server.start(Runner(LocalTransport()), srv, ServerRun(argv=srv.argv, cwd=srv.cwd, unset=["MARK"]),
                            "MARK unset")


def restart_step(lab: Lab):
    return next(s for s in lab.journal.pending() if s.tool == "restart_server")


def test_each_undo_step_is_journalled_started_before_its_tool_runs(found, tmp_path):
    """Both copies of the journal say a step is started (not done) before its command reaches the host, and done
    after; the host's copy goes once nothing is pending."""
    f = found()
    seen: list[tuple[str, bool, bool, bool]] = []
    host_copy = Path(os.environ["HOME"]) / ".cache" / "debugagent" / f"journal-{f.run_id}.json"

    class Watching(LocalTransport):
        def run(self, command: str, **kw) -> CommandResult:
            if "running pid=" in command or command.startswith("rm -f /tmp/debugagent-"):
                local = {s["tool"]: s for s in json.loads((tmp_path / "journal.json").read_text())["steps"]}
                host = {s["tool"]: s for s in json.loads(host_copy.read_text())["steps"]}
                tool = "remove_file" if command.startswith("rm -f") else "restart_server"
                if local[tool]["started"]:
                    seen.append((tool, local[tool]["started"], host[tool]["started"], local[tool]["done"]))
            return super().run(command, **kw)
    t = Watching()
    lab, _ = lab_for(f, tmp_path, t)
    experiment(lab, f)
    assert lab.do_undo(Runner(t)) == []
    assert ("restart_server", True, True, False) in seen and ("remove_file", True, True, False) in seen
    steps = json.loads((tmp_path / "journal.json").read_text())["steps"]
    assert all(s["started"] and s["done"] for s in steps)
    assert not host_copy.exists()
    assert len(f.as_found()) == 1 and len(f.running()) == 1


@pytest.mark.parametrize("reuse", [False, True], ids=["plain", "reuseport"])
def test_the_restart_step_run_again_from_any_point_leaves_one_server_as_found(found, tmp_path, reuse):
    """The undo's restart run twice (an undo interrupted after its step ran, before it was marked done), with and
    without SO_REUSEPORT: the second finds the server as found running and keeps it; one server, never two."""
    f = found(reuse=reuse)
    lab, _ = lab_for(f, tmp_path)
    experiment(lab, f)
    step = restart_step(lab)
    r = Runner(LocalTransport())
    first = r.call("restart_server", step.input, why="undo")
    assert first.ok and not first.output.already_running, first.result.stdout
    f.wait(lambda: len(f.as_found()) == 1 and listening(f.as_found()[0]), "the server as found")
    again = r.call("restart_server", step.input, why="undo, again")
    assert again.ok and again.output.already_running and again.output.pid == first.output.pid, again.result.stdout
    assert f.running() == f.as_found() == [first.output.pid]
    assert lab.do_undo(r) == [] and lab.journal.data.verified


def test_without_the_pid_file_the_experiments_server_is_found_by_command_line_and_start_time(found, tmp_path):
    """The pid file is gone (a cleaned /tmp) while the experiment's server runs: the undo finds that server by the
    pid and start time its journal step recorded, checked against its command line, stops it and starts the
    server as found: one server, as found."""
    f = found(reuse=True)
    lab, _ = lab_for(f, tmp_path)
    pid = experiment(lab, f)
    step = restart_step(lab)
    assert step.input["stop_pid"] == pid and step.input["stop_start"] > 0
    Path(step.input["stop_pid_file"]).unlink()
    assert lab.do_undo(Runner(LocalTransport())) == []
    f.wait(lambda: pid not in f.running(), "the experiment's server to stop")
    assert len(f.as_found()) == 1 and f.running() == f.as_found()
    assert lab.journal.data.verified


def test_a_non_utf8_byte_in_the_servers_argv_is_compared_and_restored_as_bytes(found, tmp_path):
    """The server's argv holds \\xff (read back as U+FFFD): the experiment's restart still recognises it, and the
    undo starts it again with the byte itself; the check finds it as found."""
    f = found(tag=b"nonutf8-" + secrets.token_hex(3).encode() + b"-\xff")
    lab, _ = lab_for(f, tmp_path)
    lab.setup.server_pattern = f"--tag=nonutf8-{f.tag[8:14].decode()}-"
    experiment(lab, f)
    assert f.as_found() == []                       # the experiment's server runs without MARK
    assert lab.do_undo(Runner(LocalTransport())) == []
    f.wait(lambda: len(f.as_found()) == 1, "the server as found")
    assert f.running() == f.as_found()
    assert lab.journal.data.verified


def test_two_servers_where_one_was_found_is_a_difference_naming_the_fix(found, tmp_path):
    """After the undo a second server runs as found beside the first (SO_REUSEPORT lets it bind): the check says
    so, names the pids and the command that stops the extra one; an environment changed is named by variable."""
    f = found(reuse=True)
    lab, _ = lab_for(f, tmp_path, settle_s=1.0)
    experiment(lab, f)
    assert lab.do_undo(Runner(LocalTransport())) == []
    extra = subprocess.Popen(f.argv, cwd=str(f.cwd), env=f.env, start_new_session=True, stdin=subprocess.DEVNULL)
    threading.Thread(target=extra.wait, daemon=True).start()
    f.wait(lambda: len(f.running()) == 2 and all(listening(p) for p in f.running()), "two servers")
    left = lab.undo.verify(Runner(LocalTransport()))
    assert left and "2 server process tree(s) run where 1 was found" in left[0], left
    assert f"kill {extra.pid}" in left[0] or any(f"kill {p}" in left[0] for p in f.running())
    assert not lab.journal.data.verified
    os.kill(extra.pid, signal.SIGKILL)
    f.wait(lambda: len(f.running()) == 1, "the extra server to go")
    assert lab.undo.verify(Runner(LocalTransport())) == [] and lab.journal.data.verified


def test_a_changed_variable_is_named_and_its_value_never_kept(found, tmp_path):
    """An environment that differs is named by the variable; the journal keeps digests, not values."""
    f = found()
    lab, _ = lab_for(f, tmp_path, settle_s=1.0)
    experiment(lab, f)   # MARK unset: the experiment's server differs from the found one
    before = lab.journal.data.before["server"]
    diffs = asfound.compare("server", before, asfound.read(lambda c: LocalTransport().run(c), "server", before["how"],
                                                           lab.undo._digest))
    assert len(diffs) == 1 and "its environment differs in MARK" in diffs[0].text, diffs
    for text in ((tmp_path / "journal.json").read_text(),
                 (Path(os.environ["HOME"]) / ".cache" / "debugagent" / f"journal-{f.run_id}.json").read_text()):
        assert "s3cr3t-value" not in text
    assert lab.do_undo(Runner(LocalTransport())) == []


def journal_with_worktree_step(tmp_path: Path, run_id: str) -> tuple[Journal, Path]:
    t = LocalTransport()
    j = Journal(tmp_path / "journal.json", run_id, "local", HostFiles(t))
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    j.record("git_worktree_remove", {"repo": str(repo), "path": f"/tmp/debugagent-wt-{run_id}"},
             f"remove the worktree /tmp/debugagent-wt-{run_id}")
    return j, repo


def edit_both_copies(tmp_path: Path, run_id: str, change) -> None:
    host = Path(os.environ["HOME"]) / ".cache" / "debugagent" / f"journal-{run_id}.json"
    for p in (tmp_path / "journal.json", host):
        data = json.loads(p.read_text())
        change(data["steps"][0])
        p.write_text(json.dumps(data))


def test_an_edited_step_is_refused_and_named_and_nothing_is_deleted(tmp_path):
    """A worktree step edited (both copies) to point at another folder: its signature no longer matches, so the
    undo refuses it, names it, and the folder stays."""
    run_id = "t" + secrets.token_hex(4)
    j, _ = journal_with_worktree_step(tmp_path, run_id)
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data").write_text("keep")
    edit_both_copies(tmp_path, run_id, lambda s: s["input"].update(path=str(victim)))
    k = Journal.open(tmp_path / "journal.json", run_id, "local", HostFiles(LocalTransport()))
    k.merge_host_copy()
    lab = Lab(lambda h: Runner(LocalTransport()), lambda ev, **kw: None, k, Measure("", "", None), run_id, True)
    left = lab.do_undo(Runner(LocalTransport()))
    assert left and "refused step 1" in left[0] and "signature does not match" in left[0], left
    assert (victim / "data").read_text() == "keep"


def test_a_signed_step_outside_debugagents_prefixes_is_refused(tmp_path):
    """A step naming a path debugagent does not make (not one /tmp/debugagent-… name with the run id) is
    refused, even signed."""
    run_id = "t" + secrets.token_hex(4)
    j = Journal(tmp_path / "journal.json", run_id, "local", HostFiles(LocalTransport()))
    victim = tmp_path / "precious"
    victim.write_text("keep")
    for path in (str(victim), f"/tmp/debugagent-{run_id}/../etc", "/tmp/debugagent-other-run"):
        j.record("remove_file", {"path": path}, f"remove {path}")
        lab = Lab(lambda h: Runner(LocalTransport()), lambda ev, **kw: None, j, Measure("", "", None), run_id, True)
        left = lab.do_undo(Runner(LocalTransport()))
        assert left and f"path {path!r} is not a path debugagent makes" in left[0], left
        j.mark_done(j.pending()[0])
    assert victim.read_text() == "keep"


def test_a_step_with_wrong_types_is_exit_2_naming_the_field(tmp_path):
    """`debugagent undo RUN` on a journal whose step has a wrong type: exit 2 naming the journal, the step and the
    field, no traceback."""
    from debugagent.agent.config import RunConfig
    run_id = "t" + secrets.token_hex(4)
    journal_with_worktree_step(tmp_path, run_id)
    edit_both_copies(tmp_path, run_id, lambda s: s["input"].update(path=["not", "a", "path"]))
    opts = RunConfig.model_validate({"host": "local", "symptom": "latency 30 ms", "baseline": "latency 20 ms"})
    (tmp_path / "run.json").write_text(json.dumps(opts.saved(run_id)))
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "undo", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "undo step 1 (git_worktree_remove): input.path" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_undo_key_is_private_and_a_shared_one_is_refused(tmp_path):
    """The key is made once, mode 600, in the state folder (no run folder holds it); a key others can read is
    refused with the command that fixes it."""
    key = undo_key()
    path = Path(os.environ["XDG_STATE_HOME"]) / "debugagent" / "undo.key"
    assert path.stat().st_mode & 0o777 == 0o600 and undo_key() == key and len(key) == 32
    path.chmod(0o644)
    with pytest.raises(UsageError) as e:
        undo_key()
    assert f"chmod 600 {path}" in str(e.value.fix)


# each signal once, at one of the two steps (the subprocess matrix is tests/realhost/test_undo_signals.py)
@pytest.mark.parametrize(("sig", "tool"), [(signal.SIGTERM, "restart_server"), (signal.SIGINT, "remove_file"),
                                           (signal.SIGHUP, "restart_server")],
                         ids=["SIGTERM-restart_server", "SIGINT-remove_file", "SIGHUP-restart_server"])
def test_a_signal_during_an_undo_step_waits_for_it_and_the_undo_goes_on(found, tmp_path, sig, tool):
    """The signal arrives while the step's command runs on the host: the step finishes and is recorded, the undo
    goes on to its end and checks the host, and only then the signal stops the run; the host is as found."""
    f = found(reuse=True)
    lab, events = lab_for(f, tmp_path)
    experiment(lab, f)

    class Signalling(LocalTransport):
        def run(self, command: str, **kw) -> CommandResult:
            hit = (tool == "remove_file" and command.startswith("rm -f /tmp/debugagent-")) or (
                tool == "restart_server" and "running pid=" in command)
            if hit:
                os.kill(os.getpid(), sig)      # lands while the command runs (the handler waits for it)
            return super().run(command, **kw)
    t = Signalling()
    with Signals() as s, pytest.raises(Interrupted) as exc:
        lab.do_undo(Runner(t))
    assert exc.value.signum == sig and s.received == [sig]
    assert all(st.done for st in lab.journal.data.steps) and lab.journal.data.verified
    assert any("the undo goes on" in (kw.get("text") or "") for _, kw in events)
    assert len(f.as_found()) == 1 and f.running() == f.as_found()


# SIGINT and SIGHUP (the handler is one for the three signals; SIGTERM meets the restart step above)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_a_signal_during_a_code_reverts_worktree_removal_waits_for_it_and_the_undo_goes_on(tmp_path, sig):
    """A code revert's undo (its worktree removed) under a signal: the removal finishes and is recorded, the host
    is checked (HEAD and worktrees as found), and only then the signal stops the undo."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                                   "--allow-empty", "-m", "first"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    run_id = "t" + secrets.token_hex(4)
    wt = f"/tmp/debugagent-{run_id}-wt"
    t = LocalTransport()
    events: list = []
    lab = Lab(lambda h: Runner(t), lambda ev, **kw: events.append((ev, kw)),
              Journal(tmp_path / "journal.json", run_id, "local", HostFiles(t)), Measure("", "", None), run_id, True)
    try:
        lab.push_undo("git_worktree_remove", {"repo": str(repo), "path": wt}, "remove the worktree")
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", wt], check=True)

        class Signalling(LocalTransport):
            def run(self, command: str, **kw) -> CommandResult:
                if "worktree remove" in command:
                    os.kill(os.getpid(), sig)      # lands while the command runs (the handler waits for it)
                return super().run(command, **kw)
        with Signals() as s, pytest.raises(Interrupted) as exc:
            lab.do_undo(Runner(Signalling()))
        assert exc.value.signum == sig and s.received == [sig]
        assert all(st.done for st in lab.journal.data.steps) and lab.journal.data.verified
        assert not os.path.exists(wt)
        listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True,
                                text=True, check=True).stdout
        assert listed.count("worktree ") == 1, listed
    finally:
        subprocess.run(["rm", "-rf", wt])


def test_the_variables_systemd_gives_each_start_are_no_difference():
    """A systemd unit restarted as found by the undo has a new INVOCATION_ID (and JOURNAL_STREAM, SYSTEMD_EXEC_PID):
    systemd gives each start its own. The server is as found; any other variable that differs is still named."""
    def server(**env: str) -> dict:
        return {"pid": 7, "argv": ["/opt/venv/bin/vllm", "serve", "m"], "argv_text": "/opt/venv/bin/vllm serve m",
                "cwd": "/opt", "ports": [8000], "tree": 2, "env_names": list(env), "env_digests": list(env.values())}
    before = {"servers": [server(INVOCATION_ID="a1", JOURNAL_STREAM="8:1", SYSTEMD_EXEC_PID="7", HF_HOME="h")]}
    after = {"servers": [server(INVOCATION_ID="b2", JOURNAL_STREAM="8:2", SYSTEMD_EXEC_PID="9", HF_HOME="h")]}
    assert asfound.compare("server", before, after) == []
    after["servers"][0]["env_digests"][-1] = "other"
    diffs = asfound.compare("server", before, after)
    assert len(diffs) == 1 and diffs[0].text.endswith("its environment differs in HF_HOME"), diffs
