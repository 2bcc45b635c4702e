"""Experiments: change one thing on the host, measure, and put it back.

Every experiment journals its undo step (``agent/journal.py``: in the run folder and on
the host, durably) and records it in the transcript *before* it acts, and undoes it in a
``finally`` (so an error, Ctrl-C, SIGTERM or SIGHUP restores the host too); a step is
marked done only once it succeeded. The user's working tree is never touched: code experiments use a
``git worktree`` of debugagent's own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.errors import DebugAgentError, RestoreError
from tools.registry import Runner

from .journal import Journal
from .stats import decide


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

    def __init__(self, runner_for: Callable[[str | None], Runner], emit: Callable[..., None], undo: Journal,
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

    def sample(self, r: Runner, cwd: str | None, bad: list[float], regression: float, why: str,
               first: int = 3) -> tuple[list[float], Any]:
        most = max(first, self.measure_spec.max_runs)
        vals: list[float] = []
        d = None
        while len(vals) < most:
            need = first if not vals else 2
            for _ in range(need):
                v = self.bench(r, cwd, why)
                self._check_connection(r)
                if v is None:
                    raise ExperimentError("the benchmark kept failing after the change (see its output above)")
                vals.append(v)
            d = decide(bad, vals, regression, self.lower)
            if d.decided:
                break
        return vals, d

    # ------------------------------------------------------------ undo
    def do_undo(self, r: Runner) -> list[str]:
        """Run the journal's pending steps, newest first, each marked done once it succeeded.

        A failed step stays pending (with its error) and stops the undo there: the older
        steps may be what it needs (the saved environment of a restart). A lost connection
        raises with the step still pending. Returns what could not be undone.
        """
        for step in self.undo.pending():
            self.emit("experiment", phase="undo", text=step.text, tool=step.tool, step=step.id)
            o = r.call(step.tool, step.input, why="undo: " + step.text)
            if not o.ok:
                self.undo.mark_failed(step, o.error or "failed")
                self.emit("error", kind="undo", message=f"undo failed: {step.text}: {o.error}")
                return [f"{s.text}" + (f": {s.error}" if s.error else "") for s in self.undo.pending()]
            self.undo.mark_done(step)
        return []

    def push_undo(self, tool: str, inp: dict[str, Any], text: str) -> None:
        """Journal an undo step before the change it undoes; nothing is changed if that fails."""
        self.emit("experiment", phase="undo_recorded", text=text, tool=tool, input=inp)
        try:
            self.undo.record(tool, inp, text)
        except OSError as exc:
            raise ExperimentError(f"the undo step could not be journalled ({exc}); nothing was changed") from exc

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
            try:
                result = body(r, hyp, spec, facts, bad, regression)
            except (ValueError, TypeError, KeyError, StopIteration) as exc:   # a rendered field that does not fit
                raise ExperimentError(f"the experiment's fields do not fit this host ({type(exc).__name__}: {exc}); "
                                      f"check them with `debugagent playbook validate`") from exc
        except BaseException as exc:
            try:
                self.do_undo(r)
            except DebugAgentError as uexc:  # the step stays pending; the run's restore() retries and reports it
                self.emit("error", kind="undo", message=f"undo interrupted: {uexc}")
            if self.undo.steps and isinstance(exc, ExperimentError):
                left = [s.text for s in self.undo.pending()]
                raise RestoreError(f"the experiment failed ({exc}) and the host could not be fully restored; "
                                   f"left: {'; '.join(left)}", left=left) from exc
            raise
        left = self.do_undo(r)
        if left:
            raise RestoreError(f"the host could not be fully restored after the experiment; left: {'; '.join(left)}",
                               left=left)
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
        good_mean, bad_mean = statistics.fmean(good_vals), statistics.fmean(bad)
        mid_line = (good_mean + bad_mean) / 2
        lo, hi = -1, len(rng) - 1  # rng[hi] is bad (HEAD); index lo is good
        steps = []
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = rng[mid]
            o = r.call("git_worktree_checkout", {"path": wt, "commit": c["sha"]}, why=f"bisect: try {c['short']}")
            if not o.ok:
                break
            vals = [v for v in (self.bench(r, wt, f"bisect at {c['short']}") for _ in range(3)) if v is not None]
            if not vals:
                break
            m = statistics.fmean(vals)
            is_bad = (m > mid_line) if self.lower else (m < mid_line)
            steps.append({"sha": c["sha"], "mean": m, "bad": is_bad})
            self.emit("experiment", phase="bisect", text=f"{c['short']} \"{c['subject']}\": mean {m:.4g} -> {'bad' if is_bad else 'good'}")
            if is_bad:
                hi = mid
            else:
                lo = mid
        return dict(rng[hi]), steps

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
        self.push_undo("restart_server", {"pid": srv.pid, "argv": srv.argv, "cwd": srv.cwd, "env_file": env_file},
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
                self.undo.update(s, pid=pid)
                break

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
