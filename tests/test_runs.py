"""`debugagent runs list|show|prune`: the run folders a person accumulates, as the real CLI sees them; prune never
removes a live run nor one whose undo journal still has something to do."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest


def cli(*args: str, state: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debugagent.agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "XDG_STATE_HOME": str(state)})


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """One real run's folder (a simulated host, in the default state folder)."""
    state = tmp_path_factory.mktemp("state")
    r = cli("run", "--host", "sim:power-capped", "--symptom", "decode 74 tok/s", "--baseline", "decode 89 tok/s",
            state=state)
    assert r.returncode == 0, r.stderr[-2000:]
    (folder,) = (state / "debugagent" / "runs").iterdir()
    return folder


def edit_events(folder: Path, *, started: datetime | None = None, unfinished: bool = False) -> None:
    lines = (folder / "events.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    if started is not None:
        head["started_at"] = started.isoformat(timespec="seconds")
    lines[0] = json.dumps(head)
    if unfinished:
        lines = [ln for ln in lines if json.loads(ln)["event"] not in ("conclusion", "interrupted", "error")]
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")


def edit_journal(folder: Path, **changes) -> None:
    data = json.loads((folder / "journal.json").read_text())
    data.update(changes)
    (folder / "journal.json").write_text(json.dumps(data))


def copy_run(made: Path, runs: Path, name: str, age_days: float) -> Path:
    dst = runs / name
    shutil.copytree(made, dst)
    edit_events(dst, started=datetime.now(UTC) - timedelta(days=age_days))
    return dst


@pytest.fixture
def runs(made, tmp_path):
    """Five runs: a new one, an old finished one, an old one with a step left to undo, an old live one (its
    journal names a running process of this machine) and an old crashed one (its process is gone)."""
    root = tmp_path / "debugagent" / "runs"
    root.mkdir(parents=True)
    new = copy_run(made, root, "20261203T000000Z-new", 0.1)
    old = copy_run(made, root, "20261101T000000Z-old", 30)
    unsettled = copy_run(made, root, "20261102T000000Z-unsettled", 29)
    data = json.loads((unsettled / "journal.json").read_text())
    data["steps"][0]["done"] = False
    (unsettled / "journal.json").write_text(json.dumps(data))
    live = copy_run(made, root, "20261103T000000Z-live", 28)
    edit_events(live, unfinished=True)
    proc = subprocess.Popen(["sleep", "300"])
    edit_journal(live, pid=proc.pid, machine=socket.gethostname())
    crashed = copy_run(made, root, "20261104T000000Z-crashed", 27)
    edit_events(crashed, unfinished=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    edit_journal(crashed, pid=dead.pid, machine=socket.gethostname())
    (root / "notes-of-mine").mkdir()   # not a run: never listed, never removed
    try:
        yield {"state": tmp_path, "root": root, "new": new, "old": old, "unsettled": unsettled, "live": live,
               "crashed": crashed}
    finally:
        proc.kill()
        proc.wait()


def test_list_newest_first_with_host_symptom_verdict_and_size(runs):
    r = cli("runs", "list", state=runs["state"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "STARTED", "(UTC)"]
    names = [ln.split()[0] for ln in lines[1:6]]
    assert names == ["20261203T000000Z-new", "20261104T000000Z-crashed", "20261103T000000Z-live",
                     "20261102T000000Z-unsettled", "20261101T000000Z-old"]
    new = lines[1]
    assert "sim:power-capped" in new and "decode 74 tok/s" in new and "root cause gpu_clocks" in new
    assert new.rstrip().endswith(("KB", "MB")) and " 0 " in new
    assert "live" in lines[3] and "undo pending" in lines[4] and "unfinished" in lines[2]
    assert "notes-of-mine" not in r.stdout
    j = json.loads(cli("runs", "list", "--json", state=runs["state"]).stdout)
    assert [x["folder"] for x in j][0] == str(runs["new"]) and j[0]["exit_code"] == 0 and j[0]["size"] > 0


def test_show_one_run_by_a_prefix(runs):
    r = cli("runs", "show", "20261102", state=runs["state"])
    assert r.returncode == 0, r.stderr
    assert "sim:power-capped" in r.stdout and "1 step(s) left" in r.stdout
    assert f"debugagent undo {runs['unsettled']}" in r.stdout and "report.html" in r.stdout
    r = cli("runs", "show", "2026", state=runs["state"])
    assert r.returncode == 2 and "names 5 runs" in r.stderr


def test_prune_older_than_keeps_live_and_unsettled_runs_and_says_so(runs):
    r = cli("runs", "prune", "--older-than", "7d", state=runs["state"])
    assert r.returncode == 0, r.stderr
    left = sorted(p.name for p in runs["root"].iterdir())
    assert left == ["20261102T000000Z-unsettled", "20261103T000000Z-live", "20261203T000000Z-new", "notes-of-mine"]
    assert "removed 20261101T000000Z-old" in r.stdout and "removed 20261104T000000Z-crashed" in r.stdout
    assert "kept 20261103T000000Z-live: it is live" in r.stderr
    assert "kept 20261102T000000Z-unsettled: its undo journal is not settled" in r.stderr
    assert f"debugagent undo {runs['unsettled']}" in r.stderr


def test_prune_keep_n_and_dry_run(runs):
    r = cli("runs", "prune", "--keep", "2", "--dry-run", state=runs["state"])
    assert r.returncode == 0 and "would remove 20261101T000000Z-old" in r.stdout
    assert len(list(runs["root"].iterdir())) == 6
    r = cli("runs", "prune", "--keep", "1", state=runs["state"])
    assert r.returncode == 0, r.stderr
    left = sorted(p.name for p in runs["root"].iterdir())
    assert left == ["20261102T000000Z-unsettled", "20261103T000000Z-live", "20261203T000000Z-new", "notes-of-mine"]


@pytest.mark.parametrize("args,words", [((), "--older-than"), (("--older-than", "soon"), "--older-than"),
                                        (("--keep", "-1"), "--keep")])
def test_prune_without_a_rule_is_exit_2(runs, args, words):
    r = cli("runs", "prune", *args, state=runs["state"])
    assert r.returncode == 2 and words in r.stderr
    assert len(list(runs["root"].iterdir())) == 6
