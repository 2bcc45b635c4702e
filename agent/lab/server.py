"""Server control: find the server as it runs now, restart it in a changed state (its undo journalled first),
by itself or by the user's restart hook, and wait until it is ready."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from debugagent.tools import mutate, supervise
from debugagent.tools import shape as supervise_shape
from debugagent.tools.discovery import DiscoveryInput
from debugagent.tools.registry import Runner
from pydantic import BaseModel, ConfigDict, Field

from ..discovery import find_server
from .errors import ExperimentError

if TYPE_CHECKING:
    from ..context import Overrides


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
    allow_container_recreate: bool = False

    @classmethod
    def from_inputs(cls, overrides: Overrides, profile: dict[str, Any] | None) -> LabSetup:
        """Flags (``context.Overrides``) win over the host profile (``/etc/debugagent/host.json``)."""
        pr = profile or {}
        wh = [w for w in [overrides.wheelhouse, pr.get("wheelhouse")] if w]
        return cls(server_pattern=overrides.server_pattern, python=overrides.python,
                   code_root=overrides.code_root or pr.get("code_root"), wheelhouse=[str(w) for w in wh],
                   restart_cmd=overrides.restart_cmd or pr.get("restart_cmd"),
                   health_url=pr.get("health_url"), ready_line=pr.get("ready_line"),
                   allow_container_recreate=bool(overrides.allow_container_recreate))


class ServerRun(BaseModel):
    """How to start the server for an experiment: its command line, folder, and what changes in its environment."""

    argv: list[str]
    cwd: str
    set: dict[str, str] = Field(default_factory=dict)
    unset: list[str] = Field(default_factory=list)
    path_first: list[str] = Field(default_factory=list)
    # the flags changed (a supervisor's own command line is edited with them, not replaced by the running one)
    set_flags: dict[str, str] = Field(default_factory=dict)
    unset_flags: list[str] = Field(default_factory=list)


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


def hook_hint() -> str:
    return ("give --restart-cmd 'CMD' (or \"restart_cmd\" in /etc/debugagent/host.json): debugagent runs it to restart "
            "the server, with the state to start in DEBUGAGENT_ARGV, DEBUGAGENT_CWD, DEBUGAGENT_SET_ENV, "
            "DEBUGAGENT_UNSET_ENV and DEBUGAGENT_PYTHONPATH_FIRST (DEBUGAGENT_PHASE is experiment, then undo)")


class ContainerPlan(BaseModel):
    """What a restart of a container's main process takes: the text that refuses it (with the commands to run by
    hand), and for docker and podman the container as found and its changed copy (``--allow-container-recreate``)."""

    text: str
    found: Any = None      # recreate.ContainerSpec
    changed: Any = None
    on_host: bool = False  # the commands run on the container's host (not in it): pids are the host's


RECREATE_HINT = ("--allow-container-recreate lets debugagent run them itself, journalled and undone like any experiment")


class OnHost(BaseModel):
    """The server's container seen from the host that runs it (its cgroup names the runtime and the id): its
    runtime's CLI answers there, so the container is named by its id until its inspect names it."""

    kind: str
    name: str

    @property
    def label(self) -> str:
        return f"the {self.kind} container {self.name[:12]}"


def container_plan(r: Runner, srv: Any, run: ServerRun, change: str, ctl: Any = None) -> ContainerPlan | None:
    """Where the run entered the server's container (``--host docker:NAME``, ``podman:``, ``k8s:``, or ``--container``)
    or runs on the host that runs it (a docker or podman cgroup in ``ctl``, ``server_control``'s output), and the
    server is its main process: the commands that would restart it with the change (a new container from the found
    one's own inspect, with only the change; for a pod, its Deployment's patch and rollout), and the ones that put it
    back. Without ``--allow-container-recreate`` debugagent runs none of them: the experiment is refused with them, to
    run by hand; a Kubernetes workload is never changed."""
    target: Any = getattr(r.transport, "target", None)
    if target is None and ctl is not None and ctl.runtime in ("docker", "podman") and ctl.container_id:
        target = OnHost(kind=ctl.runtime, name=ctl.container_id)
    kind = getattr(target, "kind", None)
    if target is None or kind not in ("docker", "podman", "k8s"):
        return None
    from debugagent.tools.recreate import aside_name, command_line, k8s_plan, recreate_plan
    argv = run.argv if run.argv != srv.argv else None
    if run.path_first:
        return ContainerPlan(text=f"the server runs as the main process of {target.label}: {change} needs code from the "
                             "host's folders first on its PYTHONPATH, which a new container would not see; debugagent "
                             "does not recreate containers for it")
    if kind == "k8s":
        do, undo = k8s_plan(target.namespace, target.name, target.container, argv, run.set, run.unset)
        return ContainerPlan(text=f"the server runs as the main process of {target.label}: a Kubernetes workload is never "
                             f"changed by debugagent. To test {change}, run: " + "; ".join(f"`{c}`" for c in do)
                             + "; then the benchmark. To put it back: " + "; ".join(f"`{c}`" for c in undo))
    o = r.call("container_inspect", {"runtime": kind, "name": target.name},
               why="the container as it runs: what a new one with only the change needs")
    if not o.ok:
        return ContainerPlan(text=f"the server runs as the main process of {target.label}, and `{kind} inspect` could not "
                             f"be read ({o.error}): restarting it with {change} means recreating the container"
                             + (f"; or {hook_hint()}" if isinstance(target, OnHost) else ""))
    found = o.output
    shebang = _shebang_of(found.argv, list(srv.argv))
    if shebang and argv is not None:   # the change in the container's terms: its entrypoint runs the script itself
        argv = [found.argv[0], *argv[2:]]
    if found.argv != list(srv.argv) and not shebang:
        return ContainerPlan(text=f"the server runs as the main process of {target.label}, but `{kind} inspect` names "
                             f"another command line ({command_line(found.argv)[:200]}); debugagent does not recreate the "
                             "container")
    changed = found.changed(argv=argv, set_env=run.set, unset_env=run.unset)
    do, undo = recreate_plan(found, changed, aside_name(found.name))
    if isinstance(target, OnHost):
        target = OnHost(kind=kind, name=found.name)
    return ContainerPlan(text=f"the server runs as the main process of {target.label}: restarting it with {change} means "
                         "a new container. To test it, run on the container's host: "
                         + "; ".join(f"`{c}`" for c in do) + "; then the benchmark. To put the very container back as "
                         "found: " + "; ".join(f"`{c}`" for c in undo) + f" ({RECREATE_HINT})",
                         found=found, changed=changed, on_host=isinstance(target, OnHost))


def _shebang_of(container_argv: list[str], process_argv: list[str]) -> bool:
    """The container's command is a script run by its ``#!`` interpreter (a console script: ``vllm serve`` in the
    inspect, ``/opt/venv/bin/python3 /opt/venv/bin/vllm serve`` in ``/proc``): the same command line."""
    return (len(process_argv) >= 2 and bool(container_argv) and process_argv[2:] == container_argv[1:]
            and process_argv[1].rsplit("/", 1)[-1] == container_argv[0].rsplit("/", 1)[-1]
            and process_argv[0].rsplit("/", 1)[-1].startswith("python"))


class Server:
    """The inference server as one experiment changes it.

    ``started``: the server this experiment started (how to start it again, its pid, its log), None before;
    ``found_again``: the server as found, started again by the undo (its pid and log). ``push_undo``
    journals an undo step; ``restarted`` tells the benchmark the next run is a warm-up."""

    def __init__(self, setup: LabSetup, run_id: str, emit: Callable[..., None], ready_timeout_s: float,
                 discovery: DiscoveryInput | None, push_undo: Callable[[str, dict[str, Any], str], None],
                 restarted: Callable[[], None]) -> None:
        self.setup = setup
        self.run_id = run_id
        self.emit = emit
        self.ready_timeout_s = ready_timeout_s
        self.discovery = discovery   # the run's discovery input (its overrides, the server found earlier)
        self.push_undo = push_undo
        self.restarted = restarted
        self.started: dict[str, Any] | None = None
        self.found_again: dict[str, Any] | None = None
        # an offline workload (``tools.workload``): no server; each experiment runs the benchmark, the program
        # itself, with its change (``bench``: its command as found; ``changed``: tells the benchmark the new one)
        self.workload: Any = None
        self.workload_bench = ""
        self.changed: Callable[[str | None], None] = lambda cmd: None
        # told the pid and start time of each server an experiment started (the undo's step names it)
        self.on_started: Callable[[str, int, int], None] = lambda pid_file, pid, start: None

    def find(self, r: Runner) -> Any:
        """The server as it runs now, found by the run's own discovery (its overrides, the server found earlier)."""
        if self.workload is not None:
            return self.workload
        srv = find_server(r, self.discovery or DiscoveryInput(server_pattern=self.setup.server_pattern))
        if srv is None:
            pat = self.setup.server_pattern
            raise ExperimentError("the server process is gone" + (f" (nothing matches --server-pattern {pat!r})" if pat
                                                                  else " (discovery with the run's own overrides found none)"))
        return srv

    def find_or_none(self, r: Runner) -> Any:
        try:
            return self.find(r)
        except ExperimentError:
            return None

    def check_alive(self, r: Runner) -> None:
        """A failing benchmark after a restart: if the server this experiment started has exited, say so now."""
        pid = (self.started or {}).get("pid")
        if not pid or self.workload is not None or "hook" in (self.started or {}) or "supervised" in (self.started or {}):
            # under a hook or a supervisor, a supervisor may replace it: not ours to judge
            return
        o = r.call("server_ready", {"pid": pid}, why="is the restarted server still running?")
        if o.ok and o.output.state == "dead":
            log = (self.started or {}).get("log")
            raise ExperimentError(f"the restarted server (pid {pid}) exited" + (f"; its output is in {log}" if log else ""))

    # ------------------------------------------------------------ restart
    def start(self, r: Runner, srv: Any, run: ServerRun, change: str) -> int:
        """Restart ``srv`` as ``run`` (its undo journalled first); wait until it is ready; return the new pid."""
        if self.workload is not None:
            return self._start_workload(run, change)
        if self.setup.restart_cmd:
            return self._start_by_hook(r, srv, run, change)
        c = r.call("server_control", {"pid": srv.pid}, why="how the server runs: a systemd unit, a container or a "
                   "supervisor would restart or lose it if it were killed")
        if not c.ok:
            raise ExperimentError(c.error or "server_control failed")
        ctl = c.output
        if ctl.kind == "container" and (plan := container_plan(r, srv, run, change, ctl)):
            if plan.found is not None and self.setup.allow_container_recreate:
                return self._start_container(r, srv, run, change, plan.found, plan.changed, plan.on_host)
            raise ExperimentError(plan.text)
        if ctl.kind in ("supervisor", "systemd"):
            sup = self._supervisor(r, srv)
            if sup is not None and sup.kind == "supervisord" and sup.config and sup.program:
                return self._start_supervisord(r, srv, run, change, sup)
            if sup is not None and sup.kind == "systemd" and sup.unit:
                return self._start_systemd(r, srv, run, change, sup.unit)
        if ctl.kind != "plain":
            what = {"systemd": f"the systemd unit {ctl.unit}", "container": "a container",
                    "supervisor": f"a supervisor (`{ctl.parent}`, pid {ctl.parent_pid})"}[ctl.kind]
            raise ExperimentError(f"the server (pid {srv.pid}) runs under {what} ({ctl.evidence}); debugagent does not "
                                  f"kill it, since that would restart it behind the experiment's back or lose it: "
                                  + hook_hint())
        # who the server runs as (uid, groups, umask, nice, limits), where the shell that restarts it differs
        run_as = ctl.run_as()
        if run_as is not None and ctl.shell_identity is not None and (cannot := run_as.needs_root(ctl.shell_identity)):
            raise ExperimentError(f"the server (pid {srv.pid}) runs as {ctl.identity.describe() if ctl.identity else '?'}; "
                                  f"this session (uid {ctl.shell_identity.uid}) cannot start it so ({', '.join(cannot)}): "
                                  "debugagent does not restart a server as anyone but who it was found running as; "
                                  "run debugagent as root or as the server's user")
        as_found = {"run_as": run_as.model_dump(exclude_none=True)} if run_as is not None else {}
        tag = f"{self.run_id}-{srv.pid}"
        env_file, pid_file = f"/tmp/debugagent-{tag}.env", f"/tmp/debugagent-{tag}.pid"
        log = ctl.stdout or mutate.DEFAULT_LOG
        self.push_undo("remove_file", {"path": env_file}, f"remove the saved environment {env_file}")
        self.push_undo("restart_server", {"stop_pid_file": pid_file, "expect_argv": run.argv, "argv": srv.argv,
                                          "cwd": srv.cwd, "env_file": env_file, "keep_if_running": srv.pid, "log": log,
                                          **({"ports": list(srv.ports)} if srv.ports else {}), **copy.deepcopy(as_found)},
                       "restart the server as it was found (same command line, folder and environment"
                       + (f"; as {ctl.identity.describe(run_as.fields())}" if run_as and ctl.identity else "") + "); the process "
                       f"the experiment started (its pid in {pid_file}, checked against its command line) is stopped first, "
                       f"after any restart still under way there; {pid_file} is removed once the server runs as found")
        o = r.call("restart_server", {"pid": srv.pid, "expect_argv": srv.argv, "argv": run.argv, "cwd": run.cwd,
                                      "env_file": env_file, "unset": run.unset, "set": run.set, "path_first": run.path_first,
                                      "save_env": True, "pid_file": pid_file, "log": log,
                                      **({"ports": list(srv.ports)} if srv.ports else {}), **as_found},
                   why=f"restart with {change}; output appended to {log if log != mutate.DEFAULT_LOG else 'its log'}"
                   + (f"; as the server was found ({ctl.identity.describe(run_as.fields())})" if run_as and ctl.identity
                      else ""))
        if not o.ok:
            raise ExperimentError(o.error or "restart failed")
        self.started = {"run": run, "pid_file": pid_file, "env_file": env_file, "log": o.output.log or log,
                        "ports": list(srv.ports),
                        "change": change, "pid": o.output.pid, "run_as": as_found, "identity": ctl.identity,
                        "as_fields": run_as.fields() if run_as is not None else set()}
        self.on_started(pid_file, o.output.pid, o.output.start)
        self.restarted()
        self._wait_ready(r, o.output.pid, o.output.log, o.output.log_size)
        self._check_identity(r, o.output.pid)
        return o.output.pid

    def _start_workload(self, run: ServerRun, change: str) -> int:
        """An offline workload: nothing runs between its runs, so nothing is restarted and nothing on the host
        changes; its next runs are its command line with the change (``tools.workload.command``). Its flags are
        the work it does: never changed."""
        if run.set_flags or run.unset_flags:
            flags = [*(f"--{f}" for f in run.unset_flags), *(f"--{f}" for f in run.set_flags)]
            raise ExperimentError(f"the benchmark is an offline workload, whose flags ({', '.join(flags)}) are the work it "
                                  "does, not how a server runs it: debugagent does not change them")
        from debugagent.tools.workload import command
        cmd = command(self.workload_bench, list(run.argv), run.cwd, unset=list(run.unset), set_env=dict(run.set),
                      path_first=list(run.path_first))
        self.started = {"run": run, "workload": cmd, "change": change, "pid": 0}
        self.changed(cmd)
        self.emit("experiment", phase="plan", text=f"no server to restart: the workload is the benchmark, and its next "
                  f"runs are `{cmd}` ({change})")
        return 0

    # ------------------------------------------------------------ supervised servers
    def _supervisor(self, r: Runner, srv: Any) -> supervise_shape.Supervisor | None:
        o = r.call("server_shape", {"pid": srv.pid, "python": None, "cwd": srv.cwd},
                   why="what supervises the server: a supervisord program (its config) or a systemd unit")
        return o.output.supervisor if o.ok else None

    def _start_supervisord(self, r: Runner, srv: Any, run: ServerRun, change: str, sup: Any) -> int:
        """The change written into the program's section of supervisord's config (``command=``, ``environment=``,
        ``directory=``), applied by ``supervisorctl reread`` / ``update``; the undo puts the file back byte for
        byte and updates again. Journalled before the file is touched."""
        prog = r.call("supervisor_program", {"config": sup.config, "program": sup.program},
                      why=f"the [program:{sup.program}] section of supervisord's config, to change it as the experiment says")
        if not prog.ok:
            raise ExperimentError(f"supervisord's config could not be read: {prog.error}")
        pf: supervise.ProgramFile = prog.output
        if supervise.sha256_of(pf.text) != pf.sha256:
            raise ExperimentError(f"{pf.path} does not read back as text byte for byte; debugagent does not edit it")
        values = self._program_values(pf, sup.program, srv, run)
        new = supervise.edit_program(pf.text, sup.program, values) if values else pf.text
        ctl = self._supervisorctl(r, sup)
        group = sup.group or sup.program
        spec = sup.program if group == sup.program else f"{group}:{sup.program}"
        backup = f"/tmp/debugagent-{self.run_id}-supervisor-{sup.program}.conf"
        self.push_undo("supervisor_restore", {"file": pf.path, "backup": backup, "ctl": ctl, "group": group, "spec": spec,
                                              "argv": srv.argv},
                       f"put {pf.path} back byte for byte from {backup}, then `{' '.join(ctl)} reread` and `update "
                       f"{group}` (supervisord restarts the server as found)")
        o = r.call("supervisor_apply", {"file": pf.path, "backup": backup, "sha256": pf.sha256, "content": new,
                                        "new_sha256": supervise.sha256_of(new), "ctl": ctl, "group": group, "spec": spec,
                                        "values": values, "program": sup.program},
                   why=f"restart with {change}, through supervisord: [program:{sup.program}] "
                       + ", ".join(f"{k}={v}" for k, v in values.items()) + f"; `supervisorctl update {group}`")
        if not o.ok:
            raise ExperimentError(o.error or "supervisorctl failed")
        self.started = {"run": run, "supervised": {"file": pf.path, "backup": backup, "sha256": pf.sha256, "ctl": ctl,
                                                   "group": group, "spec": spec, "values": values},
                        "change": change, "pid": o.output.pid}
        self.restarted()
        self._wait_ready(r, o.output.pid, None, 0)
        return o.output.pid

    def _program_values(self, pf: Any, program: str, srv: Any, run: ServerRun) -> dict[str, str]:
        """The section's lines the change writes: ``command=`` (its own words, with the flags changed),
        ``environment=``, ``directory=``."""
        import shlex
        values: dict[str, str] = {}
        cmd = supervise.program_value(pf.text, program, "command")
        if cmd is None:
            raise ExperimentError(f"{pf.path}: [program:{program}] has no command= line")
        if run.set_flags or run.unset_flags:
            values["command"] = shlex.join(edit_argv(shlex.split(cmd), run.set_flags, run.unset_flags))
        elif run.argv != srv.argv:
            values["command"] = shlex.join(run.argv)
        env_line = supervise.program_value(pf.text, program, "environment")
        env = supervise.parse_environment(env_line or "")
        changed = False
        for u in run.unset:
            if u in env:
                del env[u]
                changed = True
            elif u in (srv.env or {}):
                raise ExperimentError(f"{u} is not set by [program:{program}]'s environment= in {pf.path} but inherited "
                                      "from supervisord's own environment: change it where supervisord is started")
        for k, v in run.set.items():
            env[k] = v
            changed = True
        if run.path_first:
            old = env.get("PYTHONPATH") or (srv.env or {}).get("PYTHONPATH") or ""
            env["PYTHONPATH"] = ":".join([*run.path_first, *([old] if old else [])])
            changed = True
        if changed:
            values["environment"] = supervise.format_environment(env)
        if run.cwd != srv.cwd:
            values["directory"] = run.cwd
        return values

    def _supervisorctl(self, r: Runner, sup: Any) -> list[str]:
        """``supervisorctl -c CONFIG`` (beside the supervisord that runs, when it has one there)."""
        ctl = "supervisorctl"
        for a in sup.argv[:3]:
            if a.rsplit("/", 1)[-1] == "supervisord" and a.startswith("/"):
                ctl = a.rsplit("/", 1)[0] + "/supervisorctl"
        return [ctl, "-c", str(sup.config)]

    def _start_systemd(self, r: Runner, srv: Any, run: ServerRun, change: str, unit: str) -> int:
        """The change as a drop-in of the unit (``Environment=``, ``UnsetEnvironment=``, ``ExecStart=``,
        ``WorkingDirectory=``), ``daemon-reload``, restart; the undo removes it, reloads and restarts."""
        argv = run.argv if run.argv != srv.argv else None
        if argv and not argv[0].startswith("/"):
            raise ExperimentError(f"the unit {unit}'s new ExecStart= needs an absolute path, not {argv[0]!r}")
        env = dict(run.set)
        if run.path_first:
            old = (srv.env or {}).get("PYTHONPATH") or ""
            env["PYTHONPATH"] = ":".join([*run.path_first, *([old] if old else [])])
        path = supervise.dropin_path(unit, self.run_id)
        text = supervise.dropin_text(env, list(run.unset), argv, run.cwd if run.cwd != srv.cwd else None)
        self.push_undo("systemd_dropin_remove", {"unit": unit, "path": path, "remove_dir": True, "argv": srv.argv},
                       f"remove the drop-in {path}, `systemctl daemon-reload`, `systemctl restart {unit}` (the server "
                       "as found)")
        o = r.call("systemd_dropin", {"unit": unit, "path": path, "content": text},
                   why=f"restart with {change}, through systemd: the drop-in {path}, daemon-reload, restart {unit}")
        if not o.ok:
            said = o.result.stdout.strip().splitlines()[-1:] or [o.error or "systemctl failed"]
            if "no permission" in said[0] or "not installed" in said[0]:
                raise ExperimentError(f"the unit {unit} cannot be changed from this session: {said[0]}; debugagent "
                                      "changes a systemd unit only where it may write its drop-in and run systemctl: "
                                      "run it as root on the host, or give " + hook_hint().removeprefix("give "))
            raise ExperimentError(o.error or "systemctl failed")
        self.started = {"run": run, "supervised": {"unit": unit, "path": path, "content": text}, "change": change,
                        "pid": o.output.pid}
        self.restarted()
        self._wait_ready(r, o.output.pid, None, 0)
        return o.output.pid

    # ------------------------------------------------------------ a container's main process
    def _start_container(self, r: Runner, srv: Any, run: ServerRun, change: str, found: Any, changed: Any,
                         on_host: bool = False) -> int:
        """``--allow-container-recreate``: the container stopped and set aside (renamed), its changed copy started under
        its name from its own inspect with only the change; the undo (journalled first) removes the copy, renames the
        very container back and starts it (or, where it is gone, makes it again from the journalled inspect)."""
        from debugagent.tools.recreate import aside_name, command_line
        if not found.id:
            raise ExperimentError(f"`{found.runtime} inspect {found.name}` names no container id; debugagent does not "
                                  "recreate a container it cannot tell apart from its copy")
        new_run, found_run = changed.run_argv(found.name), found.run_argv(found.name)
        rt, n = found.runtime, found.name
        hp = {"host_pid": True} if on_host else {}
        self.push_undo("container_restore", {"runtime": rt, "name": n, "found_id": found.id, "found_run": found_run,
                                             "argv": list(srv.argv), **hp},
                       f"remove the changed container {n}, rename {aside_name(n)} (the container as found, id "
                       f"{found.id[:12]}) back to {n} and start it; where it is gone, make it again from its inspect: "
                       f"{command_line(found_run)[:300]}")
        o = r.call("container_recreate", {"runtime": rt, "name": n, "found_id": found.id, "run": new_run, **hp},
                   why=f"restart with {change}: the {rt} container {n} stopped and set aside as {aside_name(n)}, a new "
                       "one started under its name from its own inspect with only the change")
        if not o.ok:
            raise ExperimentError(o.error or f"`{rt} run` failed")
        self.started = {"run": run, "supervised": {"container": n, "runtime": rt}, "change": change, "pid": o.output.pid}
        self.restarted()
        self._wait_ready(r, o.output.pid, None, 0)
        return o.output.pid

    def _check_identity(self, r: Runner, pid: int) -> None:
        """The server this experiment started runs as the server was found (where a restart had to set it)."""
        st = self.started or {}
        want: mutate.Identity | None = st.get("identity")
        fields: set[str] = st.get("as_fields") or set()
        if want is None or not fields:
            return
        o = r.call("server_control", {"pid": pid}, why="does the restarted server run as the server was found?")
        got = o.output.identity if o.ok else None
        if got is None:
            raise ExperimentError(f"who the restarted server (pid {pid}) runs as could not be read")
        wrong = got.differs(want, fields)
        if wrong:
            raise ExperimentError(f"the restarted server (pid {pid}) runs as {got.describe(wrong)}, not as the "
                                  f"server was found ({want.describe(wrong)})")

    def start_again(self, r: Runner, why: str) -> int:
        """Restart the server this experiment started (a bisection step): same command line, new code under it."""
        st = self.started
        if st is None:
            raise ExperimentError("no experiment server to restart")
        run: ServerRun = st["run"]
        if "workload" in st:   # the worktree's checkout changed under the workload's command: its next run reads it
            return 0
        if "hook" in st:
            return self._start_by_hook(r, None, run, st["change"], again=True)
        if "supervised" in st:
            sv = st["supervised"]
            if "container" in sv:
                raise ExperimentError(f"the {sv['runtime']} container {sv['container']} is not recreated again for each "
                                      "step: a bisection needs the code on the host")
            if "unit" in sv:
                o = r.call("systemd_dropin", {"unit": sv["unit"], "path": sv["path"], "content": sv["content"]}, why=why)
            else:
                o = r.call("supervisor_apply", {"file": sv["file"], "backup": sv["backup"], "sha256": sv["sha256"],
                                                "ctl": sv["ctl"], "group": sv["group"], "spec": sv["spec"],
                                                "restart_only": True}, why=why)
            if not o.ok:
                raise ExperimentError(o.error or "restart failed")
            st["pid"] = o.output.pid
            self.restarted()
            self._wait_ready(r, o.output.pid, None, 0)
            return o.output.pid
        o = r.call("restart_server", {"stop_pid_file": st["pid_file"], "expect_argv": run.argv, "argv": run.argv,
                                      "cwd": run.cwd, "env_file": st["env_file"], "unset": run.unset, "set": run.set,
                                      "path_first": run.path_first, "pid_file": st["pid_file"], "log": st["log"],
                                      **({"ports": st["ports"]} if st.get("ports") else {}), **st.get("run_as", {})}, why=why)
        if not o.ok:
            raise ExperimentError(o.error or "restart failed")
        st["pid"] = o.output.pid
        self.on_started(st["pid_file"], o.output.pid, o.output.start)
        self.restarted()
        self._wait_ready(r, o.output.pid, o.output.log, o.output.log_size)
        self._check_identity(r, o.output.pid)
        return o.output.pid

    def _start_by_hook(self, r: Runner, srv: Any, run: ServerRun, change: str, again: bool = False) -> int:
        cmd = self.setup.restart_cmd or ""
        if not again:
            self.push_undo("restart_hook", {"cmd": cmd, "phase": "undo", "argv": srv.argv, "cwd": srv.cwd},
                           f"restart the server as it was found, by the restart hook `{cmd}`")
            self.started = {"run": run, "hook": cmd, "change": change}
        old = srv.pid if srv else int(self.started.get("pid") or 0) if self.started else 0
        o = r.call("restart_hook", {"cmd": cmd, "phase": "experiment", "pid": old, "argv": run.argv,
                                    "cwd": run.cwd, "set": run.set, "unset": run.unset, "path_first": run.path_first},
                   why=f"restart with {change}, by the restart hook")
        if not o.ok:
            raise ExperimentError(o.error or "the restart hook failed")
        self.restarted()
        new = self._await_new_server(r, old)
        if self.started is not None:
            self.started["pid"] = new
        self._wait_ready(r, new, None, 0)
        return new

    # ------------------------------------------------------------ waiting
    def _poll(self, probe: Callable[[float], Any], waiting: Callable[[float], str], too_long: str) -> Any:
        """``probe(elapsed)`` every 0.5 s until it returns something, with a progress line every 5 s;
        ``ExperimentError(too_long)`` after ``--ready-timeout``."""
        limit = self.ready_timeout_s
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
            srv = self.find_or_none(r)
            return srv.pid if srv is not None and srv.pid != old else None
        limit = self.ready_timeout_s
        return self._poll(probe, lambda t: f"waiting for the restarted server: {t:.0f} s of {limit:.0f} s",
                          f"no new server process appeared within {limit:.0f} s of the "
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
        limit = self.ready_timeout_s
        self._poll(probe, lambda t: f"waiting for server pid {pid}: {t:.0f} s of {limit:.0f} s (until {what})",
                   f"the server (pid {pid}) was not ready after {limit:.0f} s "
                   f"(waiting until {what}); give a longer --ready-timeout")
