"""Bisection: a reverted checkout that recovered the regression names its first bad commit, by benchmarking the
commits in between in the worktree (the server restarted on each when it runs the checkout's code)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from debugagent.tools.registry import Runner
from debugagent.tools.units import plain

from ..stats import bisect_step, culprit_confidence

if TYPE_CHECKING:
    from ..facts import LabFacts
    from .lab import Lab

BISECT_STEP_MOST = 5


def bisect(lab: Lab, r: Runner, wt: str, bench_cwd: str, facts: LabFacts, good_sha: str, bad: list[float],
           good_vals: list[float], restart: bool) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The first bad commit between ``good_sha`` and HEAD (with its confidence), and the steps that found it."""
    o = r.call("git_range", {"repo": facts.repo_path, "good": good_sha, "bad": facts.repo_head},
               why="the commits to bisect, oldest first")
    if not o.ok:
        return None, []
    rng = [c.model_dump() for c in o.output.commits]  # oldest -> newest, all after good
    if len(rng) <= 1:
        return (dict(rng[0]) if rng else None), []
    lo, hi = -1, len(rng) - 1  # rng[hi] is bad (HEAD); index lo is good
    steps: list[dict[str, Any]] = []
    seen: dict[int, list[float]] = {}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = rng[mid]
        o = r.call("git_worktree_checkout", {"path": wt, "commit": c["sha"]}, why=f"bisect: try {c['short']}")
        if not o.ok:
            break
        if restart:
            lab.server.start_again(r, why=f"bisect: restart the server on the code of {c['short']}")
        vals: list[float] = []
        st = None
        while st is None or st.outcome == "more":
            v = lab.bench(r, bench_cwd, f"bisect at {c['short']}")
            lab.check_connection(r)
            if v is None:
                break
            vals.append(v)
            st = bisect_step(good_vals, bad, vals, final=len(vals) >= BISECT_STEP_MOST)
        if not vals or st is None:
            break
        is_bad = st.outcome == "bad"
        seen[mid] = vals
        steps.append({"sha": c["sha"], "mean": st.mean, "bad": is_bad, "runs": len(vals),
                      "confidence": round(st.confidence, 4)})
        lab.emit("experiment", phase="bisect", text=f"{c['short']} \"{c['subject']}\": mean {plain(st.mean, 4)} over "
                 f"{len(vals)} run(s) -> {'bad' if is_bad else 'good'} (confidence {st.confidence:.3f})")
        if is_bad:
            hi = mid
        else:
            lo = mid
    # the culprit against its parent, both as measured (the ends are the reverted commit and HEAD)
    ends = tuple(g for g, measured in ((good_vals, lo in seen), (bad, hi in seen)) if measured)   # not counted twice
    conf = culprit_confidence(seen.get(lo, good_vals), seen.get(hi, bad), lab.lower, (*ends, *lab.noise))
    step_conf = min([s["confidence"] for s in steps] or [1.0])
    return dict(rng[hi], confidence=round(min(conf, step_conf), 4)), steps
