"""Names with shell metacharacters that debugagent later passes back to the host: a branch, a commit message
and a file name holding `$(…)`, backticks, `;` and newlines. The code experiment (worktree, revert, bisection,
restart from the worktree) must never run any of them, and still name the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import git, tmp_leftovers
from .test_experiments import found_state, report, same_but_pid

pytestmark = pytest.mark.slow


def test_branch_commit_and_file_names_with_shell_syntax_never_run(realhost, tmp_path):
    h = realhost("names")
    marks = tmp_path / "marks"
    marks.mkdir()
    repo = h.dir / "repo"
    repo.mkdir()
    # each would create a file in `marks` if any shell ever evaluated it
    branch = f"fix;$(touch${{IFS}}{marks}/branch-dollar)`touch${{IFS}}{marks}/branch-tick`"
    git(repo, "init", "-q", "-b", branch)
    h.write_code(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "Serve /generate")
    git(repo, "checkout", "-q", "-b", "upstream")
    evil_subject = f"Batch the step $(touch {marks}/subject-dollar); `touch {marks}/subject-tick`"
    tag = marks.parent.name[-12:]   # file names hold no `/`: their commands would touch a mark in the cwd
    for subject, extra, name in [("Document the flags", 0.0, f"NOTES $(touch mark-file-dollar-{tag}).md"),
                                 (evil_subject + f"\n\nbody; touch {marks}/body\n$(touch {marks}/body-dollar)", 20.0,
                                  f"x`touch mark-file-tick-{tag}`;.md"),
                                 ("Update the README", 20.0, "README;rm -rf ~.md")]:
        h.write_code(repo, 10.0, extra)
        (repo / name).write_text(subject + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", subject)
    git(repo, "checkout", "-q", branch)
    h.cwd = repo
    h.start()
    base = h.baseline()
    git(repo, "merge", "-q", "--ff-only", "upstream")
    h.restart()
    bad = h.baseline(3)
    assert bad > base + 5
    before = found_state(h, repo)

    o = h.run("--symptom", f"latency {bad:.2f} ms", "--baseline", f"latency {base:.2f} ms", "--repo", str(repo),
              out=tmp_path / "run")
    report(o, "names")

    assert sorted(p.name for p in marks.iterdir()) == [], "a name was run by a shell"
    for where in (repo, h.dir, Path("/tmp"), Path.home(), Path.cwd()):
        assert not list(where.glob(f"mark-file-*-{tag}")), f"a file name was run by a shell (in {where})"
    assert o["exit"] == 0, o["summary"]
    cause = o["root_cause"]
    assert cause["hypothesis"] == "code_change" and "Batch the step" in cause["summary"]
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == branch
    after = found_state(h, repo)
    assert same_but_pid(before, after)
    assert tmp_leftovers(o["run_id"]) == []
    fix = (tmp_path / "run" / "transcript.md").read_text()
    now = fix.split("## What to do now", 1)[-1][:1500]
    assert "revert --no-edit" in now and "&lt;details" not in fix, now
