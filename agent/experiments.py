"""Experiments: change one thing on the host, measure, and put it back.

Every experiment journals its undo step (``agent/journal.py``: in the run folder and on
the host, durably) and records it in the transcript *before* it acts, and undoes it in a
``finally`` (so an error, Ctrl-C, SIGTERM or SIGHUP restores the host too); a step is
marked done only once it succeeded. The user's working tree is never touched: code experiments use a
``git worktree`` of debugagent's own.
"""

from __future__ import annotations

import re
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tools import mutate
from tools.discovery import DiscoveryInput
from tools.errors import DebugAgentError, RestoreError
from tools.registry import Runner

from .context import Overrides, Warmth
from .discovery import find_server
from .facts import LabFacts
from .journal import Journal
from .markdown import plural
from .playbook import restored
from .results import ExperimentResult
from .stats import (
    AUTO_CAP,
    CONTROL_LEVEL,
    CONTROL_RUNS,
    PROMISING,
    bisect_step,
    control,
    culprit_confidence,
    decide,
    noise_sd,
    pooled_sd,
    run_budget,
)

BISECT_STEP_MOST = 5
# the experiment kinds that restart the server (a code revert does when a server runs the code)
RESTART_KINDS = ("code_revert", "server_restart", "restore_baseline_flags", "restore_baseline_env", "package_restore")
# the kinds that re-measure the reference state just before the change (a package restore only when no server runs):
# the others restart the server and are controlled by the server as found, restarted after them, or run the benchmark
# in a worktree between runs of the unchanged state
FRESH_KINDS = ("power_limit", "governor", "package_restore")


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


class LabSetup(BaseModel):
    """What experiments need to know about the host beyond the facts: the run's overrides and the host profile."""

    model_config = ConfigDict(extra="forbid")
    server_pattern: str | None = None
    python: str | None = None
    code_root: str | None = None
    wheelhouse: list[str] = Field(default_factory=list)
    restart_cmd: str | None = None
    health_url: str | None = None
    ready_line: str | None = None

    @classmethod
    def from_inputs(cls, overrides: Overrides, profile: dict[str, Any] | None) -> LabSetup:
        """Flags (``context.Overrides``) win over the host profile (``/etc/debugagent/host.json``)."""
        pr = profile or {}
        wh = [w for w in [overrides.wheelhouse, pr.get("wheelhouse")] if w]
        return cls(server_pattern=overrides.server_pattern, python=overrides.python,
                   code_root=overrides.code_root or pr.get("code_root"), wheelhouse=[str(w) for w in wh],
                   restart_cmd=overrides.restart_cmd or pr.get("restart_cmd"),
                   health_url=pr.get("health_url"), ready_line=pr.get("ready_line"))


class ServerRun(BaseModel):
    """How to start the server for an experiment: its command line, folder, and what changes in its environment."""

    argv: list[str]
    cwd: str
    set: dict[str, str] = Field(default_factory=dict)
    unset: list[str] = Field(default_factory=list)
    path_first: list[str] = Field(default_factory=list)


class CodePlan(BaseModel):
    """How a code experiment makes the old code run: restart the server from the worktree, or run the benchmark there."""

    mode: Literal["server", "bench"]
    why: str
    run: ServerRun | None = None


class PackageTarget(BaseModel):
    """A distribution to put back: the build the baseline had (``build`` None: any build other than the current)."""

    name: str
    version: str
    build: str | None = None
    current_version: str | None = None
    current_build: str | None = None


# ---------------------------------------------------------------- pure helpers
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


def package_targets(facts: LabFacts, spec: dict[str, Any]) -> list[PackageTarget]:
    """The builds to put back: every compiled dependency that differs from the baseline snapshot, or ``spec['package']``."""
    by_norm = {n.lower().replace("_", "-"): p for n, p in facts.packages.items()}
    out: dict[str, PackageTarget] = {}
    for c in restored(spec, facts.changes):
        parts = c.path.split(".")
        if len(parts) < 3 or c.a is None:
            continue  # a package the baseline did not have: nothing to put back
        name, what = parts[1], parts[2]
        cur = by_norm.get(name.lower().replace("_", "-"))
        t = out.get(name) or PackageTarget(name=name, version=cur.version if cur else "",
                                           current_version=cur.version if cur else None,
                                           current_build=cur.build_hash if cur else None)
        if what == "version":
            t.version = str(c.a)
        elif what == "build":
            t.build = str(c.a)
        out[name] = t
    want = (spec.get("package") or "").strip()
    if want:
        hit = [t for n, t in out.items() if n.lower().replace("_", "-") == want.lower().replace("_", "-")]
        if hit:
            return hit
        cur = by_norm.get(want.lower().replace("_", "-"))
        if cur is None:
            return []
        return [PackageTarget(name=cur.name, version=cur.version, current_version=cur.version,
                              current_build=cur.build_hash)]
    return list(out.values())


def build_matches(t: PackageTarget, version: str | None, build: str | None) -> bool:
    """Is an installed candidate the build ``t`` asks for?"""
    if version != t.version:
        return False
    if t.build is not None:
        return build == t.build
    return t.current_version != version or build != t.current_build


class Lab:
    """Runs experiments for the graph's experiment node."""

    def __init__(self, runner_for: Callable[[str | None], Runner], emit: Callable[..., None], undo: Journal,
                 measure: Measure, run_id: str, lower_is_better: bool, setup: LabSetup | None = None,
                 warmth: Warmth | None = None, found_restarted: list[float] | None = None) -> None:
        self.runner_for = runner_for
        # the runs of the server as found, restarted, that earlier controls of this run measured; added to here
        self.found_restarted = found_restarted if found_restarted is not None else []
        self.warmth = warmth or Warmth()
        self.warmups = 0   # warm-up runs after a restart: counted in ``bench_runs``, never a sample
        self._warm_value: float | None = None   # the first warm-up's value, until the runs after it judge it
        self.emit = emit
        self.undo = undo
        self.measure_spec = measure
        self.run_id = run_id
        self.lower = lower_is_better
        self.setup = setup or LabSetup()
        self.bench_runs = 0
        self._reconnects = 0
        self._runs_at_start = 0
        # the reference re-measured just before the change: ``fresh_runs`` runs asked of ``remeasure``, once
        self.fresh_runs = 0
        self.remeasure: Callable[[], list[float]] = lambda: []
        self._remeasured = False
        self._found_again: dict[str, Any] | None = None
        self._started: dict[str, Any] | None = None  # the server this experiment started: how to start it again
        self.last_decision: Any = None   # the experiment's decision (``stats.Decision``), as the control leaves it
        self.discovery: Any = None  # the run's discovery input (its overrides, the server found earlier); set by the graph
        # runs of the same benchmark on the baseline (the baseline snapshot's): they add to the estimate of the noise
        self.noise: tuple[list[float], ...] = ()

    # ------------------------------------------------------------ measuring
    def bench(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None) -> float | None:
        """One benchmark value; while it fails (a server still starting) it is retried until --ready-timeout.
        The first run after a restart is a warm-up (its value is reported, never used): a fresh server's first
        requests pay for loading kernels and building caches, and one such run among a handful decides nothing
        but noise (on an H200 the first run after a restart read 1396 tok/s against 1600 to 2300 after it)."""
        if self.warmth.cold:
            self.warmth.cold = False
            if self.warmth.needed is not False:
                self.warmups += 1
                w = self._bench_once(r, cwd, f"warm-up of the restarted server, not counted; then {why}", env)
                self._warm_value = w if self.warmth.needed is None else None
        return self._bench_once(r, cwd, why, env)

    def restarted(self) -> None:
        """The server was (re)started: the next benchmark run warms it up (if this server needs that)."""
        self.warmth.cold = True
        self._warm_value = None

    def judge_warm_up(self, following: list[float], reference: list[float]) -> None:
        """Was the first warm-up run of this diagnosis slower than the runs of the same state after it? By more
        than the noise (one SD, pooled with the reference state's runs): the server is cold after a restart and
        every restart is warmed up. Not: it needs no warm-up, and later restarts go without one. Judged once."""
        w, self._warm_value = self._warm_value, None
        if w is None or self.warmth.needed is not None or not following or len(following) + len(reference) < 3:
            return
        m = statistics.fmean(following)
        sd = max(pooled_sd(following, reference)[0], 1e-9 * abs(m))
        worse = (w - m) if self.lower else (m - w)
        self.warmth.needed = worse > sd
        self.emit("experiment", phase="warm_up", needed=self.warmth.needed, text=(
            f"the warm-up run read {w:.4g} against {m:.4g} ± {sd:.2g} over the {len(following)} runs after it: "
            + (f"worse by {worse:.3g}, more than the noise, so this server is slow on its first run after a restart "
               f"and every restart is warmed up" if self.warmth.needed else
               ("within the noise" if worse > 0 else "no slower than the runs after it")
               + ", so this server is not slow on its first run after a restart, and later restarts are not warmed up")))

    def _bench_once(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None) -> float | None:
        m = self.measure_spec
        started = time.monotonic()
        deadline = started + m.ready_timeout_s
        attempt = 0
        said = started
        while True:
            o = r.call("bench", {"cmd": m.bench, "metric": m.metric, "cwd": cwd, "regex": m.regex, "env": env or {}}, why=why)
            self.bench_runs += 1
            if o.ok:
                return o.output.value
            now = time.monotonic()
            if now > deadline:
                return None
            self._check_alive(r)
            if now - said >= 5 or attempt == 0:
                said = now
                self.emit("experiment", phase="wait", text=f"waiting for the benchmark to pass (the server may still be "
                          f"starting): {now - started:.0f} s of {m.ready_timeout_s:.0f} s (--ready-timeout)")
            time.sleep(min(5.0, 0.25 * 2 ** attempt, max(0.05, deadline - now)))
            attempt += 1

    def _check_alive(self, r: Runner) -> None:
        """A failing benchmark after a restart: if the server this experiment started has exited, say so now."""
        pid = (self._started or {}).get("pid")
        if not pid or "hook" in (self._started or {}):  # under a hook, a supervisor may replace it: not ours to judge
            return
        o = r.call("server_ready", {"pid": pid}, why="is the restarted server still running?")
        if o.ok and o.output.state == "dead":
            log = (self._started or {}).get("log")
            raise ExperimentError(f"the restarted server (pid {pid}) exited" + (f"; its output is in {log}" if log else ""))

    def _check_connection(self, r: Runner) -> None:
        """A connection re-made mid-experiment: stop, so the host is restored before anything else."""
        now = r.transport.reconnects
        if now != self._reconnects:
            self._reconnects = now
            raise ConnectionLost("the connection was lost and re-made during the experiment; the host is "
                                 "restored first and the experiment runs again")

    def sample(self, r: Runner, cwd: str | None, bad: list[float], regression: float | None, why: str,
               first: int = 2, env: dict[str, str] | None = None, interleave: bool = False) -> tuple[list[float], Any]:
        """Benchmark the changed state until ``stats.decide`` says cause or not a cause, or the budget ends.

        ``bad`` holds the reference state's runs (the reproduce step's and any re-measured since).
        With ``interleave`` (the change lives in a worktree the benchmark runs in, while the server
        and the checkout stay as found), the reference state is still live and is re-measured
        between the changed state's runs, so drift cannot decide. After a restart it is not:
        the reference runs then come from before the change.
        At most ``max_runs`` runs in all (0: a budget from the noise and the regression's size).
        """
        cap = self.measure_spec.max_runs or 0
        ref, vals = list(bad), []
        runs, d = 0, None
        if not self.warmth.cold:   # a warm-up taken before this state (the reference's) is not judged by its runs
            self._warm_value = None
        fresh = self.fresh_runs if self._remeasured else 0   # the last runs of ``bad`` were measured just before the change
        limit = (cap * 2 // 3 if interleave else cap) or None
        extended = False
        w0 = self.warmups
        if cap and self.warmth.due:   # the warm-up after the restart counts toward --max-runs too
            first = max(1, min(first, cap - 1))
        while True:
            # the budget follows the noise as measured so far (reference and changed state pooled); a partial
            # cause still taking shape at the budget (p < PROMISING) runs on to the cap instead
            most = (limit or AUTO_CAP) if extended else run_budget(noise_sd(ref, vals, self.noise)[0], regression, len(ref), limit)
            for _ in range(first if not vals else 1):
                vals.append(self._measured(r, cwd, why, env))
                runs += 1
            if interleave and (not cap or runs < cap):
                ref.append(self._measured(r, self.measure_spec.cwd, "the reference state (unchanged), between runs"))
                runs += 1
                fresh += 1
            capped = bool(cap and runs + (self.warmups - w0) + (2 if interleave else 1) > cap)
            final = len(vals) >= most or capped
            d = decide(ref, vals, regression, self.lower, final=final, fresh=fresh, noise=self.noise)
            if final and not d.decided and not capped and not extended and d.p < PROMISING \
                    and len(vals) < (limit or AUTO_CAP):
                extended = True
                continue
            if d.decided or final:
                break
        self.judge_warm_up(vals, bad)
        self.last_decision = d
        return vals, d

    def _measured(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None) -> float:
        v = self.bench(r, cwd, why, env)
        self._check_connection(r)
        if v is None:
            raise ExperimentError("the benchmark kept failing after the change (see its output above)")
        return v

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
            if isinstance(o.output, mutate.Restarted) and o.output.pid:   # the server as found, started again
                self._found_again = {"pid": o.output.pid, "log": o.output.log}
                if not o.output.already_running:
                    self.restarted()
            elif step.tool == "restart_hook":
                self.restarted()
        return []

    def reference(self, bad: list[float]) -> None:
        """Add to ``bad`` (the reference state's runs) the runs re-measured just before the change, once."""
        if not self._remeasured:
            self._remeasured = True
            got = self.remeasure()
            bad.extend(got)
            self.fresh_runs = len(got)   # asked for ``fresh_runs``; a failed run gives none
            self._runs_at_start = self.bench_runs   # --max-runs counts the experiment's runs from the change on

    def push_undo(self, tool: str, inp: dict[str, Any], text: str) -> None:
        """Journal an undo step before the change it undoes; nothing is changed if that fails."""
        self.emit("experiment", phase="undo_recorded", text=text, tool=tool, input=inp)
        try:
            self.undo.record(tool, inp, text)
        except OSError as exc:
            raise ExperimentError(f"the undo step could not be journalled ({exc}); nothing was changed") from exc

    # ------------------------------------------------------------ kinds
    def run(self, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
            regression: float | None) -> ExperimentResult:
        r = self.runner_for(hyp)
        self._reconnects = r.transport.reconnects
        self._started = None
        self._found_again: dict[str, Any] | None = None
        self._runs_at_start = self.bench_runs
        kind = spec["kind"]
        body = {"code_revert": self._code, "server_restart": self._server, "restore_baseline_flags": self._server,
                "restore_baseline_env": self._server, "power_limit": self._simple, "governor": self._simple,
                "package_restore": self._package}.get(kind)
        if body is None:
            raise ExperimentError(f"unknown experiment kind {kind}")
        try:
            if kind in FRESH_KINDS and kind != "package_restore":   # that one first looks for a build to install
                self.reference(bad)
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
        if self._started is not None and result.significant:
            result = self._control(r, facts, result, bad, regression)
        return result

    def _control(self, r: Runner, facts: LabFacts, result: ExperimentResult, bad: list[float],
                 regression: float | None) -> ExperimentResult:
        """A restart recovered the regression: was it the change, or the restart itself? A server that slows
        down while it runs (a cache that grows, fragmented memory, a leak) is fast again after any restart, so
        the experiment's server is compared with the server as found, restarted by the undo just now and
        measured the same way: what part of the change's recovery a plain restart also gives, with its interval.
        The change stays a cause when that part is surely below half, is not one when it is surely above half
        (the restart did it), and is undecided in between after the most control runs. These runs are also the
        reference re-measured after the change (``stats.control``), so none is taken before it."""
        vals = result.samples
        cap = self.measure_spec.max_runs or 0
        # --max-runs counts every benchmark run of the experiment, the control's included
        left = cap - (self.bench_runs - self._runs_at_start) if cap else CONTROL_RUNS[1]
        if cap and self.warmth.due:   # the restarted server's warm-up run comes first, and counts
            left -= 1
        earlier = list(self.found_restarted)
        n = max(min(CONTROL_RUNS[0], left), len(earlier))
        if n < 1:
            return result.model_copy(update={"text": f"{result.text}; not compared with a plain restart of the server "
                                             f"as found (--max-runs {cap} left no runs for that control)"})
        most = max(n, min(CONTROL_RUNS[1], len(earlier) + left))
        self.emit("experiment", phase="plan", text=(
            f"control: the server as found, restarted, as an earlier control measured it ({plural(len(earlier), 'run')}), "
            f"measured again after this undo only while that does not decide (at most {most} runs in all)" if earlier
            else f"control: the server as found, restarted by the undo, is measured {n} to {most} times, so that what "
            "a plain restart recovers is not taken for the change's effect"))
        # the server the experiment started is gone (the undo stopped it): while the benchmark waits for the one
        # the undo started, that one is watched instead (under a hook, none is: a supervisor may replace it)
        self._started = self._found_again
        ctrl: list[float] = list(earlier)
        while True:   # sequential, as the experiment itself: more runs while the restart's part is unclear
            while len(ctrl) < n:
                ctrl.append(self._measured(r, self.measure_spec.cwd,
                                           f"control: the server as found, restarted (run {len(ctrl) + 1})"))
                self.found_restarted.append(ctrl[-1])
            final = n >= most
            c = control(bad, ctrl, vals, regression, self.lower, final=final, noise=self.noise)
            if c.outcome != "more":
                break
            n += 1
        self.judge_warm_up(ctrl[len(earlier):], bad)
        runs = plural(len(ctrl), "run")
        if earlier:
            runs += (", measured after an earlier experiment's undo" if len(ctrl) == len(earlier) else
                     f", {len(earlier)} of them measured after an earlier experiment's undo")
        said = (f"control: the server as found, restarted, gives mean {statistics.fmean(ctrl):.4g} ({runs}): "
                f"a plain restart recovers {c.part:.0%} of what the change did ({2 * CONTROL_LEVEL - 1:.0%} CI "
                f"{c.low:.0%} to {c.high:.0%})")
        if c.outcome == "change":
            return result.model_copy(update={"control": ctrl, "text": f"{result.text}; {said}, so the restart alone "
                                             "does not explain it"})
        d = c.decision
        assert d is not None
        if c.outcome == "beyond":   # part of it may be the restart's, but the change does better than a plain restart
            d = d.model_copy(update={"outcome": "cause"})
            self.last_decision = d   # the share is the change's over the restarted server as found
            return result.model_copy(update={"control": ctrl, "share": round(d.share, 3), "share_ci": None,
                                             "decision": d.text, "text": f"{result.text}; {said}, and the change "
                                             f"beats the restarted server ({d.text}), so it is a cause by that much"})
        if c.outcome == "restart":
            d = d.model_copy(update={"outcome": "not_cause"})
            why = ("so the restart, not the change, recovered it: the server slows down while it runs, or the "
                   "reproduce step's runs were slower than the server as found is now")
        else:
            d = d.model_copy(update={"outcome": "more"})
            why = "so what the change adds to a plain restart is undecided"
        self.last_decision = d   # the outcome and the share are the change's over the restarted server as found
        return result.model_copy(update={"control": ctrl, "significant": False, "outcome": d.outcome,
                                         "share": round(d.share, 3), "share_ci": None, "decision": why,
                                         "text": f"{result.text}; {said}, {why}"})

    def _result(self, spec: dict[str, Any], vals: list[float], d: Any, text: str, **extra: Any) -> ExperimentResult:
        return ExperimentResult(kind=spec["kind"], title=spec.get("title", ""), samples=vals, mean=statistics.fmean(vals),
                                share=round(d.share, 3), significant=d.significant, decision=d.text, text=text, **extra)

    # ------------------------------------------------------------ the server: find, check, restart, wait
    def _find_server(self, r: Runner) -> Any:
        """The server as it runs now, found by the run's own discovery (its overrides, the server found earlier)."""
        srv = find_server(r, self.discovery or DiscoveryInput(server_pattern=self.setup.server_pattern))
        if srv is None:
            pat = self.setup.server_pattern
            raise ExperimentError("the server process is gone" + (f" (nothing matches --server-pattern {pat!r})" if pat
                                                                  else " (discovery with the run's own overrides found none)"))
        return srv

    def _hook_hint(self) -> str:
        return ("give --restart-cmd 'CMD' (or \"restart_cmd\" in /etc/debugagent/host.json): debugagent runs it to restart "
                "the server, with the state to start in DEBUGAGENT_ARGV, DEBUGAGENT_CWD, DEBUGAGENT_SET_ENV, "
                "DEBUGAGENT_UNSET_ENV and DEBUGAGENT_PYTHONPATH_FIRST (DEBUGAGENT_PHASE is experiment, then undo)")

    def _start(self, r: Runner, srv: Any, run: ServerRun, change: str) -> int:
        """Restart ``srv`` as ``run`` (its undo journalled first); wait until it is ready; return the new pid."""
        if self.setup.restart_cmd:
            return self._start_by_hook(r, srv, run, change)
        c = r.call("server_control", {"pid": srv.pid}, why="how the server runs: a systemd unit, a container or a "
                   "supervisor would restart or lose it if it were killed")
        if not c.ok:
            raise ExperimentError(c.error or "server_control failed")
        ctl = c.output
        if ctl.kind != "plain":
            what = {"systemd": f"the systemd unit {ctl.unit}", "container": "a container",
                    "supervisor": f"a supervisor (`{ctl.parent}`, pid {ctl.parent_pid})"}[ctl.kind]
            raise ExperimentError(f"the server (pid {srv.pid}) runs under {what} ({ctl.evidence}); debugagent does not "
                                  f"kill it, since that would restart it behind the experiment's back or lose it: "
                                  + self._hook_hint())
        tag = f"{self.run_id}-{srv.pid}"
        env_file, pid_file = f"/tmp/debugagent-{tag}.env", f"/tmp/debugagent-{tag}.pid"
        log = ctl.stdout or mutate.DEFAULT_LOG
        self.push_undo("remove_file", {"path": env_file}, f"remove the saved environment {env_file}")
        self.push_undo("restart_server", {"stop_pid_file": pid_file, "expect_argv": run.argv, "argv": srv.argv,
                                          "cwd": srv.cwd, "env_file": env_file, "keep_if_running": srv.pid, "log": log},
                       "restart the server as it was found (same command line, folder and environment); the process "
                       f"the experiment started (its pid in {pid_file}, checked against its command line) is stopped first, "
                       f"after any restart still under way there; {pid_file} is removed once the server runs as found")
        o = r.call("restart_server", {"pid": srv.pid, "expect_argv": srv.argv, "argv": run.argv, "cwd": run.cwd,
                                      "env_file": env_file, "unset": run.unset, "set": run.set, "path_first": run.path_first,
                                      "save_env": True, "pid_file": pid_file, "log": log},
                   why=f"restart with {change}; output appended to {log if log != mutate.DEFAULT_LOG else 'its log'}")
        if not o.ok:
            raise ExperimentError(o.error or "restart failed")
        self._started = {"run": run, "pid_file": pid_file, "env_file": env_file, "log": o.output.log or log,
                         "change": change, "pid": o.output.pid}
        self.restarted()
        self._wait_ready(r, o.output.pid, o.output.log, o.output.log_size)
        return o.output.pid

    def _start_again(self, r: Runner, why: str) -> int:
        """Restart the server this experiment started (a bisection step): same command line, new code under it."""
        st = self._started
        if st is None:
            raise ExperimentError("no experiment server to restart")
        run: ServerRun = st["run"]
        if "hook" in st:
            return self._start_by_hook(r, None, run, st["change"], again=True)
        o = r.call("restart_server", {"stop_pid_file": st["pid_file"], "expect_argv": run.argv, "argv": run.argv,
                                      "cwd": run.cwd, "env_file": st["env_file"], "unset": run.unset, "set": run.set,
                                      "path_first": run.path_first, "pid_file": st["pid_file"], "log": st["log"]}, why=why)
        if not o.ok:
            raise ExperimentError(o.error or "restart failed")
        st["pid"] = o.output.pid
        self.restarted()
        self._wait_ready(r, o.output.pid, o.output.log, o.output.log_size)
        return o.output.pid

    def _start_by_hook(self, r: Runner, srv: Any, run: ServerRun, change: str, again: bool = False) -> int:
        cmd = self.setup.restart_cmd or ""
        if not again:
            self.push_undo("restart_hook", {"cmd": cmd, "phase": "undo", "argv": srv.argv, "cwd": srv.cwd},
                           f"restart the server as it was found, by the restart hook `{cmd}`")
            self._started = {"run": run, "hook": cmd, "change": change}
        old = srv.pid if srv else int(self._started.get("pid") or 0) if self._started else 0
        o = r.call("restart_hook", {"cmd": cmd, "phase": "experiment", "pid": old, "argv": run.argv,
                                    "cwd": run.cwd, "set": run.set, "unset": run.unset, "path_first": run.path_first},
                   why=f"restart with {change}, by the restart hook")
        if not o.ok:
            raise ExperimentError(o.error or "the restart hook failed")
        self.restarted()
        new = self._await_new_server(r, old)
        if self._started is not None:
            self._started["pid"] = new
        self._wait_ready(r, new, None, 0)
        return new

    def _poll(self, probe: Callable[[float], Any], waiting: Callable[[float], str], too_long: str) -> Any:
        """``probe(elapsed)`` every 0.5 s until it returns something, with a progress line every 5 s;
        ``ExperimentError(too_long)`` after ``--ready-timeout``."""
        limit = self.measure_spec.ready_timeout_s
        started = said = time.monotonic()
        while True:
            got = probe(time.monotonic() - started)
            if got is not None:
                return got
            now = time.monotonic()
            if now - started > limit:
                raise ExperimentError(too_long)
            if now - said >= 5:
                said = now
                self.emit("experiment", phase="wait", text=waiting(now - started))
            time.sleep(0.5)

    def _await_new_server(self, r: Runner, old: int) -> int:
        """After a hook: the server process that replaced ``old`` (a hook may return before its service restarts)."""
        def probe(elapsed: float) -> int | None:
            try:
                srv = self._find_server(r)
            except ExperimentError:
                return None
            return srv.pid if srv.pid != old else None
        limit = self.measure_spec.ready_timeout_s
        return self._poll(probe, lambda t: f"waiting for the restarted server: {t:.0f} s of {limit:.0f} s",
                          f"no new server process appeared within {self.measure_spec.ready_timeout_s:.0f} s of the "
                          "restart hook (give a longer --ready-timeout, or check the hook)")

    def _wait_ready(self, r: Runner, pid: int, log: str | None, offset: int) -> None:
        """By the host profile's health URL or log line; without either, the benchmark's retries wait."""
        url, line = self.setup.health_url, self.setup.ready_line
        if not url and not line:
            self.emit("experiment", phase="wait", text=f"server pid {pid} started; readiness is judged by the benchmark "
                      "(no health_url or ready_line in the host profile)")
            return
        what = f"{url} answers" if url else f"`{line}` appears in {log}"

        def probe(elapsed: float) -> bool | None:
            o = r.call("server_ready", {"pid": pid, "url": url, "log": log if not url else None,
                                        "line": line if not url else None, "offset": offset}, why=f"ready when {what}")
            state = o.output.state if o.ok else "waiting"
            if state == "dead":
                raise ExperimentError(f"the server (pid {pid}) exited while starting" + (f"; its log is {log}" if log else ""))
            if state != "ready":
                return None
            self.emit("experiment", phase="wait", text=f"server pid {pid} is ready ({what}) after {elapsed:.1f} s")
            return True
        limit = self.measure_spec.ready_timeout_s
        self._poll(probe, lambda t: f"waiting for server pid {pid}: {t:.0f} s of {limit:.0f} s (until {what})",
                   f"the server (pid {pid}) was not ready after {self.measure_spec.ready_timeout_s:.0f} s "
                   f"(waiting until {what}); give a longer --ready-timeout")

    # ------------------------------------------------------------ code
    def _code_plan(self, r: Runner, repo: str, wt: str, facts: LabFacts) -> tuple[Any, CodePlan]:
        try:
            srv = self._find_server(r)
        except ExperimentError:
            srv = None
        editable = [p.editable for p in facts.packages.values() if p.editable]
        imports = None
        python = (srv.python if srv else None) or self.setup.python
        if srv is not None and python:
            mods = [m for m in [srv.entry.split(".")[0] if srv.entry and not srv.entry.endswith(".py") else ""] if m]
            for p in facts.packages.values():
                if p.editable:
                    mods += p.modules[:1]
            mods = list(dict.fromkeys(m for m in mods if m))
            if mods:
                o = r.call("import_roots", {"pid": srv.pid, "python": python, "cwd": srv.cwd or "/", "repo": repo,
                                            "modules": mods},
                           why="where the server's interpreter imports its code from (cwd, PYTHONPATH, .pth, editable finder)")
                imports = o.output if o.ok else None
        return srv, plan_code_run(srv, imports, repo, wt, self.setup.code_root, editable)

    def _code(self, r: Runner, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        repo = facts.repo_path
        if not repo:
            raise ExperimentError("no git checkout was found on the host, so there is no commit to revert")
        target = spec.get("to")
        if not target:
            raise ExperimentError("no commit to revert to")
        wt = f"/tmp/debugagent-wt-{self.run_id}"
        srv, plan = self._code_plan(r, repo, wt, facts)
        self.emit("experiment", phase="plan", text=("restart the server from the worktree: " if plan.mode == "server" else
                                                    "run the benchmark in the worktree: ") + plan.why, mode=plan.mode)
        self.push_undo("git_worktree_remove", {"repo": repo, "path": wt}, f"remove the worktree {wt}")
        o = r.call("git_worktree_add", {"repo": repo, "path": wt, "commit": target},
                   why=f"a separate checkout of {target[:7]}; {repo} itself is left as it is")
        if not o.ok:
            raise ExperimentError(o.error or "git worktree add failed")
        bench_cwd = map_path(self.measure_spec.cwd, repo, wt) or wt
        if plan.mode == "server" and plan.run is not None:
            self._start(r, srv, plan.run, f"the code of {target[:7]} (worktree {wt})")
            where = "server restarted from the worktree"
        else:
            where = "benchmark in the worktree"
        self.emit("experiment", phase="measure", text=f"benchmark at {target[:7]} ({where})")
        vals, d = self.sample(r, bench_cwd, bad, regression, why=f"the benchmark at {target[:7]}",
                              interleave=plan.mode != "server")
        text = f"at {target[:7]} ({where}): {d.text}"
        extra: dict[str, Any] = {"commit": target, "mode": plan.mode, "plan": plan.why}
        if d.significant and spec.get("bisect", True):
            culprit, steps = self._bisect(r, wt, bench_cwd, facts, target, bad, vals, plan.mode == "server")
            if culprit:
                extra["culprit"] = culprit
                extra["bisect_steps"] = steps
                text += (f"; bisect over the range took {len(steps)} steps"
                         + (" (the server restarted at each)" if plan.mode == "server" else "")
                         + f": first bad commit {culprit['short']} \"{culprit['subject']}\"")
        return self._result(spec, vals, d, text, **extra)

    def _bisect(self, r: Runner, wt: str, bench_cwd: str, facts: LabFacts, good_sha: str, bad: list[float],
                good_vals: list[float], restart: bool):
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
                self._start_again(r, why=f"bisect: restart the server on the code of {c['short']}")
            vals: list[float] = []
            st = None
            while st is None or st.outcome == "more":
                v = self.bench(r, bench_cwd, f"bisect at {c['short']}")
                self._check_connection(r)
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
        ends = tuple(g for g, measured in ((good_vals, lo in seen), (bad, hi in seen)) if measured)   # not counted twice
        conf = culprit_confidence(seen.get(lo, good_vals), seen.get(hi, bad), self.lower, (*ends, *self.noise))
        step_conf = min([s["confidence"] for s in steps] or [1.0])
        return dict(rng[hi], confidence=round(min(conf, step_conf), 4)), steps

    # ------------------------------------------------------------ flags and environment
    def _server(self, r: Runner, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
                regression: float | None) -> ExperimentResult:
        srv = self._find_server(r)
        set_flags = {k: v for k, v in (spec.get("set_flags") or {}).items() if k}
        unset_flags = [f for f in (spec.get("unset_flags") or []) if f]
        set_env = {k: v for k, v in (spec.get("set_env") or {}).items() if k}
        unset_env = [v for v in (spec.get("unset_env") or []) if v]
        if spec["kind"] == "restore_baseline_flags":
            for c in restored(spec, facts.changes):
                flag = c.path[len("server.args."):]
                if c.a is None:
                    unset_flags.append(flag)
                else:
                    set_flags[flag] = c.a
        if spec["kind"] == "restore_baseline_env":
            for c in restored(spec, facts.changes):
                var = c.path[len("server.env."):]
                if c.a is None:
                    unset_env.append(var)
                elif c.a != "[REDACTED]":
                    set_env[var] = c.a
        argv = edit_argv(srv.argv, set_flags, unset_flags)
        change = "; ".join(filter(None, [
            " ".join(f"--{f} removed" for f in unset_flags), " ".join(f"--{k} {v}" for k, v in set_flags.items()),
            " ".join(f"{v} unset" for v in unset_env), " ".join(f"{k}={v}" for k, v in set_env.items())]))
        self._start(r, srv, ServerRun(argv=argv, cwd=srv.cwd, set=set_env, unset=unset_env), change)
        vals, d = self.sample(r, self.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        return self._result(spec, vals, d, f"with {change}: {d.text}", change=change)

    # ------------------------------------------------------------ packages
    def _package(self, r: Runner, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
                 regression: float | None) -> ExperimentResult:
        targets = package_targets(facts, spec)
        if not targets:
            raise ExperimentError("no installed package differs from the baseline in a way a build could put back")
        try:
            srv = self._find_server(r)
        except ExperimentError:
            srv = None
        python = self.setup.python or (srv.python if srv else None) or facts.server_python
        if not python:
            raise ExperimentError("the server's Python is unknown, so no build can be installed for it (give --python)")
        root = f"/tmp/debugagent-overlay-{self.run_id}"
        self.push_undo("remove_tree", {"path": root}, f"remove the package overlay {root}")
        found: list[tuple[PackageTarget, str, str]] = []  # target, wheel, overlay folder
        missing: list[PackageTarget] = []
        for t in targets:
            got = self._baseline_build(r, python, t, f"{root}/{re.sub(r'[^A-Za-z0-9_.-]', '_', t.name)}")
            if got:
                found.append((t, *got))
            else:
                missing.append(t)
        want = lambda t: f"{t.name} {t.version}" + (f" (build {t.build})" if t.build else " (another build)")  # noqa: E731
        if not found:
            places = ", ".join(self.setup.wheelhouse) or "no --wheelhouse"
            cmds = "; ".join(f"`{python} -m pip install --no-deps --target {root}/{t.name} {shlex.quote(f'{t.name}=={t.version}')}`"
                             for t in missing)
            raise ExperimentError(f"no wheel of {', '.join(want(t) for t in missing)} was found on the host ({places}, pip's "
                                  f"cache, pip download); to test it: {cmds} (add `--no-index --find-links DIR` for a "
                                  "folder of wheels, or give the .whl), then restart the server with that folder first on "
                                  "PYTHONPATH and benchmark; or run again with --wheelhouse DIR")
        overlays = [o for _, _, o in found]
        change = "the baseline build" + ("s" if len(found) > 1 else "") + " of " + ", ".join(
            f"{t.name} {t.version}" for t, _, _ in found) + f" first on PYTHONPATH ({root})"
        if srv is not None:
            self._start(r, srv, ServerRun(argv=list(srv.argv), cwd=srv.cwd, path_first=overlays), change)
            vals, d = self.sample(r, self.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        else:
            self.emit("experiment", phase="plan", text="no server process was found: the benchmark itself runs with the overlay first on PYTHONPATH")
            self.reference(bad)   # no restart, so no control after it: the reference is re-measured now, before the change
            vals, d = self.sample(r, self.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}",
                                  env={"PYTHONPATH": ":".join(overlays)})
        fix = "; ".join(f"{python} -m pip install --force-reinstall --no-deps {w}" for _, w, _ in found)
        text = f"with {change}: {d.text}"
        if d.significant:
            text += f"; fix: {fix}"
        if missing:
            text += "; not found, so not tested: " + ", ".join(want(t) for t in missing)
        return self._result(spec, vals, d, text, change=change, fix=fix,
                            packages=[{"name": t.name, "version": t.version, "build": t.build, "wheel": w} for t, w, _ in found])

    def _baseline_build(self, r: Runner, python: str, t: PackageTarget, overlay: str) -> tuple[str, str] | None:
        """A wheel of ``t`` on the host, installed into ``overlay`` and checked by hashing its compiled files."""
        o = r.call("find_wheels", {"name": t.name, "version": t.version, "places": self.setup.wheelhouse},
                   why=f"wheels of {t.name} {t.version} on the host: the wheelhouse and pip's cache")
        wheels = o.output.wheels if o.ok else []
        if not wheels:
            dest = f"/tmp/debugagent-dl-{self.run_id}"
            self.push_undo("remove_tree", {"path": dest}, f"remove the downloaded wheels {dest}")
            dl = r.call("pip_download", {"python": python, "name": t.name, "version": t.version, "dest": dest},
                        why=f"{t.name}=={t.version} from the package index, if the host reaches one")
            wheels = dl.output.wheels if dl.ok else []
        for w in wheels:
            inst = r.call("overlay_install", {"python": python, "wheel": w, "overlay": overlay},
                          why=f"install {w.rsplit('/', 1)[-1]} beside the environment (never into it)")
            if not inst.ok:
                continue
            chk = r.call("overlay_packages", {"python": python, "overlay": overlay},
                         why=f"which build of {t.name} the server would see with the overlay first")
            if not chk.ok:
                continue
            p = chk.output.get(t.name)
            if p is not None and build_matches(t, p.version, p.build_hash):
                self.emit("experiment", phase="plan", text=f"{w} is {t.name} {p.version} with compiled files hashing to "
                          f"{p.build_hash}" + (" (the baseline's)" if t.build else f" (installed: {t.current_build})"))
                return w, overlay
        return None

    # ------------------------------------------------------------ power and governor
    def _simple(self, r: Runner, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
                regression: float | None) -> ExperimentResult:
        if spec["kind"] == "power_limit":
            gpu = int(float(spec["gpu"]))
            limit = facts.gpu(gpu).power_limit
            watts = float(spec["watts"])
            self.push_undo("set_power_limit", {"gpu": gpu, "watts": limit},
                           f"set GPU {gpu}'s power limit back to {limit:.0f} W")
            o = r.call("set_power_limit", {"gpu": gpu, "watts": watts}, why=f"GPU {gpu} power limit {watts:.0f} W")
            change = f"GPU {gpu} power limit {limit:.0f} -> {watts:.0f} W"
        else:
            old = facts.governor
            self.push_undo("set_governor", {"governor": old}, f"set the CPU governor back to {old}")
            o = r.call("set_governor", {"governor": spec["governor"]}, why=f"governor {spec['governor']}")
            change = f"CPU governor {old} -> {spec['governor']}"
        if not o.ok:
            raise ExperimentError(o.error or "the change failed")
        vals, d = self.sample(r, self.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
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
