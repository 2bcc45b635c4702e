"""Git: the server's checkout (HEAD, branch, dirty files, log and reflog), and commit ranges for bisection.

Snapshot field ``repo``; difference paths ``repo.head`` and ``repo.dirty``; fact ``repo`` (where HEAD moved
from, and how many commits a bisection would test).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .. import host
from .base import Add, Call, Gathering, Probe, Tool
from .text import code, plural, render_unit_sep

if TYPE_CHECKING:
    from ..snapshot import Snapshot


class Fields(BaseModel):
    repo: host.GitInfo | None = None


def render_git_state(out: str, command: str, parsed: dict[str, Any]) -> list[str]:
    """``git_state``: HEAD, branch, dirty files and the counts in one line; the log and reflog tables collapsed."""
    full = render_unit_sep(out, command)
    head = parsed.get("head") or ""
    bits = [f"HEAD {code(head[:12])}" if head else "HEAD ?"]
    if parsed.get("branch"):
        bits.append(f"branch {code(parsed['branch'])}")
    for key, word, many in (("dirty", "changed file", None), ("commits", "commit", None), ("reflog", "reflog entry", "reflog entries")):
        v = parsed.get(key)
        n = len(v) if isinstance(v, list) else v if isinstance(v, int) else None
        if n is not None:
            bits.append(plural(n, word, many))
    return ["Output: " + "; ".join(bits) + " (the log and the reflog below; HEAD's moves are in the timeline)",
            "<details><summary>the log and the reflog</summary>", "", *full, "", "</details>"]


def _summary(ev: dict[str, Any]) -> list[str] | None:
    out = ev.get("stdout") or ""
    return render_git_state(out, ev.get("command") or "", ev.get("output") or {}) if "\x1f" in out else None


def _second(g: Gathering) -> list[Call]:
    return [("git_state", {"repo": g.repo}, "HEAD, dirty files, reflog")] if g.repo else []


def _fill(g: Gathering) -> dict[str, Any]:
    """The checkout; where the repository (or no repository) gave none, the editable package's checkout."""
    gi = g.outcomes.get("git_state")
    git = g.output("git_state")
    packages: host.PackageSet | None = g.output("python_packages")
    if (gi is None or not gi.ok) and packages and g.want("git_state"):
        editable = next((p.editable for p in packages.packages if p.editable and p.commit), None)
        if editable:
            o = g.runner.call("git_state", {"repo": editable}, why="the editable package's checkout")
            git = o.output if o.ok else None
    return {"repo": git}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    if a.repo and b.repo and a.repo.head != b.repo.head:
        subj = {c.sha: c.subject for c in (a.repo.commits + b.repo.commits)}
        add("repo.head", a.repo.head[:12], b.repo.head[:12], f"{subj.get(a.repo.head, '?')} -> {subj.get(b.repo.head, '?')}")
    if a.repo and b.repo and sorted(a.repo.dirty) != sorted(b.repo.dirty):
        add("repo.dirty", a.repo.dirty, b.repo.dirty)


def repo_facts(snap: Snapshot, baseline: Snapshot | None) -> dict[str, Any] | None:
    """The checkout: head, branch, where the head moved from, and how many commits to bisect."""
    if not snap.repo:
        return None
    g = snap.repo
    prev = g.previous_head()
    moved = next((e.when for e in g.reflog if e.sha == g.head), None) if prev else None
    shas = [c.sha for c in g.commits]
    count = shas.index(prev) if prev in shas else (len(shas) if prev else 0)
    base_head = baseline.repo.head if baseline and baseline.repo else None
    if base_head and base_head in shas:
        count = shas.index(base_head)
    return {"path": g.repo, "head": g.head, "branch": g.branch, "dirty": g.dirty, "previous_head": prev,
            "moved_at": moved, "range_count": count, "head_subject": g.commits[0].subject if g.commits else "",
            "commits": [c.model_dump() for c in g.commits[:30]]}


PROBE = Probe(
    "git",
    tools=(Tool("git_state", host.GitState, lambda i, r: host.parse_git_state(i.repo, r.stdout), summary=_summary,
                optional=True, wave=2, check=True),
           Tool("git_range", host.GitRange, lambda i, r: host.parse_git_range(r.stdout))),
    second=_second, fill=_fill, diff_paths=("repo.head", "repo.dirty"), diff=_diff,
    facts=lambda snap, fx: {"repo": repo_facts(snap, fx.baseline)}, quiet=("not a git repository",),
)
