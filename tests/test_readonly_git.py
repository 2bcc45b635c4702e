"""Git on a real checkout: a run without --allow-mutations leaves every file of it as it was (``.git/index``
included, which ``git status`` would otherwise rewrite), and debugagent's own worktrees run none of the repository's
hooks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from debugagent.tools.registry import Runner
from debugagent.tools.replay import legacy_command
from debugagent.tools.transport import LocalTransport

ENV = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com", "GIT_COMMITTER_NAME": "dev",
       "GIT_COMMITTER_EMAIL": "dev@example.com"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **ENV}).stdout.strip()


def repo_with_history(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for n in range(3):
        (path / "model.py").write_text(f"STEP = {n}\n")
        git(path, "add", "-A")
        git(path, "commit", "-qm", f"step {n}")
    return path


def files(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root`` (its .git too): its bytes' hash and its mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def test_a_run_without_mutations_leaves_the_checkout_and_its_index_as_they_were(tmp_path):
    repo = repo_with_history(tmp_path / "repo")
    time.sleep(1.1)
    os.utime(repo / "model.py")   # stat data newer than the index: `git status` would refresh and rewrite it
    before = files(repo)
    bench = tmp_path / "bench.py"   # a real benchmark: one timed request-sized pause, printed as its latency
    bench.write_text("import time\nt = time.perf_counter()\ntime.sleep(0.02)\n"
                     "print(f'latency={(time.perf_counter() - t) * 1000:.1f} ms')\n")
    cli = Path(sys.executable).parent / "debugagent"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([str(cli), "run", "--host", "local", "--repo", str(repo), "--server-pattern", "no-such-server-zq9",
                        "--bench", f"{sys.executable} {bench}",
                        "--symptom", "latency 30ms", "--baseline", "latency 20ms", "--read-only", "--json", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path, env=env)
    assert r.returncode == 3, r.stderr[-2000:]
    calls = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"tool": "git_state"' in calls or '"tool":"git_state"' in calls
    assert files(repo) == before


def test_debugagent_s_worktree_runs_no_hook_of_the_repository(tmp_path):
    """The code experiment's worktree (added, moved for a bisection step, removed) never runs post-checkout."""
    repo = repo_with_history(tmp_path / "repo")
    marker = tmp_path / "hook-ran"
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho \"$PWD\" >> '{marker}'\n")
    hook.chmod(0o755)
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    wt = tmp_path / "debugagent-wt-t"
    r = Runner(LocalTransport())
    for tool, inp in (("git_worktree_add", {"repo": str(repo), "path": str(wt), "commit": "HEAD~1"}),
                      ("git_worktree_checkout", {"path": str(wt), "commit": first}),
                      ("git_worktree_remove", {"repo": str(repo), "path": str(wt)})):
        o = r.call(tool, inp)
        assert o.ok and o.result.exit_code == 0, (tool, o.error, o.result.stdout)
    assert not wt.exists() and not marker.exists()
    git(repo, "checkout", "-q", "HEAD~1")   # the hook is a working one: git runs it for the user's own checkout
    assert marker.exists()


def test_recordings_made_before_keep_replaying():
    """The git reads and the worktree commands as the kept recordings hold them."""
    from debugagent.tools.host import GitRange, GitState
    from debugagent.tools.mutate import WorktreeAdd, WorktreeCheckout
    assert legacy_command(GitState(repo="/srv/r").command()).startswith("cd /srv/r && echo '== head' && git rev-parse")
    assert legacy_command(GitRange(repo="/r", good="a").command()).startswith("git -C /r log --reverse")
    assert legacy_command(WorktreeAdd(repo="/r", path="/tmp/w", commit="c").command()) == \
        "git -C /r worktree add --detach -f /tmp/w c 2>&1"
    assert legacy_command(WorktreeCheckout(path="/tmp/w", commit="c").command()) == \
        "git -C /tmp/w checkout -q --detach c && git -C /tmp/w rev-parse HEAD"
