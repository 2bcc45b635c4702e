"""Bad input is exit 2 naming the field and a fix, with no traceback and nothing written outside the run folder.

Each case runs the real command (``debugagent run`` as a subprocess) on a simulated host, or on this machine
(``--host local``) where the case is about the host's own files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from debugagent.agent.config import RunConfig
from debugagent.agent.run import new_run_folder
from debugagent.tools.errors import UsageError

HOST = ["--host", "sim:governor-powersave", "--symptom", "decode 80 tok/s"]
SCRIPT = Path(sys.executable).parent / "debugagent"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "debugagent.agent.cli", *args]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli("run", *args), capture_output=True, text=True, timeout=timeout)


def refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, an error line naming each of ``words``, a fix, and no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "error: " in r.stderr and "fix: " in r.stderr, r.stderr[-2000:]
    for w in words:
        assert w in r.stderr, r.stderr[-2000:]


# ---------------------------------------------------------------- --out
def test_out_at_the_root_folder_is_refused():
    """`--out /` would put a run's six files straight into `/`: refused before anything is written."""
    with pytest.raises(UsageError) as e:
        new_run_folder(RunConfig(host="sim:governor-powersave", symptom="decode 80 tok/s", out="/"), "decode")
    assert "--out /: is the root folder" in e.value.message and "debugagent-run" in (e.value.fix or "")


def test_out_a_folder_holding_other_files_is_refused(tmp_path):
    """A folder that is not empty and not a debugagent run's: exit 2 naming its files, nothing written in it."""
    home = tmp_path / "project"
    home.mkdir(exist_ok=True)
    (home / "notes.txt").write_text("mine\n")
    r = run(*HOST, "--out", str(home))
    refused(r, f"--out {home}", "notes.txt")
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


def test_out_an_empty_folder_still_takes_a_run(tmp_path):
    """An empty folder (or one a run made and left before its first event) is still a place for a run."""
    (tmp_path / "empty").mkdir()
    new_run_folder(RunConfig(host="sim:governor-powersave", symptom="decode 80 tok/s", out=str(tmp_path / "empty")),
                   "decode")
    (tmp_path / "empty" / "run.json").write_text("{}")
    new_run_folder(RunConfig(host="sim:governor-powersave", symptom="decode 80 tok/s", out=str(tmp_path / "empty")),
                   "decode")


def can_mount_tmpfs(tmp_path: Path) -> bool:
    d = tmp_path / "probe-mnt"
    d.mkdir()
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                        f"mount -t tmpfs -o size=64k tmpfs {d} && touch {d}/x"], capture_output=True, timeout=30)
    return r.returncode == 0


def test_a_full_run_folder_stops_the_run_with_a_message(tmp_path):
    """The run folder's disk fills during the run (a tmpfs of 300 KiB, in a mount namespace of its own): exit 2
    naming the folder and the cause, no traceback, nothing written elsewhere."""
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("needs unshare with user and mount namespaces (util-linux)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inner = " ".join([f"mount -t tmpfs -o size=300k tmpfs {mnt} &&", "exec", *[f"'{a}'" for a in cli(
        "run", *HOST, "--out", str(mnt / "run"))]])
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], capture_output=True,
                       text=True, timeout=180, cwd=tmp_path)
    refused(r, f"the run folder {mnt / 'run'} cannot be written", "No space left on device")
    assert list(mnt.iterdir()) == []   # the tmpfs is gone with its namespace; nothing landed under it here


# ---------------------------------------------------------------- files given as flags
def test_a_binary_playbook_names_the_file(tmp_path):
    bad = tmp_path / "pb.yaml"
    bad.write_bytes(b"\xff\xfe\x00\x01binary")
    refused(run(*HOST, "--playbook", str(bad), "--out", str(tmp_path / "run")), f"playbook `{bad}`", "not UTF-8")
    assert not (tmp_path / "run").exists()


def test_a_binary_scenario_names_the_file(tmp_path):
    bad = tmp_path / "sc.yaml"
    bad.write_bytes(b"version: 1\n\xff\xfe")
    r = run("--host", f"sim:{bad}", "--symptom", "decode 80 tok/s", "--out", str(tmp_path / "run"))
    refused(r, f"scenario `{bad}`", "not UTF-8")


def test_a_snapshot_of_a_version_not_known_is_refused(tmp_path):
    snap = tmp_path / "good.json"
    snap.write_text(json.dumps({"snapshot_version": 99, "host": "gpu-box"}))
    refused(run(*HOST, "--baseline-snapshot", str(snap), "--out", str(tmp_path / "run")),
            "--baseline-snapshot", "snapshot_version 99")


@pytest.mark.parametrize("kind", ["folder", "device", "fifo"])
def test_a_baseline_snapshot_that_is_not_a_file_says_what_it_is(tmp_path, kind):
    """A folder, /dev/zero or a FIFO: named as what it is (not "no such file"), and a FIFO never blocks the run."""
    path = {"folder": tmp_path, "device": Path("/dev/zero"), "fifo": tmp_path / "fifo"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    started = time.monotonic()
    r = run(*HOST, "--baseline-snapshot", str(path), "--out", str(tmp_path / "run"), timeout=60)
    refused(r, "--baseline-snapshot", {"folder": "is a folder", "device": "is a device", "fifo": "is a FIFO"}[kind])
    assert "no such file" not in r.stderr and time.monotonic() - started < 60


def test_a_wheelhouse_the_host_lacks_is_refused_before_the_run(tmp_path):
    """`--wheelhouse` names a folder on the host: one the host lacks is exit 2 once the host is open, before the run
    folder is made; one it has still runs."""
    r = run(*HOST, "--wheelhouse", "/nonexistent", "--out", str(tmp_path / "run"))
    refused(r, "--wheelhouse /nonexistent", "no such folder or wheel")
    assert not (tmp_path / "run").exists()
    ok = run("--host", "sim:flashinfer-wheelhouse", "--symptom", "verify 30ms", "--baseline", "verify 20ms",
             "--wheelhouse", "/root/wheelhouse", "--json", "--out", str(tmp_path / "ok"))
    assert ok.returncode == 0 and json.loads(ok.stdout)["root_cause"]["hypothesis"] == "compiled_dependency", ok.stderr


# ---------------------------------------------------------------- the host's own files
@pytest.mark.slow
def test_an_empty_host_lock_is_taken_over_with_a_line(tmp_path):
    """A full disk on the host once left `host.lock` empty: a later run takes it over, saying so, not refusing for
    ever."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    lock = Path(os.environ["DEBUGAGENT_LOCK_DIR"]) / "debugagent-host.lock"   # the one lock of the host, per test
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    # a pattern no process matches: this machine's other servers are none of this run's business
    r = subprocess.run(cli("run", "--host", "local", "--symptom", "decode 80 tok/s", "--bench",
                           "echo decode=80 tok/s", "--repo", str(tmp_path), "--server-pattern", "no-such-server-[0-9]{9}",
                           "--reproduce-runs", "2", "--read-only", "--json", "--out", str(out)),
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert r.returncode in (0, 3), r.stderr[-2000:]
    said = [json.loads(ln).get("text", "") for ln in (out / "events.jsonl").read_text().split("\n") if ln]
    assert any("took over an empty lock file" in t for t in said)
    assert not lock.exists()   # released at the end, as a lock of its own


# ---------------------------------------------------------------- signals and the end of a run
def caught(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its /proc status SigCgt mask)."""
    try:
        line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)


@pytest.mark.skipif(not SCRIPT.exists(), reason="needs the installed `debugagent` command")
def test_sigterm_while_starting_exits_130(tmp_path):
    """SIGTERM before the run's own handlers are set (the imports, connecting): exit 130, as Ctrl-C, not -15."""
    p = subprocess.Popen([str(SCRIPT), "run", *HOST, "--out", str(tmp_path / "run")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # at once after the entry point's handler is set (SigCgt holds SIGTERM): the interpreter's own start-up, before
    # any line of debugagent runs, is the one moment no handler can exist; a fixed sleep lost that race on a loaded machine
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not caught(p.pid, signal.SIGTERM):
        time.sleep(0.002)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err, err


# ---------------------------------------------------------------- no benchmark on a real host
@pytest.mark.skipif(Path("/etc/debugagent/host.json").exists(), reason="this machine has a host profile (it may name a benchmark)")
def test_a_real_host_with_no_benchmark_is_refused_up_front(tmp_path, monkeypatch, capsys):
    """`run --host local` with no --bench and no host profile naming one would take no benchmark run and leave
    every hypothesis undecided (exit 3): refused at discovery instead, exit 2 naming --bench, before any probe;
    with --json the same refusal is the JSON error object. (In-process, through the command line's own `main`.)"""
    from debugagent.agent.cli import main

    def run_main(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["debugagent", "run", "--host", "local", "--symptom", "verify 30ms",
                                          "--server-pattern", "no-such-server-[0-9]{9}", "--read-only", *args])
        with pytest.raises(SystemExit) as ex:
            main()
        got = capsys.readouterr()
        return int(ex.value.code or 0), got.out, got.err

    out = tmp_path / "run"
    code, _, err = run_main("--baseline", "verify 20ms", "--out", str(out))
    refused(subprocess.CompletedProcess([], code, "", err), "no benchmark", "--bench")
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().split("\n") if ln]
    assert not any(e.get("type") in ("conclusion", "verdict") for e in events), events
    assert not any(e.get("tool") in ("bench", "gpu", "packages") for e in events), events   # nothing probed
    code, stdout, _ = run_main("--json", "--out", str(tmp_path / "run2"))
    assert code == 2
    assert "--bench" in json.loads(stdout)["error"]["fix"], stdout
