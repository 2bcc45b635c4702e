"""Experiments: change one thing on the host, measure, and put it back.

Every experiment records its undo step in the transcript *before* it acts, keeps it on
an undo stack, and undoes it in a ``finally`` (so an error or Ctrl-C restores the
host too). The user's working tree is never touched: code experiments use a
``git worktree`` of debugagent's own.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.registry import Runner

from .stats import bisect_step, culprit_confidence, decide, pooled_sd, run_budget

BISECT_STEP_MOST = 5


@dataclass
class UndoStep:
    tool: str
    input: dict[str, Any]
    text: str


@dataclass
class UndoStack:
    """Steps that put the host back, newest last; mirrored to ``undo.json`` in the run folder."""

    path: Path
    steps: list[UndoStep] = field(default_factory=list)

    def push(self, step: UndoStep) -> None:
        self.steps.append(step)
        self._save()

    def pop(self) -> UndoStep | None:
        step = self.steps.pop() if self.steps else None
        self._save()
        return step

    def _save(self) -> None:
        self.path.write_text(json.dumps([s.__dict__ for s in self.steps], indent=1))


class ExperimentError(Exception):
    """An experiment could not be applied (its undo has run)."""


class ConnectionLost(ExperimentError):
    """The connection dropped during an experiment (its undo has run; it may run again)."""


@dataclass
class Measure:
    bench: str
    metric: str
    cwd: str | None
    regex: str | None = None
    ready_timeout_s: float = 600.0
    max_runs: int = 8


class Lab:
    """Runs experiments for the graph's experiment node."""

    def __init__(self, runner_for: Callable[[str | None], Runner], emit: Callable[..., None], undo: UndoStack,
                 measure: Measure, run_id: str, lower_is_better: bool) -> None:
        self.runner_for = runner_for
        self.emit = emit
        self.undo = undo
        self.measure_spec = measure
        self.run_id = run_id
        self.lower = lower_is_better
        self.bench_runs = 0
        self._reconnects = 0

    # ------------------------------------------------------------ measuring
    def bench(self, r: Runner, cwd: str | None, why: str) -> float | None:
        m = self.measure_spec
        deadline = time.monotonic() + m.ready_timeout_s
        while True:
            o = r.call("bench", {"cmd": m.bench, "metric": m.metric, "cwd": cwd, "regex": m.regex}, why=why)
            self.bench_runs += 1
            if o.ok:
                return o.output.value
            if time.monotonic() > deadline:
                return None
            time.sleep(min(5.0, max(0.2, m.ready_timeout_s / 100)))

    def _check_connection(self, r: Runner) -> None:
        """A connection re-made mid-experiment: stop, so the host is restored before anything else."""
        now = getattr(r.transport, "reconnects", 0)
        if now != self._reconnects:
            self._reconnects = now
            raise ConnectionLost("the connection was lost and re-made during the experiment; the host is "
                                 "restored first and the experiment runs again")

    def sample(self, r: Runner, cwd: str | None, bad: list[float], regression: float | None, why: str,
               first: int = 2) -> tuple[list[float], Any]:
        """Benchmark the changed state until ``stats.decide`` says cause or not a cause, or the budget ends.

        ``bad`` holds the reference state's runs (the reproduce step's and any re-measured since).
        When the change lives in a worktree (``cwd`` is not the server's own), the reference state
        is still live and is re-measured between the changed state's runs, so drift cannot decide.
        At most ``max_runs`` runs in all (0: a budget from the noise and the regression's size).
        """
        cap = self.measure_spec.max_runs or 0
        interleave = cwd != self.measure_spec.cwd
        ref, vals = list(bad), []
        runs, d = 0, None
        fresh = getattr(self, "fresh_runs", 0)   # the last runs of ``bad`` were measured just before the change
        while True:
            # the budget follows the noise as measured so far (reference and changed state pooled)
            most = run_budget(pooled_sd(ref, vals)[0], regression, len(ref), (cap * 2 // 3 if interleave else cap) or None)
            for _ in range(first if not vals else 1):
                vals.append(self._measured(r, cwd, why))
                runs += 1
            if interleave and (not cap or runs < cap):
                ref.append(self._measured(r, self.measure_spec.cwd, "the reference state (unchanged), between runs"))
                runs += 1
                fresh += 1
            final = len(vals) >= most or bool(cap and runs + (2 if interleave else 1) > cap)
            d = decide(ref, vals, regression, self.lower, final=final, fresh=fresh)
            if d.decided or final:
                break
        self.last_decision = d
        return vals, d

    def _measured(self, r: Runner, cwd: str | None, why: str) -> float:
        v = self.bench(r, cwd, why)
        self._check_connection(r)
        if v is None:
            raise ExperimentError("the benchmark kept failing after the change (see its output above)")
        return v

    # ------------------------------------------------------------ undo
    def do_undo(self, r: Runner) -> list[str]:
        problems = []
        while True:
            step = self.undo.pop()
            if step is None:
                return problems
            self.emit("experiment", phase="undo", text=step.text, tool=step.tool)
            o = r.call(step.tool, step.input, why="undo: " + step.text)
            if not o.ok:
                problems.append(f"{step.text}: {o.error}")
                self.emit("error", message=f"undo failed: {step.text}: {o.error}")

    def push_undo(self, tool: str, inp: dict[str, Any], text: str) -> None:
        step = UndoStep(tool, inp, text)
        self.emit("experiment", phase="undo_recorded", text=text, tool=tool, input=inp)
        self.undo.push(step)

    # ------------------------------------------------------------ kinds
    def run(self, hyp: str, spec: dict[str, Any], facts: dict[str, Any], bad: list[float], regression: float) -> dict[str, Any]:
        r = self.runner_for(hyp)
        self._reconnects = getattr(r.transport, "reconnects", 0)
        kind = spec["kind"]
        body = {"code_revert": self._code, "server_restart": self._server, "restore_baseline_flags": self._server,
                "restore_baseline_env": self._server, "power_limit": self._simple, "governor": self._simple}.get(kind)
        if body is None:
            raise ExperimentError(f"unknown experiment kind {kind}")
        try:
            result = body(r, hyp, spec, facts, bad, regression)
        except BaseException:
            try:
                self.do_undo(r)
            except Exception:  # noqa: BLE001 - the run's restore() retries and reports what is left
                pass
            raise
        self.do_undo(r)
        return result

    def _result(self, spec: dict[str, Any], vals: list[float], d: Any, text: str, **extra: Any) -> dict[str, Any]:
        return {"kind": spec["kind"], "title": spec.get("title", ""), "samples": vals, "mean": statistics.fmean(vals),
                "share": round(d.share, 3), "significant": d.significant, "decision": d.text, "text": text, **extra}

    def _code(self, r: Runner, hyp: str, spec: dict[str, Any], facts: dict[str, Any], bad: list[float], regression: float) -> dict[str, Any]:
        repo = facts["repo"]["path"]
        target = spec.get("to")
        if not target:
            raise ExperimentError("no commit to revert to")
        wt = f"/tmp/debugagent-wt-{self.run_id}"
        self.push_undo("git_worktree_remove", {"repo": repo, "path": wt}, f"remove the worktree {wt}")
        o = r.call("git_worktree_add", {"repo": repo, "path": wt, "commit": target},
                   why=f"a separate checkout of {target[:7]}; {repo} itself is left as it is")
        if not o.ok:
            raise ExperimentError(o.error or "git worktree add failed")
        self.emit("experiment", phase="measure", text=f"benchmark at {target[:7]} in {wt}")
        vals, d = self.sample(r, wt, bad, regression, why=f"the benchmark at {target[:7]}")
        text = f"at {target[:7]} (worktree): {d.text}"
        extra: dict[str, Any] = {"commit": target}
        if d.significant and spec.get("bisect", True):
            culprit, steps = self._bisect(r, wt, facts, target, bad, vals)
            if culprit:
                extra["culprit"] = culprit
                extra["bisect_steps"] = steps
                text += f"; bisect over the range took {len(steps)} steps: first bad commit {culprit['short']} \"{culprit['subject']}\""
        return self._result(spec, vals, d, text, **extra)

    def _bisect(self, r: Runner, wt: str, facts: dict[str, Any], good_sha: str, bad: list[float], good_vals: list[float]):
        o = r.call("git_range", {"repo": facts["repo"]["path"], "good": good_sha, "bad": facts["repo"]["head"]},
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
            vals: list[float] = []
            st = None
            while st is None or st.outcome == "more":
                v = self.bench(r, wt, f"bisect at {c['short']}")
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
            self.emit("experiment", phase="bisect", text=f"{c['short']} \"{c['subject']}\": mean {st.mean:.4g} over "
                      f"{len(vals)} run(s) -> {'bad' if is_bad else 'good'} (confidence {st.confidence:.3f})")
            if is_bad:
                hi = mid
            else:
                lo = mid
        # the culprit against its parent, both as measured (the ends are the reverted commit and HEAD)
        conf = culprit_confidence(seen.get(lo, good_vals), seen.get(hi, bad), self.lower)
        step_conf = min([s["confidence"] for s in steps] or [1.0])
        return dict(rng[hi], confidence=round(min(conf, step_conf), 4)), steps

    def _find_server(self, r: Runner) -> Any:
        fs = r.call("find_servers", why="the server's current pid")
        if not fs.ok or not fs.output.processes:
            raise ExperimentError("the server process is gone")
        sd = r.call("server_details", {"pid": fs.output.processes[0].pid}, why="its command line as it runs now")
        if not sd.ok:
            raise ExperimentError(sd.error or "server_details failed")
        return sd.output

    def _server(self, r: Runner, hyp: str, spec: dict[str, Any], facts: dict[str, Any], bad: list[float], regression: float) -> dict[str, Any]:
        srv = self._find_server(r)
        set_flags = {k: v for k, v in (spec.get("set_flags") or {}).items() if k}
        unset_flags = [f for f in (spec.get("unset_flags") or []) if f]
        set_env = {k: v for k, v in (spec.get("set_env") or {}).items() if k}
        unset_env = [v for v in (spec.get("unset_env") or []) if v]
        if spec["kind"] == "restore_baseline_flags":
            for c in (facts.get("diff") or {}).get("serving_config", []):
                flag = c["path"][len("server.args."):]
                if c["a"] is None:
                    unset_flags.append(flag)
                else:
                    set_flags[flag] = c["a"]
        if spec["kind"] == "restore_baseline_env":
            for c in (facts.get("diff") or {}).get("env_var", []):
                var = c["path"][len("server.env."):]
                if c["a"] is None:
                    unset_env.append(var)
                elif c["a"] != "[REDACTED]":
                    set_env[var] = c["a"]
        argv = edit_argv(srv.argv, set_flags, unset_flags)
        env_file = f"/tmp/debugagent-{self.run_id}-{srv.pid}.env"
        change = "; ".join(filter(None, [
            " ".join(f"--{f} removed" for f in unset_flags), " ".join(f"--{k} {v}" for k, v in set_flags.items()),
            " ".join(f"{v} unset" for v in unset_env), " ".join(f"{k}={v}" for k, v in set_env.items())]))
        self.push_undo("remove_file", {"path": env_file}, f"remove the saved environment {env_file}")
        self.push_undo("restart_server", {"pid": 0, "argv": srv.argv, "cwd": srv.cwd, "env_file": env_file},
                       "restart the server as it was found (same command line, same environment)")
        o = r.call("restart_server", {"pid": srv.pid, "argv": argv, "cwd": srv.cwd, "env_file": env_file,
                                      "unset": unset_env, "set": set_env, "save_env": True}, why=f"restart with {change}")
        if not o.ok:
            raise ExperimentError(o.error or "restart failed")
        self._retarget_restart(o.output.pid)
        vals, d = self.sample(r, facts.get("_bench_cwd"), bad, regression, why=f"the benchmark with {change}")
        return self._result(spec, vals, d, f"with {change}: {d.text}", change=change)

    def _retarget_restart(self, pid: int) -> None:
        """The undo restart must stop the process the experiment started."""
        for s in reversed(self.undo.steps):
            if s.tool == "restart_server":
                s.input = {**s.input, "pid": pid}
                break
        self.undo._save()

    def _simple(self, r: Runner, hyp: str, spec: dict[str, Any], facts: dict[str, Any], bad: list[float], regression: float) -> dict[str, Any]:
        if spec["kind"] == "power_limit":
            gpu = int(float(spec["gpu"]))
            g = next(x for x in facts["gpus"] if x["index"] == gpu)
            watts = float(spec["watts"])
            self.push_undo("set_power_limit", {"gpu": gpu, "watts": g["power_limit"]},
                           f"set GPU {gpu}'s power limit back to {g['power_limit']:.0f} W")
            o = r.call("set_power_limit", {"gpu": gpu, "watts": watts}, why=f"GPU {gpu} power limit {watts:.0f} W")
            change = f"GPU {gpu} power limit {g['power_limit']:.0f} -> {watts:.0f} W"
        else:
            old = facts["host"]["governor"]
            self.push_undo("set_governor", {"governor": old}, f"set the CPU governor back to {old}")
            o = r.call("set_governor", {"governor": spec["governor"]}, why=f"governor {spec['governor']}")
            change = f"CPU governor {old} -> {spec['governor']}"
        if not o.ok:
            raise ExperimentError(o.error or "the change failed")
        vals, d = self.sample(r, facts.get("_bench_cwd"), bad, regression, why=f"the benchmark with {change}")
        return self._result(spec, vals, d, f"with {change}: {d.text}", change=change)


def edit_argv(argv: list[str], set_flags: dict[str, Any], unset: list[str]) -> list[str]:
    """Remove ``--flag [value]`` for each unset flag, replace or append each set flag."""
    out: list[str] = []
    i = 0
    norm = lambda s: s.replace("_", "-")  # noqa: E731
    drop = {norm(f) for f in unset} | {norm(f) for f in set_flags}
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and norm(a[2:].split("=", 1)[0]) in drop:
            if "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
            i += 1
            continue
        out.append(a)
        i += 1
    for k, v in set_flags.items():
        if v is True or v == "True":
            out.append(f"--{k}")
        elif v not in (None, False, ""):
            out += [f"--{k}", str(v)]
    return out
