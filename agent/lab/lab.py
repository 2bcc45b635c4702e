"""The lab: runs one experiment of any kind (``registry.KINDS``) and restores the host after it.

It wires the parts together: ``Bench`` (measuring), ``Server`` (finding and restarting the server),
``Undo`` (the journal) and the restart control; a kind's ``apply`` reaches them through it."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from debugagent.tools.discovery import DiscoveryInput
from debugagent.tools.errors import DebugAgentError, RestoreError
from debugagent.tools.probes.text import plural
from debugagent.tools.registry import Runner

from ..journal import Journal
from ..results import ExperimentResult
from ..stats import ALPHA_WORSE, looks_normal
from .control import reference_restarted, restart_again, restart_control
from .errors import ConnectionLost, ExperimentError
from .measure import Bench, Measure
from .registry import KINDS
from .server import LabSetup, Server
from .shadow import Shadow, ShadowPlan, note_copy
from .undo import Undo

if TYPE_CHECKING:
    from ..context import Warmth
    from ..facts import LabFacts


@dataclass
class PeerReader:
    """``--peer``: what an experiment may read from the healthy peer, never change: its name, its server's Python,
    ``open`` (its connection opened again: a runner whose calls the transcript records as the peer's) and ``close``
    (closed again, as soon as the read is done)."""

    name: str
    python: str | None
    open: Callable[[], Runner]
    close: Callable[[], None]


class Lab:
    """Runs experiments for the graph's experiment node.

    ``found_restarted``: the runs of the server as found, restarted, that earlier controls of this run
    measured (added to here); ``discovery``: the run's discovery input (its overrides, the server found
    earlier); ``noise``: the baseline's runs of the same benchmark; ``fresh_runs``: how many runs of the
    reference state to re-measure just before a change of a kind that asks for it."""

    def __init__(self, runner_for: Callable[[str | None], Runner], emit: Callable[..., None], undo: Journal,
                 measure: Measure, run_id: str, lower_is_better: bool, setup: LabSetup | None = None,
                 warmth: Warmth | None = None, found_restarted: list[float] | None = None, *,
                 discovery: DiscoveryInput | None = None, noise: tuple[list[float], ...] = (),
                 fresh_runs: int = 0, shadow: dict[str, Any] | None = None,
                 workload: dict[str, Any] | None = None, peer: PeerReader | None = None,
                 speed_moved: list[str] | None = None) -> None:
        self.runner_for = runner_for
        self.emit = emit
        self.journal = undo
        self.measure_spec = measure
        self.run_id = run_id
        self.lower = lower_is_better
        self.noise = noise
        self.setup = setup or LabSetup()
        self.found_restarted = found_restarted if found_restarted is not None else []
        # what showed, earlier in the run, that the speed moves (``Ctx.speed_moved``; ``_moved`` reads it)
        self.speed_moved = speed_moved if speed_moved is not None else []
        self.peer = peer   # ``--peer``: read only (a package's build, by ``kinds.package``)
        self._reconnects = 0
        self._r: Runner | None = None
        self.measuring = Bench(measure, emit, lower_is_better, warmth, noise, fresh_runs,
                               alive=lambda r: self.server.check_alive(r), connected=self.check_connection)
        self.undo = Undo(undo, emit, self._undo_restarted,
                         pattern=lambda: (discovery.server_pattern if discovery else None) or self.setup.server_pattern,
                         settle_s=measure.ready_timeout_s)
        self.server = Server(self.setup, run_id, emit, measure.ready_timeout_s, discovery, self.undo.push,
                             self.measuring.restarted)
        self.server.on_started = self.undo.note_started
        if workload is not None:   # an offline workload: no server; experiments change its command line
            from debugagent.tools.host import ServerInfo
            self.server.workload = ServerInfo.model_validate(workload)
            self.server.workload_bench = measure.bench
            self.server.changed = lambda cmd: setattr(self.measuring, "changed_cmd", cmd)
        # shadow experiments (``shadow.py``): copies of the server are started and measured; the server is only read
        self.shadow: Shadow | None = None
        if shadow is not None:
            self.shadow = Shadow(ShadowPlan.model_validate(shadow), self.setup, run_id, emit, measure.ready_timeout_s,
                                 discovery, self.undo.push, self.measuring.restarted, bench=self.measuring,
                                 journal_note=note_copy(undo))
            self.server = self.shadow

    # ------------------------------------------------------------ what kinds and the graph read
    @property
    def warmth(self) -> Warmth:
        return self.measuring.warmth

    @property
    def bench_runs(self) -> int:
        return self.measuring.bench_runs

    @property
    def warmups(self) -> int:
        return self.measuring.warmups

    @property
    def last_decision(self) -> Any:
        return self.measuring.last_decision

    def bench(self, r: Runner, cwd: str | None, why: str, env: dict[str, str] | None = None) -> float | None:
        return self.measuring.bench(r, cwd, why, env)

    def sample(self, r: Runner, cwd: str | None, bad: list[float], regression: float | None, why: str,
               first: int = 2, env: dict[str, str] | None = None, interleave: bool = False) -> tuple[list[float], Any]:
        if self.shadow is not None and self.shadow.copies:   # the copies in turn, never the server's own runs
            return self.shadow.sample(self.measuring, r, cwd, regression, why, env)
        return self.measuring.sample(r, cwd, bad, regression, why, first, env, interleave)

    def restarted(self) -> None:
        self.measuring.restarted()

    def reference(self, bad: list[float]) -> None:
        """Add to ``bad`` the reference state's runs re-measured just before the change (once per experiment)."""
        assert self._r is not None, "the reference is re-measured during an experiment"
        self.measuring.reference(self._r, bad)

    def push_undo(self, tool: str, inp: dict[str, Any], text: str) -> None:
        self.undo.push(tool, inp, text)

    def do_undo(self, r: Runner) -> list[str]:
        return self.undo.run(r)

    def _undo_restarted(self, found_again: dict[str, Any] | None, cold: bool) -> None:
        if found_again is not None:
            self.server.found_again = found_again
        if cold:
            self.measuring.restarted()

    def check_connection(self, r: Runner) -> None:
        """A connection re-made mid-experiment: stop, so the host is restored before anything else."""
        now = r.transport.reconnects
        if now != self._reconnects:
            self._reconnects = now
            raise ConnectionLost("the connection was lost and re-made during the experiment; the host is "
                                 "restored first and the experiment runs again")

    def result(self, spec: Any, vals: list[float], d: Any, text: str, **extra: Any) -> ExperimentResult:
        return ExperimentResult(kind=spec.kind, title=spec.title, samples=vals, mean=statistics.fmean(vals),
                                share=round(d.share, 3), significant=d.significant, decision=d.text, text=text,
                                rule=getattr(d, "rule", None) or None, **extra)

    def control(self, r: Runner, result: ExperimentResult, bad: list[float],
                regression: float | None) -> tuple[ExperimentResult, str | None]:
        return restart_control(self, r, result, bad, regression)

    def reference_restarted(self, r: Runner, result: ExperimentResult, bad: list[float],
                            regression: float | None, worse: str | None = None) -> tuple[ExperimentResult, str | None]:
        return reference_restarted(self, r, result, bad, regression, worse)

    def _note_two_speeds(self, result: ExperimentResult, bad: list[float]) -> None:
        """The changed state's runs, all of one start, and the reproduce step's, each around its mean, that are not
        normal (Shapiro–Wilk below 0.01, as ``stats.effect`` tests them): a server or host whose speed switches
        within a start, in streaks, gives two humps. Said once in ``speed_moved``, for this ruling and later ones."""
        if self.speed_moved or not result.samples or looks_normal(bad, result.samples):
            return
        self.speed_moved.append(f"the {plural(len(result.samples), 'run')} of \"{result.title or result.kind}\" "
                                f"and the reproduce step's {len(bad)} were not normal (Shapiro–Wilk below 0.01: the "
                                "speed may switch between two, in streaks)")

    def _moved(self, result: ExperimentResult, spec: dict[str, Any]) -> str | None:
        """Where a restart experiment rules its change out on one start of it against the reproduce step's runs,
        and the run has seen the speed move (``speed_moved``: the server as found reading differently from one start
        to the next, or runs of one start that are not normal, this experiment's included), the words that say so;
        else None."""
        d = self.measuring.last_decision
        if not self.speed_moved or d is None or d.outcome != "not_cause" or result.significant or result.error \
                or not result.samples or self.server.started is None or self.server.workload is not None \
                or spec.get("joint"):
            return None
        return f"in this run {self.speed_moved[0]}"

    def _reads_worse(self, result: ExperimentResult) -> str | None:
        """Where the changed state was ruled out because it reads worse than the reference beyond the noise
        (one-sided p below ``stats.ALPHA_WORSE``), the words that say so; else None. A harmless change reads that
        way once in a hundred experiments; a host whose speed moved since the reproduce step (a virtual CPU's
        streaks, a server that comes up in another mode) reads that way whatever the change does."""
        d = self.measuring.last_decision
        if d is None or d.outcome != "not_cause" or result.significant or d.improvement >= 0:
            return None
        p_worse = 1 - d.p
        if p_worse >= ALPHA_WORSE:
            return None
        return (f"its {plural(len(result.samples), 'run')} read worse than the reference state's {d.n_reference} by more "
                f"than their noise allows (one-sided p={p_worse:.2g})")

    # ------------------------------------------------------------ one experiment
    def run(self, hyp: str, spec: dict[str, Any], facts: LabFacts, bad: list[float],
            regression: float | None) -> ExperimentResult:
        r = self.runner_for(hyp)
        self._r = r
        self._reconnects = r.transport.reconnects
        self.server.started = None
        self.server.found_again = None
        self.measuring.changed_cmd = None
        self.measuring.reference_bound = False
        if self.shadow is not None:
            self.shadow.copies = {}
        self.measuring.runs_at_start = self.measuring.bench_runs
        kind = KINDS.get(spec["kind"])
        if kind is None:
            raise ExperimentError(f"unknown experiment kind {spec['kind']}")
        if self.shadow is not None and not kind.restarts:
            # a knob of the host itself (a power limit, a governor, locked clocks) is never a copy's own
            raise ExperimentError(f"a shadow run changes nothing the production server uses, and \"{spec.get('title')}\" "
                                  "acts on the host itself, not on a copy: run it without --shadow-gpus, with consent")
        if kind.fresh and kind.fresh_first:
            self._restoring(r, lambda: self.reference(bad))
        typed = self._restoring(r, lambda: self._fitting(
            lambda: kind.spec.model_validate({k: v for k, v in spec.items() if k in kind.spec.model_fields})))
        result = self._apply(r, kind, typed, facts, bad, regression)
        if self.shadow is not None and self.server.started is not None:
            # the unchanged copy, started the same way at the same time and measured in turn, is the control
            return result.model_copy(update={"text": f"{self.shadow.describe()}: {result.text}"})
        # a second start with the change, where the speed changes at restarts (no bisection: the change as found)
        once = typed.model_copy(update={"bisect": False}) if "bisect" in type(typed).model_fields else typed

        def again() -> ExperimentResult:
            return self._apply(r, kind, once, facts, bad, regression)
        # (an offline workload restarted nothing: its runs before the change are the unchanged state's)
        self._note_two_speeds(result, bad)
        worse = self._reads_worse(result)
        if self.server.started is not None and self.server.workload is None and not result.significant \
                and (self.measuring.reference_bound or worse) and not result.error and result.samples:
            # the reference's few runs left it open, or "not a cause" rests on the changed state reading worse than
            # the reference beyond the noise (the host's speed may have moved since): the server as found, restarted
            # by the undo, measured again
            result, seen = self.reference_restarted(r, result, bad, regression, worse)
            if seen is None and worse and result.control and not result.significant:
                # the reference, measured again, agrees with the reproduce step, and the change still reads worse: the
                # host may have been slow while the change ran, which only another start with it can show
                seen = self._reads_worse(result)
            return restart_again(self, r, result, bad, regression, again, seen) if seen is not None else result
        moved = self._moved(result, spec)
        if moved:
            # the run has seen the speed move (``speed_moved``): one start each way cannot rule the change out, so it
            # is made again and judged over the starts (which never rules out)
            return restart_again(self, r, result, bad, regression, again, moved)
        # the causes reverted together were each controlled alone already
        if self.server.started is not None and self.server.workload is None and result.significant \
                and not spec.get("joint"):
            result, seen = self.control(r, result, bad, regression)
            if seen is not None:
                result = restart_again(self, r, result, bad, regression, again, seen)
        return result

    @staticmethod
    def _fitting(step: Callable[[], Any]) -> Any:
        """``step``; a rendered field that does not fit the host is an ExperimentError that says how to check it."""
        try:
            return step()
        except (ValueError, TypeError, KeyError, StopIteration) as exc:
            raise ExperimentError(f"the experiment's fields do not fit this host ({type(exc).__name__}: {exc}); "
                                  f"check them with `debugagent playbook validate`") from exc

    def _restoring(self, r: Runner, step: Callable[[], Any]) -> Any:
        """``step``, and on any failure the host restored before the failure goes on."""
        try:
            return step()
        except BaseException as exc:
            self.measuring.changed_cmd = None
            try:
                self.do_undo(r)
            except DebugAgentError as uexc:  # the step stays pending; the run's restore() retries and reports it
                self.emit("error", kind="undo", message=f"undo interrupted: {uexc}")
            if self.journal.steps and isinstance(exc, ExperimentError):
                left = [s.text for s in self.journal.pending()]
                raise RestoreError(f"the experiment failed ({exc}) and the host could not be fully restored; "
                                   f"left: {'; '.join(left)}", left=left) from exc
            raise

    def _apply(self, r: Runner, kind: Any, typed: Any, facts: LabFacts, bad: list[float],
               regression: float | None) -> ExperimentResult:
        """The change made and measured by its kind, then undone (the server as found restarted where it was)."""
        result = self._restoring(r, lambda: self._fitting(lambda: kind().apply(self, r, typed, facts, bad, regression)))
        self.measuring.changed_cmd = None   # the workload as found again
        left = self.do_undo(r)
        if left:
            raise RestoreError(f"the host could not be fully restored after the experiment; left: {'; '.join(left)}",
                               left=left)
        return result
