"""Power and clock knobs: ``power_limit`` (a GPU's power limit) and ``governor`` (the CPU frequency governor).
One setting changed in place, its old value journalled first; the server keeps running, so the reference state
is re-measured just before the change."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from debugagent.tools.registry import Runner
from pydantic import model_validator

from ..errors import ExperimentError
from ..spec import ExperimentSpec, FixTemplate, Kind, Text

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab


class PowerLimitSpec(ExperimentSpec):
    kind: Literal["power_limit"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    gpu: Text | None = None                # the GPU index (template)
    watts: Text | None = None              # the limit to set (template)

    @model_validator(mode="after")
    def _typed_fields(self) -> PowerLimitSpec:
        self.needs("gpu", "watts")
        self.typed(("watts", float, "a number of watts, e.g. 700"), ("gpu", int, "a GPU index, e.g. 0"))
        return self


class GovernorSpec(ExperimentSpec):
    kind: Literal["governor"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    governor: Text | None = None           # the governor to set

    @model_validator(mode="after")
    def _needs(self) -> GovernorSpec:
        self.needs("governor")
        return self


class Knob(Kind):
    """A setting changed in place: ``change`` journals its undo, makes the change and says what changed."""

    fresh = True

    def change(self, lab: Lab, r: Runner, spec: ExperimentSpec, facts: LabFacts) -> tuple[bool, str | None, str]:
        """(ok, error, what changed)"""
        raise NotImplementedError

    def apply(self, lab: Lab, r: Runner, spec: ExperimentSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        ok, error, change = self.change(lab, r, spec, facts)
        if not ok:
            raise ExperimentError(error or "the change failed")
        vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        return lab.result(spec, vals, d, f"with {change}: {d.text}", change=change)


class PowerLimit(Knob):
    spec = PowerLimitSpec
    fix = FixTemplate(
        text="Raise GPU {{ experiment.spec.gpu | default('0') }}'s power limit back to {{ experiment.spec.watts or 'the maximum' }} W "
             "(and find what lowered it: a startup script, a datacenter policy):",
        commands=["{% if experiment.spec.watts %}nvidia-smi -i {{ experiment.spec.gpu | float | int }} -pl "
                  "{{ '%g' | format(experiment.spec.watts | float) }}{% endif %}"])

    def change(self, lab: Lab, r: Runner, spec: ExperimentSpec, facts: LabFacts) -> tuple[bool, str | None, str]:
        assert isinstance(spec, PowerLimitSpec) and spec.gpu is not None and spec.watts is not None
        gpu = int(float(spec.gpu))
        limit = facts.gpu(gpu).power_limit
        watts = float(spec.watts)
        lab.push_undo("set_power_limit", {"gpu": gpu, "watts": limit}, f"set GPU {gpu}'s power limit back to {limit:.0f} W")
        o = r.call("set_power_limit", {"gpu": gpu, "watts": watts}, why=f"GPU {gpu} power limit {watts:.0f} W")
        return o.ok, o.error, f"GPU {gpu} power limit {limit:.0f} -> {watts:.0f} W"


class Governor(Knob):
    spec = GovernorSpec
    fix = FixTemplate(
        text="Set the CPU governor to {{ experiment.spec.governor or 'performance' }} (and make it persist across "
             "reboots):",
        commands=["echo {{ (experiment.spec.governor or 'performance') | quote }} | tee "
                  "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"])

    def change(self, lab: Lab, r: Runner, spec: ExperimentSpec, facts: LabFacts) -> tuple[bool, str | None, str]:
        assert isinstance(spec, GovernorSpec)
        old = facts.governor
        lab.push_undo("set_governor", {"governor": old}, f"set the CPU governor back to {old}")
        o = r.call("set_governor", {"governor": spec.governor}, why=f"governor {spec.governor}")
        return o.ok, o.error, f"CPU governor {old} -> {spec.governor}"
