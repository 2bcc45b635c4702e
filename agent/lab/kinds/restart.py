"""Restart the server with changed flags or environment: ``server_restart`` (the flags and variables the spec
names), ``restore_baseline_flags`` and ``restore_baseline_env`` (the baseline snapshot's, where they differ)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from debugagent.tools.registry import Runner
from pydantic import Field

from ..server import ServerRun, edit_argv
from ..spec import ExperimentSpec, FixTemplate, Kind, RestoreSpec

if TYPE_CHECKING:
    from ...facts import LabFacts
    from ...results import ExperimentResult
    from ..lab import Lab


class ServerRestartSpec(ExperimentSpec):
    kind: Literal["server_restart"]  # pyright: ignore[reportIncompatibleVariableOverride]  (each kind narrows the base str)
    set_flags: dict[str, str] = Field(default_factory=dict)
    unset_flags: list[str] = Field(default_factory=list)
    set_env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)


class RestoreFlagsSpec(RestoreSpec, ServerRestartSpec):
    kind: Literal["restore_baseline_flags"]   # type: ignore[assignment]
    area: ClassVar[str] = "server.args.*"


class RestoreEnvSpec(RestoreSpec, ServerRestartSpec):
    kind: Literal["restore_baseline_env"]   # type: ignore[assignment]
    area: ClassVar[str] = "server.env.*"


class ServerRestart(Kind):
    spec = ServerRestartSpec
    restarts = True
    fixed_by_restart = True
    # the experiment's own restart, made permanent (none when it restarted by a hook: no command line to show)
    fix = FixTemplate(
        text="{% if experiment.restart %}Make the experiment's change permanent ({{ experiment.title }}): "
             "{% if experiment.restart.unset %}remove {{ experiment.restart.unset | join(', ') }} from wherever the "
             "server's environment is set (unit file, launch script), {% endif %}then restart the server (stop pid "
             "{{ server.pid | default('?') }} first) as the experiment did:{% endif %}",
        commands=["{% if experiment.restart %}{{ restart_line(experiment.restart.argv, experiment.restart.unset, "
                  "experiment.restart.set) }}{% endif %}"])

    def changes(self, spec: ServerRestartSpec, facts: LabFacts) -> tuple[dict[str, str], list[str], dict[str, str], list[str]]:
        """The flags to set and unset, the variables to set and unset."""
        set_flags = {k: v for k, v in spec.set_flags.items() if k}
        unset_flags = [f for f in spec.unset_flags if f]
        set_env = {k: v for k, v in spec.set_env.items() if k}
        unset_env = [v for v in spec.unset_env if v]
        return set_flags, unset_flags, set_env, unset_env

    def apply(self, lab: Lab, r: Runner, spec: ServerRestartSpec, facts: LabFacts, bad: list[float],
              regression: float | None) -> ExperimentResult:
        srv = lab.server.find(r)
        set_flags, unset_flags, set_env, unset_env = self.changes(spec, facts)
        argv = edit_argv(srv.argv, set_flags, unset_flags)
        change = "; ".join(filter(None, [
            ", ".join(f"--{f}" for f in unset_flags) + " removed" if unset_flags else "",
            " ".join(f"--{k} {v}" for k, v in set_flags.items()),
            ", ".join(unset_env) + " unset" if unset_env else "", " ".join(f"{k}={v}" for k, v in set_env.items())]))
        lab.server.start(r, srv, ServerRun(argv=argv, cwd=srv.cwd, set=set_env, unset=unset_env,
                                           set_flags={k: str(v) for k, v in set_flags.items()}, unset_flags=unset_flags),
                         change)
        vals, d = lab.sample(r, lab.measure_spec.cwd, bad, regression, why=f"the benchmark with {change}")
        # an offline workload: the fix is its command line with the change, as the experiment ran it
        fix = (lab.server.started or {}).get("workload") if lab.server.workload is not None else None
        return lab.result(spec, vals, d, f"with {change}: {d.text}", change=change,
                          **({"fix": fix} if fix and d.significant else {}))


class RestoreBaselineFlags(ServerRestart):
    spec = RestoreFlagsSpec

    def changes(self, spec: ServerRestartSpec, facts: LabFacts) -> tuple[dict[str, str], list[str], dict[str, str], list[str]]:
        set_flags, unset_flags, set_env, unset_env = super().changes(spec, facts)
        assert isinstance(spec, RestoreFlagsSpec)
        for c in spec.restored(facts.changes):
            flag = c.path[len("server.args."):]
            if c.a is None:
                unset_flags.append(flag)
            else:
                set_flags[flag] = c.a
        return set_flags, unset_flags, set_env, unset_env


class RestoreBaselineEnv(ServerRestart):
    spec = RestoreEnvSpec

    def changes(self, spec: ServerRestartSpec, facts: LabFacts) -> tuple[dict[str, str], list[str], dict[str, str], list[str]]:
        set_flags, unset_flags, set_env, unset_env = super().changes(spec, facts)
        assert isinstance(spec, RestoreEnvSpec)
        for c in spec.restored(facts.changes):
            var = c.path[len("server.env."):]
            if c.a is None:
                unset_env.append(var)
            elif c.a != "[REDACTED]":
                set_env[var] = c.a
        return set_flags, unset_flags, set_env, unset_env
