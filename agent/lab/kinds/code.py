"""``code_revert``: run an older commit of the server's checkout from a ``git worktree`` of debugagent's own
(the user's working tree is never touched): the server restarted from the worktree when it runs the
checkout's code, else the benchmark run there; a recovery is bisected down to its first bad commit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from debugagent.tools.registry import Runner
from pydantic import BaseModel, model_validator

from ..bisect import bisect
from ..errors import ExperimentError
from ..server import ServerRun
from ..spec import ExperimentSpec, FixTemplate, Kind, Text

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab


class CodeRevertSpec(ExperimentSpec):
    kind: Literal["code_revert"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    to: Text | None = None                # the commit (template)
    bisect: bool = True                   # bisect the range if the revert recovers

    @model_validator(mode="after")
    def _needs(self) -> CodeRevertSpec:
        self.needs("to")
        return self


class CodePlan(BaseModel):
    """How a code experiment makes the old code run: restart the server from the worktree, or run the benchmark there."""

    mode: Literal["server", "bench"]
    why: str
    run: ServerRun | None = None


def map_path(path: str | None, repo: str, wt: str) -> str | None:
    """``path`` inside the checkout ``repo`` -> the same place in the worktree ``wt``; None when outside."""
    if not path:
        return None
    r = repo.rstrip("/")
    if path == r:
        return wt
    if path.startswith(r + "/"):
        return wt + path[len(r):]
    return None


def plan_code_run(server: Any, imports: Any, repo: str, wt: str, code_root: str | None,
                  editable: list[str]) -> CodePlan:
    """Where the server gets its code, and so how to make it run the worktree's.

    ``imports`` is ``import_roots``' answer (None if it could not be had: ``editable``, the
    editable installs' folders, stand in). The worktree's folders go first on
    ``PYTHONPATH``, so they win over an editable install; a cwd inside the checkout is
    mapped into the worktree, and so is every argument that is a path inside it.
    """
    if server is None:
        return CodePlan(mode="bench", why="no inference server process was found, so the benchmark is taken to be the "
                        "code itself: it runs in the worktree")
    firsts: list[str] = []
    reasons: list[str] = []
    if code_root:
        m = map_path(code_root.rstrip("/"), repo, wt)
        if m is None:
            raise ExperimentError(f"--code-root {code_root} is not inside the checkout {repo}")
        firsts.append(m)
        reasons.append(f"--code-root {code_root}")
    if imports is not None:
        for mod in imports.modules:
            if mod.root and mod.rel is not None:
                firsts.append(wt + ("/" + mod.rel if mod.rel else ""))
                reasons.append(f"`{mod.module}` is imported from {mod.root} ({mod.how})")
        cwd_rel = imports.cwd_in_repo
    else:
        for e in editable:
            m = map_path(e, repo, wt)
            if m:
                firsts.append(m)
                reasons.append(f"an editable install points at {e}")
        cwd_rel = None
        mc = map_path(server.cwd, repo, wt)
        if mc is not None:
            cwd_rel = mc[len(wt):].lstrip("/")
    cwd = server.cwd
    if cwd_rel is not None:
        cwd = wt + ("/" + cwd_rel if cwd_rel else "")
        reasons.append(f"its working directory {server.cwd} is in the checkout")
    # the interpreter stays (a venv inside the checkout is not in the worktree); files the arguments name move
    argv = list(server.argv[:1]) + [map_path(a, repo, wt) or a for a in server.argv[1:]]
    if argv != list(server.argv):
        reasons.append("its command line names files in the checkout")
    if not reasons:
        return CodePlan(mode="bench", why=f"the server (pid {server.pid}) imports nothing from {repo} (cwd {server.cwd}, "
                        "no PYTHONPATH entry, editable install or --code-root there), so reverting the checkout cannot "
                        "change what it runs; the benchmark runs in the worktree in case it is the code")
    firsts = list(dict.fromkeys(firsts))
    return CodePlan(mode="server", run=ServerRun(argv=argv, cwd=cwd, path_first=firsts),
                    why=f"the server (pid {server.pid}) runs code from the checkout: " + "; ".join(reasons)
                    + f". It is restarted from the worktree with {':'.join(firsts) or 'its cwd'} first on PYTHONPATH")


# the first bad commit bisection named (the cause's ``culprit``), reverted on the checkout's branch; without one, the
# commit that measured good on a branch of its own (never a detached HEAD); then the server restarted on that code
CULPRIT = "{% set c = cause.culprit %}{% set good = experiment.spec.to %}"
FIX = FixTemplate(
    text=CULPRIT + "{% if c and c.sha %}Revert the first bad commit {{ c.short or c.sha[:7] }} \"{{ c.subject }}\" on "
         "{{ ('the branch ' ~ branch) if branch else \"the checkout's branch\" }} in {{ repo }} (a new commit; history "
         "is kept), then restart the server{% if server.pid %} (stop pid {{ server.pid }} first){% endif %}:"
         "{% elif good %}Put {{ good[:7] }}, the commit that measured good, on a branch of its own (debugagent-good) in "
         "{{ repo }}, then restart the server{% if server.pid %} (stop pid {{ server.pid }} first){% endif %}:{% endif %}",
    commands=[CULPRIT + "{% if c and c.sha %}git -C {{ repo | quote }} revert --no-edit {{ c.sha | quote }}{% elif good "
              "%}git -C {{ repo | quote }} switch -c debugagent-good {{ good | quote }}{% endif %}",
              CULPRIT + "{% if (c and c.sha or good) and server.argv %}{{ restart_line(server.argv) }}{% endif %}"])


class CodeRevert(Kind):
    spec = CodeRevertSpec
    restarts = True   # when a server runs the code
    fix = FIX

    @classmethod
    def evidence_rank(cls, spec: dict[str, Any], baseline_head: str | None) -> int:
        """A revert to the baseline snapshot's commit is a measured difference; to where the reflog says HEAD was,
        other evidence (the checkout moved, which need not be what slowed it)."""
        return 0 if baseline_head and spec.get("to") == baseline_head else 1

    def plan(self, lab: Lab, r: Runner, repo: str, wt: str, facts: LabFacts) -> tuple[Any, CodePlan]:
        srv = lab.server.find_or_none(r)
        editable = [p.editable for p in facts.packages.values() if p.editable]
        imports = None
        python = (srv.python if srv else None) or lab.setup.python
        if srv is not None and python and srv.pid:   # an offline workload has no process to ask
            entry = srv.entry or ""
            mods = [entry.split(".")[0]] if entry and "/" not in entry and not entry.endswith(".py") else []
            if entry and "/" in entry and not entry.endswith(".py"):   # a console script: its entry point's module
                o = r.call("server_shape", {"pid": srv.pid, "python": python, "cwd": srv.cwd or "/"},
                           why="the module the server's console script runs (where its code is imported from)")
                if o.ok and o.output.module:
                    mods.append(o.output.module.split(".")[0])
            for p in facts.packages.values():
                if p.editable:
                    mods += p.modules[:1]
            mods = list(dict.fromkeys(m for m in mods if m))
            if mods:
                o = r.call("import_roots", {"pid": srv.pid, "python": python, "cwd": srv.cwd or "/", "repo": repo,
                                            "modules": mods},
                           why="where the server's interpreter imports its code from (cwd, PYTHONPATH, .pth, editable finder)")
                imports = o.output if o.ok else None
        return srv, plan_code_run(srv, imports, repo, wt, lab.setup.code_root, editable)

    def apply(self, lab: Lab, r: Runner, spec: CodeRevertSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        repo = facts.repo_path
        if not repo:
            raise ExperimentError("no git checkout was found on the host, so there is no commit to revert")
        target = spec.to
        if not target:
            raise ExperimentError("no commit to revert to")
        wt = f"/tmp/debugagent-wt-{lab.run_id}"
        srv, plan = self.plan(lab, r, repo, wt, facts)
        lab.emit("experiment", phase="plan", text=("restart the server from the worktree: " if plan.mode == "server" else
                                                   "run the benchmark in the worktree: ") + plan.why, mode=plan.mode)
        lab.push_undo("git_worktree_remove", {"repo": repo, "path": wt}, f"remove the worktree {wt}")
        o = r.call("git_worktree_add", {"repo": repo, "path": wt, "commit": target},
                   why=f"a separate checkout of {target[:7]}; {repo} itself is left as it is")
        if not o.ok:
            raise ExperimentError(o.error or "git worktree add failed")
        bench_cwd = map_path(lab.measure_spec.cwd, repo, wt) or wt
        if plan.mode == "server" and plan.run is not None:
            lab.server.start(r, srv, plan.run, f"the code of {target[:7]} (worktree {wt})")
            where = ("the workload run from the worktree" if lab.server.workload is not None
                     else "server restarted from the worktree")
        else:
            where = "benchmark in the worktree"
        lab.emit("experiment", phase="measure", text=f"benchmark at {target[:7]} ({where})")
        vals, d = lab.sample(r, bench_cwd, bad, regression, why=f"the benchmark at {target[:7]}",
                             interleave=plan.mode != "server")
        text = f"at {target[:7]} ({where}): {d.text}"
        extra: dict[str, Any] = {"commit": target, "mode": plan.mode, "plan": plan.why}
        if d.significant and spec.bisect and lab.shadow is None:   # shadow copies are not restarted per commit
            culprit, steps = bisect(lab, r, wt, bench_cwd, facts, target, bad, vals, plan.mode == "server")
            if culprit:
                extra["culprit"] = culprit
                extra["bisect_steps"] = steps
                text += (f"; bisect over the range took {len(steps)} steps"
                         + ("" if plan.mode != "server" else " (the workload run from the worktree at each)"
                            if lab.server.workload is not None else " (the server restarted at each)")
                         + f": first bad commit {culprit['short']} \"{culprit['subject']}\"")
        return lab.result(spec, vals, d, text, **extra)
