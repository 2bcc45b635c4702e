"""Measuring: one benchmark value (retried while a restarted server starts), the warm-up run after a restart,
the reference re-measured before a change, and the sequential sampling of a changed state."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from debugagent.tools.registry import Runner
from debugagent.tools.units import plain

from ..config import READY_TIMEOUT_S
from ..stats import (
    ALPHA_WARM,
    AUTO_CAP,
    FUTILE_Q,
    MIN_BUDGET,
    PROMISING,
    changed_runs_futile,
    decide,
    noise_sd,
    one_reading_p,
    pooled_sd,
    run_budget,
)
from .errors import ExperimentError

if TYPE_CHECKING:
    from ..context import Warmth


@dataclass
class Measure:
    bench: str
    metric: str
    cwd: str | None
    regex: str | None = None
    ready_timeout_s: float = READY_TIMEOUT_S
    max_runs: int = 8
    # the regression's own standard error: the share's interval carries it, so the one interval an experiment's
    # sentence gives is the one the conclusion reports
    regression_se: float = 0.0


def _warmth() -> Warmth:
    from ..context import Warmth  # context imports the playbook, which imports the kinds: not at import time
    return Warmth()


class Bench:
    """The benchmark as the lab runs it, with the counts the run's budget reads (``bench_runs``, ``warmups``).

    ``alive(r)`` is asked between failing runs (has the server the experiment started exited?);
    ``connected(r)`` after each run (was the connection re-made?); both raise to stop the experiment."""

    def __init__(self, measure: Measure, emit: Callable[..., None], lower_is_better: bool, warmth: Warmth | None,
                 noise: tuple[list[float], ...], fresh_runs: int, alive: Callable[[Runner], None],
                 connected: Callable[[Runner], None]) -> None:
        self.spec = measure
        self.emit = emit
        self.lower = lower_is_better
        self.warmth = warmth or _warmth()
        # runs of the same benchmark on the baseline (the baseline snapshot's): they add to the estimate of the noise
        self.noise = noise
        self.alive, self.connected = alive, connected
        self.bench_runs = 0
        self.warmups = 0   # warm-up runs after a restart: counted in ``bench_runs``, never a sample
        self._warm_value: float | None = None   # the first warm-up's value, until the runs after it judge it
        # the reference re-measured just before the change: ``fresh_runs`` runs, once (``reference``)
        self.fresh_runs = fresh_runs
        self.remeasured = False
        self.runs_at_start = 0
        self.last_decision: Any = None   # the experiment's decision (``stats.Decision``), as the control leaves it
        # the last ``sample`` stopped because more runs of the changed state could not decide it against the
        # reference state's few runs (``stats.changed_runs_futile``): more runs of the reference state would
        self.reference_bound = False
        # an offline workload run with an experiment's change (``Server.start``): the changed state's command
        self.changed_cmd: str | None = None

    # ------------------------------------------------------------ one value
    def bench(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None,
              cmd: str | None = None) -> float | None:
        """One benchmark value; while it fails (a server still starting) it is retried until --ready-timeout.
        The first run after a restart is a warm-up (its value is reported, never used): a fresh server's first
        requests pay for loading kernels and building caches, and one such run among a handful decides nothing
        but noise (on an H200 the first run after a restart read 1396 tok/s against 1600 to 2300 after it)."""
        if self.warmth.cold:
            self.warmth.cold = False
            if self.warmth.needed is not False:
                self.warmups += 1
                w = self._once(r, cwd, f"warm-up of the restarted server, not counted; then {why}", env, cmd)
                self._warm_value = w if self.warmth.needed is None else None
        return self._once(r, cwd, why, env, cmd)

    def _once(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None,
              cmd: str | None = None) -> float | None:
        """One value of the benchmark (``cmd``, a shadow copy's, in place of the run's own where given)."""
        m = self.spec
        started = time.monotonic()
        deadline = started + m.ready_timeout_s
        attempt = 0
        said = started
        while True:
            o = r.call("bench", {"cmd": cmd or self.changed_cmd or m.bench, "metric": m.metric, "cwd": cwd, "regex": m.regex, "env": env or {}}, why=why)
            self.bench_runs += 1
            if o.ok:
                return o.output.value
            now = time.monotonic()
            if now > deadline:
                return None
            self.alive(r)
            if now - said >= 5 or attempt == 0:
                said = now
                self.emit("experiment", phase="wait", text=f"waiting for the benchmark to pass (the server may still be "
                          f"starting): {now - started:.0f} s of {m.ready_timeout_s:.0f} s (--ready-timeout)")
            time.sleep(min(5.0, 0.25 * 2 ** attempt, max(0.05, deadline - now)))
            attempt += 1

    def measured(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None,
                 cmd: str | None = None) -> float:
        """One value that counts: a benchmark that keeps failing ends the experiment."""
        v = self.bench(r, cwd, why, env, cmd)
        self.connected(r)
        if v is None:
            raise ExperimentError("the benchmark kept failing after the change (see its output above)")
        return v

    # ------------------------------------------------------------ warm-ups
    def restarted(self) -> None:
        """The server was (re)started: the next benchmark run warms it up (if this server needs that)."""
        self.warmth.cold = True
        self._warm_value = None

    def judge_warm_up(self, following: list[float], reference: list[float]) -> None:
        """Was the first warm-up run of this diagnosis slower than the runs of the same state after it, by more than
        one run's noise allows (one-sided p < ALPHA_WARM; the SD pooled with the reference state's runs, t with their
        degrees of freedom)? Then the server is cold after a restart and every restart is warmed up. Not: it is not
        shown to need a warm-up, and later restarts go without one. Judged once."""
        w, self._warm_value = self._warm_value, None
        if w is None or self.warmth.needed is not None or not following or len(following) + len(reference) < 3:
            return
        m = statistics.fmean(following)
        pooled, df = pooled_sd(following, reference)
        sd = max(pooled, 1e-9 * abs(m))
        worse = (w - m) if self.lower else (m - w)
        p = one_reading_p(worse, sd, len(following), df)
        self.warmth.needed = worse > 0 and p < ALPHA_WARM
        test = f"one-sided p={p:.2g}, {'below' if self.warmth.needed else 'not below'} {ALPHA_WARM:g}"
        self.emit("experiment", phase="warm_up", needed=self.warmth.needed, text=(
            f"the warm-up run read {plain(w, 4)} against {plain(m, 4)} ± {plain(sd, 2)} over the {len(following)} runs after it: "
            + (f"worse by {plain(worse)}, more than one run's noise allows ({test}), so this server is slow on its "
               "first run after a restart and every restart is warmed up" if self.warmth.needed else
               (f"worse by {plain(worse)}, within the noise of one run ({test})" if worse > 0
                else "no slower than the runs after it")
               + ", so it is not shown to be slow on its first run after a restart, and later restarts are not "
                 "warmed up")))

    # ------------------------------------------------------------ the reference, re-measured
    def reference(self, r: Runner, bad: list[float]) -> None:
        """Add to ``bad`` (the reference state's runs) ``fresh_runs`` runs re-measured just before the change, once."""
        if self.remeasured:
            return
        self.remeasured = True
        got: list[float] = []
        for _ in range(self.fresh_runs):
            v = self.bench(r, self.spec.cwd, "the reference state, re-measured before the change", cmd=self.spec.bench)
            got += [v] if v is not None else []
        bad.extend(got)
        self.fresh_runs = len(got)   # asked for ``fresh_runs``; a failed run gives none
        self.runs_at_start = self.bench_runs   # --max-runs counts the experiment's runs from the change on

    # ------------------------------------------------------------ a changed state, sampled
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
        cap = self.spec.max_runs or 0
        ref, vals = list(bad), []
        runs, d = 0, None
        self.reference_bound = False
        if not self.warmth.cold:   # a warm-up taken before this state (the reference's) is not judged by its runs
            self._warm_value = None
        fresh = self.fresh_runs if self.remeasured else 0   # the last runs of ``bad`` were measured just before the change
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
                vals.append(self.measured(r, cwd, why, env))
                runs += 1
            if interleave and (not cap or runs < cap):
                ref.append(self.measured(r, self.spec.cwd, "the reference state (unchanged), between runs",
                                         cmd=self.spec.bench))
                runs += 1
                fresh += 1
            capped = bool(cap and runs + (self.warmups - w0) + (2 if interleave else 1) > cap)
            final = len(vals) >= most or capped
            d = decide(ref, vals, regression, self.lower, final=final, fresh=fresh, noise=self.noise,
                       regression_se=self.spec.regression_se)
            if not d.decided and not interleave and not capped and len(vals) >= MIN_BUDGET \
                    and changed_runs_futile(ref, vals, regression, self.lower, limit or AUTO_CAP, self.noise):
                # the reference's runs (not interleaved: fixed) bound it; runs of this state would be spent for nothing
                d = d.model_copy(update={"text": d.text.rsplit(": ", 1)[0] + (
                    f": undecided, and more runs of this state could not decide it against the reference state's "
                    f"{len(ref)} (with what it recovers at either end of its {FUTILE_Q:.0%} interval, "
                    f"{limit or AUTO_CAP} runs could neither show it a cause nor rule it out)")})
                self.reference_bound = True
                break
            if final and not d.decided and not capped and not extended and d.p < PROMISING \
                    and len(vals) < (limit or AUTO_CAP):
                extended = True
                continue
            if d.decided or final:
                # at the budget, with the reference's runs half the changed state's or fewer, they carry two thirds
                # or more of the difference's variance: more runs of the reference are what would decide it
                if not d.decided and not interleave and len(vals) >= 2 * len(ref):
                    self.reference_bound = True
                break
        self.judge_warm_up(vals, bad)
        self.last_decision = d
        return vals, d
