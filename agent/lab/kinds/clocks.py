"""``clock_reset``: reset the clocks a GPU was locked to (``nvidia-smi -rgc``, and ``-rmc`` where the memory clock
is held too), measure, and lock them again with the values read before (``-lgc MIN,MAX`` / ``-lmc MIN,MAX``).

No query prints a lock's range, so it is read where it shows: under load a locked GPU runs at the lock's MAX with
NVML's applications-clocks reason active, and an idle one sits at its MIN (the snapshot's idle reading, taken
before the benchmark). The undo step holds those values and is journalled before the reset; the as-found check
reads the idle clocks and the reasons again after it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from debugagent.tools.probes.gpu import GpuFacts
from debugagent.tools.registry import Runner
from pydantic import model_validator

from ..errors import ExperimentError
from ..spec import ExperimentSpec, FixTemplate, Kind, Text

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab

REASON = "applications_clocks_setting"


class ClockResetSpec(ExperimentSpec):
    kind: Literal["clock_reset"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    gpu: Text | None = None   # one GPU index (template); default: every GPU the reason was active on under load

    @model_validator(mode="after")
    def _typed_fields(self) -> ClockResetSpec:
        self.typed(("gpu", int, "a GPU index, e.g. 0"))
        return self


def lock_of(g: GpuFacts) -> dict[str, int | None] | None:
    """The lock as read: the SM clock under load (MAX) and idle (MIN, at most MAX); the memory clock's likewise where
    under load it ran below its maximum. None where the GPU was not read under load with the reason active."""
    if not g.under_load or REASON not in g.event_reasons or not g.sm_clock:
        return None
    hi = g.sm_clock
    lo = min(g.idle_sm_clock or hi, hi)
    mem = bool(g.mem_clock and g.mem_clock_max and g.mem_clock < g.mem_clock_max)
    mhi = g.mem_clock if mem else None
    mlo = min(g.idle_mem_clock or g.mem_clock or 0, g.mem_clock or 0) if mem else None
    return {"gpu": g.index, "sm_min": lo, "sm_max": hi, "mem_min": mlo or None, "mem_max": mhi}


def reset_commands(locks: list[dict[str, int | None]]) -> list[str]:
    out = []
    for lk in locks:
        out.append(f"nvidia-smi -i {int(lk['gpu'] or 0)} -rgc")
        if lk.get("mem_max"):
            out.append(f"nvidia-smi -i {int(lk['gpu'] or 0)} -rmc")
    return out


class ClockReset(Kind):
    spec = ClockResetSpec
    fresh = True   # the server keeps running: the reference is re-measured just before the reset
    fix = FixTemplate(
        text="Reset the locked clocks (and find what locked them: a start-up script, a tuning or power run left "
             "behind); the lock does not survive a reboot or a driver reload, so look for what sets it again:",
        commands=["nvidia-smi{% if experiment.spec.gpu not in (none, '') %} -i {{ experiment.spec.gpu | int }}{% endif %} -rgc"])

    def apply(self, lab: Lab, r: Runner, spec: ExperimentSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        assert isinstance(spec, ClockResetSpec)
        want = None if spec.gpu in (None, "") else int(float(str(spec.gpu)))
        locks = [lk for g in facts.gpus if want is None or g.index == want if (lk := lock_of(g))]
        if not locks:
            raise ExperimentError("no GPU ran under load with the applications-clocks reason active, so no lock was "
                                  "read to reset and restore")
        parts = []
        for lk in locks:
            g = int(lk["gpu"] or 0)
            mem = f", memory {lk['mem_min']},{lk['mem_max']} MHz" if lk.get("mem_max") else ""
            lab.push_undo("lock_clocks", lk, f"lock GPU {g}'s clocks again as found: SM {lk['sm_min']},{lk['sm_max']} MHz{mem}")
            o = r.call("reset_clocks", {"gpu": g, "memory": bool(lk.get("mem_max"))}, why=f"GPU {g}: reset the locked clocks")
            if not o.ok:
                raise ExperimentError(o.error or "the reset failed")
            parts.append(f"GPU {g} SM {lk['sm_min']},{lk['sm_max']} MHz{mem}")
        change = "the locked clocks reset (found locked: " + "; ".join(parts) + ")"
        vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        return lab.result(spec, vals, d, f"with {change}: {d.text}", change=change, fix="; ".join(reset_commands(locks)))
