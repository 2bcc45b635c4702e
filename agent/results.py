"""What was measured: the regression as reproduced, and one experiment's result. Leaf models
(they import nothing of the agent), read by ``verdicts``, ``conclusion`` and the graph."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

Outcome = Literal["cause", "not_cause", "more"]


# how the reproduce step's outcome opens its sentence (in the run's messages and the transcript's conclusion)
LEAD = {"regression": "The regression is real: ", "none": "No reproducible regression: ",
        "noise": "Not shown to be a regression: ",
        "better": "Better than the baseline, not worse (swapped?): "}


class Regression(BaseModel):
    """What reproducing the regression measured. Only the fields set are saved and shown
    (``to_json``): a run without a benchmark has none, one without a baseline number no share."""

    measured: bool = False            # compared with a baseline number
    real: bool = True                 # worse beyond the noise (or taken as the user's word)
    why: str = ""
    samples: list[float] = Field(default_factory=list)
    mean: float | None = None
    baseline: float | None = None
    baseline_source: str | None = None
    delta: float | None = None        # worse than the baseline by (positive = worse)
    delta_se: float | None = None
    sd: float | None = None
    outcome: Literal["regression", "none", "better", "more", "noise"] | None = None
    runs_needed: int | None = None
    # --peer: the healthy peer's runs, taken alternately with the host's: {"host", "samples", "interleaved"}
    peer: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _measured_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only the fields the reproduce step set (it is built once, never changed in place)."""
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def to_json(self, samples: bool = True) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        if not samples:
            d.pop("samples", None)
        return d

    @property
    def refuted(self) -> bool:
        """Measured, and not worse beyond the noise: the run concludes without blame."""
        return self.measured and not self.real

    @property
    def size(self) -> float | None:
        """The regression an experiment's share is measured against, when one was measured."""
        return self.delta if self.measured and (self.delta or 0) > 0 else None


REPEAT = "repeat \""   # how the next step of an experiment left undecided begins (``verdicts.more_runs_next``)


def undecided_next(next_step: str | None) -> bool:
    """Is ``next_step`` what an experiment left undecided names: the runs that would decide it?"""
    return bool(next_step) and str(next_step).startswith(REPEAT)


class ExperimentResult(BaseModel):
    """One experiment's answer: what it measured, how ``stats.decide`` judged it, and what it found
    (a culprit commit, a fix). ``error`` set: nothing was measured (the host was restored)."""

    kind: str
    title: str = ""
    text: str                          # the sentence the transcript and the verdict show
    error: str | None = None
    samples: list[float] = Field(default_factory=list)
    mean: float | None = None
    share: float = 0.0                 # of the regression recovered
    share_ci: tuple[float, float] | None = None
    share_se: float | None = None
    significant: bool = False
    decision: str = ""                 # stats.decide's text
    rule: str | None = None            # the bound that decided "not a cause", in words
    outcome: Outcome | None = None
    improvement: float | None = None
    reference_runs: int | None = None  # the reference state's runs the decision compared with
    group: list[str] | None = None     # the not-judged flags or variables it removed together
    # what it found, by kind
    commit: str | None = None
    mode: str | None = None
    plan: str | None = None
    culprit: dict[str, Any] | None = None
    bisect_steps: list[dict[str, Any]] = Field(default_factory=list)
    change: str | None = None
    fix: str | None = None
    packages: list[dict[str, Any]] = Field(default_factory=list)
    control: list[float] = Field(default_factory=list)   # the server as found, restarted: what a restart alone gives
    # judged over the starts of the server (``control.restart_again``): each start's mean, with the change and as found
    starts: list[float] = Field(default_factory=list)
    found_starts: list[float] = Field(default_factory=list)

    @property
    def decided(self) -> Outcome:
        """cause, not a cause, or more runs (a result without the three-way outcome: by significance)."""
        return self.outcome or ("cause" if self.significant else "more")

    @classmethod
    def failed(cls, kind: str, why: str) -> ExperimentResult:
        return cls(kind=kind, error=why, text=why)
