"""A container's server restarted with one change means a new container: the commands, built from the container's own
``docker inspect`` / ``podman inspect`` JSON with only the change applied, and for a Kubernetes pod the workload's
``kubectl`` commands. Pure functions: nothing here runs anything.

``ContainerSpec.of_inspect`` reads what ``RUNTIME run`` takes back: the image (as it was named), the entrypoint and
command (from ``Path``/``Args``, which name the process exactly, split as ``Config.Cmd`` says), the environment, user,
working folder, labels, mounts (bind, volume, tmpfs; written back by destination, a parent before a mount inside
it, whatever order the inspect lists them in), published ports, network mode, GPUs (``DeviceRequests``) and
devices, IPC mode, ``/dev/shm`` size, ulimits, restart policy, runtime, privileged, capabilities, security options,
init, PID mode, extra hosts and hostname where it was given. ``run_argv`` writes it back as ``RUNTIME run -d …``
(every argument quoted by ``command_line``).

A recreate keeps the container as found: it is stopped and renamed aside, the changed one is started under its name,
and the undo removes the changed one, renames the original back and starts it (the same container, id and writable
layer; ``recreate_plan``).

Where the two runtimes' JSON differ: podman writes ``Config.Entrypoint`` as one space-joined string (the list is
``Path`` and the head of ``Args``), reports ``IpcMode`` ``shareable`` for a container created with ``--ipc host``
(podman 4.3; its ``Config.CreateCommand`` says what was given) and adds its default ulimits (``RLIMIT_NOFILE``,
``RLIMIT_NPROC``); docker's ``--entrypoint`` takes one word, so a longer entrypoint moves its tail into the command
(the process's argv is the same).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ParseError

# a command for the host the container runs on, not for the container: a ``ContainerTransport`` sends it there
# unwrapped (on any other transport ``:`` is a no-op and the command runs where the others do)
OUTER = ": debugagent-container-host; "

RESERVED_ENV = ("HOSTNAME",)                 # set by the runtime for each container
PODMAN_DEFAULT_ENV = ("container=podman",)   # podman adds it to every container


class ContainerSpec(BaseModel):
    """What ``RUNTIME run`` needs to start the container again as it is."""

    runtime: str = "docker"
    name: str
    image: str
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)          # KEY=VALUE, in the inspect's order
    user: str = ""
    workdir: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    mounts: list[str] = Field(default_factory=list)       # --mount values
    tmpfs: list[str] = Field(default_factory=list)        # --tmpfs values
    ports: list[str] = Field(default_factory=list)        # -p values
    network: str = ""
    gpus: str = ""                                        # --gpus value
    devices: list[str] = Field(default_factory=list)      # --device values
    ipc: str = ""
    shm_size: int = 0
    ulimits: list[str] = Field(default_factory=list)      # --ulimit values
    restart: str = ""
    runtime_name: str = ""                                # --runtime (nvidia, …)
    privileged: bool = False
    cap_add: list[str] = Field(default_factory=list)
    cap_drop: list[str] = Field(default_factory=list)
    security_opt: list[str] = Field(default_factory=list)
    init: bool = False
    pid: str = ""
    add_host: list[str] = Field(default_factory=list)
    hostname: str = ""
    id: str = ""                                          # the container's id (not a `run` option)

    @property
    def argv(self) -> list[str]:
        """The server's command line in the container (its pid 1)."""
        return [*self.entrypoint, *self.cmd]

    # ------------------------------------------------------------ reading
    @classmethod
    def of_inspect(cls, text: str | list[Any] | dict[str, Any], runtime: str = "docker") -> ContainerSpec:
        """The spec of the one container ``RUNTIME inspect NAME`` printed."""
        try:
            data = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as exc:
            raise ParseError(f"not JSON: {exc}", tool="container_inspect", excerpt=str(text)[:120]) from None
        if isinstance(data, list):
            if len(data) != 1:
                raise ParseError(f"{len(data)} objects where one container was asked", tool="container_inspect",
                                 excerpt=str(text)[:120])
            data = data[0]
        if not isinstance(data, dict) or "Config" not in data or "HostConfig" not in data:
            raise ParseError("no Config and HostConfig: not a container's inspect", tool="container_inspect",
                             excerpt=str(text)[:120])
        c, h = data["Config"] or {}, data["HostConfig"] or {}
        cmd = list(c.get("Cmd") or [])
        process = [data["Path"], *(data.get("Args") or [])] if data.get("Path") else []
        ep = c.get("Entrypoint")
        if process and process[len(process) - len(cmd):] == cmd and (ep or len(process) > len(cmd)):
            entrypoint = process[:len(process) - len(cmd)]   # Path and Args name the process exactly
        elif isinstance(ep, list):
            entrypoint = list(ep)
        else:
            entrypoint = shlex.split(ep) if ep else []
        name = str(data.get("Name") or "").lstrip("/")
        image = (data.get("ImageName") if runtime == "podman" else None) or c.get("Image") or data.get("Image") or ""
        env = [e for e in c.get("Env") or [] if e.split("=", 1)[0] not in RESERVED_ENV
               and not (runtime == "podman" and e in PODMAN_DEFAULT_ENV)]
        spec = cls(runtime=runtime, name=name, image=image, entrypoint=entrypoint, cmd=cmd, env=env,
                   user=c.get("User") or "", workdir=c.get("WorkingDir") or "", labels=dict(c.get("Labels") or {}),
                   mounts=_mounts(data.get("Mounts") or []), tmpfs=[f"{k}:{v}" if v else k for k, v in (h.get("Tmpfs") or {}).items()],
                   ports=_ports(h.get("PortBindings") or {}), network=_network(h.get("NetworkMode") or ""),
                   gpus=_gpus(h.get("DeviceRequests") or []),
                   devices=[":".join(x for x in (d.get("PathOnHost"), d.get("PathInContainer"), d.get("CgroupPermissions")) if x)
                            for d in h.get("Devices") or []],
                   ipc=_ipc(h.get("IpcMode") or "", c.get("CreateCommand") or []), shm_size=int(h.get("ShmSize") or 0),
                   ulimits=[f"{_ulimit_name(u['Name'])}={u['Soft']}:{u['Hard']}" for u in h.get("Ulimits") or []],
                   restart=_restart(h.get("RestartPolicy") or {}), runtime_name=_runtime(h.get("Runtime") or ""),
                   privileged=bool(h.get("Privileged")), cap_add=list(h.get("CapAdd") or []),
                   cap_drop=list(h.get("CapDrop") or []),
                   security_opt=[s for s in h.get("SecurityOpt") or [] if not s.startswith("label=") or runtime == "docker"],
                   init=bool(h.get("Init")), pid=h.get("PidMode") or "", add_host=list(h.get("ExtraHosts") or []),
                   hostname=_hostname(c.get("Hostname") or "", str(data.get("Id") or ""), h.get("NetworkMode") or ""),
                   id=str(data.get("Id") or ""))
        if not spec.name or not spec.image:
            raise ParseError("the inspect names no container or image", tool="container_inspect", excerpt=str(text)[:120])
        return spec

    # ------------------------------------------------------------ changing
    def changed(self, argv: list[str] | None = None, set_env: dict[str, str] | None = None,
                unset_env: list[str] | None = None) -> ContainerSpec:
        """This container with only the change applied: the server's command line, environment variables set or unset."""
        out = self.model_copy(deep=True, update={"id": ""})
        if argv is not None and argv != self.argv:
            n = len(self.entrypoint)
            if argv[:n] == self.entrypoint:
                out.cmd = argv[n:]
            else:
                out.entrypoint, out.cmd = argv[:1], argv[1:]
        drop = set(unset_env or []) | set(set_env or {})
        env = [e for e in out.env if e.split("=", 1)[0] not in drop]
        out.env = env + [f"{k}={v}" for k, v in (set_env or {}).items()]
        return out

    # ------------------------------------------------------------ writing
    def run_argv(self, name: str | None = None) -> list[str]:
        """``RUNTIME run -d --name NAME … IMAGE CMD…``: this container, started again."""
        a = [self.runtime, "run", "-d", "--name", name or self.name]
        ep, cmd = self.entrypoint, self.cmd
        if ep:
            if len(ep) > 1 and self.runtime == "docker":   # docker's --entrypoint is one word: the rest leads the command
                ep, cmd = ep[:1], [*ep[1:], *cmd]
            a += ["--entrypoint", ep[0] if len(ep) == 1 else json.dumps(ep)]
        for e in self.env:
            a += ["-e", e]
        if self.user:
            a += ["--user", self.user]
        if self.workdir:
            a += ["--workdir", self.workdir]
        if self.hostname:
            a += ["--hostname", self.hostname]
        for k, v in sorted(self.labels.items()):
            a += ["--label", f"{k}={v}"]
        for m in by_destination(self.mounts, lambda m: _option(m, "dst") or _option(m, "destination") or _option(m, "target")):
            a += ["--mount", m]
        for t in by_destination(self.tmpfs, lambda t: t.split(":", 1)[0]):
            a += ["--tmpfs", t]
        if self.network:
            a += ["--network", self.network]
        for p in self.ports:
            a += ["-p", p]
        if self.gpus:
            a += ["--gpus", self.gpus]
        for d in self.devices:
            a += ["--device", d]
        if self.ipc:
            a += ["--ipc", self.ipc]
        if self.shm_size and self.ipc != "host":
            a += ["--shm-size", str(self.shm_size)]
        for u in self.ulimits:
            a += ["--ulimit", u]
        if self.restart:
            a += ["--restart", self.restart]
        if self.runtime_name:
            a += ["--runtime", self.runtime_name]
        if self.privileged:
            a.append("--privileged")
        for x in self.cap_add:
            a += ["--cap-add", x]
        for x in self.cap_drop:
            a += ["--cap-drop", x]
        for x in self.security_opt:
            a += ["--security-opt", x]
        if self.init:
            a.append("--init")
        if self.pid:
            a += ["--pid", self.pid]
        for x in self.add_host:
            a += ["--add-host", x]
        return [*a, self.image, *cmd]


class ContainerInspect(BaseModel):
    """``RUNTIME inspect --type container NAME`` on the host the container runs on (read-only): its spec."""

    model_config = ConfigDict(extra="forbid")
    runtime: str = Field(pattern=r"^(docker|podman)$")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

    def command(self) -> str:
        return f"{OUTER}{self.runtime} inspect --type container {shlex.quote(self.name)}"


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def recreate_plan(found: ContainerSpec, changed: ContainerSpec, aside: str) -> tuple[list[str], list[str]]:
    """The commands that replace the container by its changed copy, and the undo that puts the very container back."""
    r, n = found.runtime, found.name
    q = shlex.quote
    do = [f"{r} stop {q(n)}", f"{r} rename {q(n)} {q(aside)}", command_line(changed.run_argv(n))]
    undo = [f"{r} rm -f {q(n)}", f"{r} rename {q(aside)} {q(n)}", f"{r} start {q(n)}"]
    return do, undo


def k8s_plan(namespace: str, pod: str, container: str, argv: list[str] | None, set_env: dict[str, str] | None,
             unset_env: list[str] | None) -> tuple[list[str], list[str]]:
    """A Kubernetes workload is never changed by debugagent: the commands a person runs on the pod's Deployment (its
    name from the pod's, as a Deployment names its pods; ``kubectl get pod … ownerReferences`` says for sure)."""
    q = shlex.quote
    parts = pod.split("-")
    deploy = "-".join(parts[:-2]) if len(parts) > 2 else pod
    ref = f"deployment/{deploy}"
    c = container or "CONTAINER"
    do = [f"kubectl -n {q(namespace)} get pod {q(pod)} -o jsonpath='{{.metadata.ownerReferences[0].name}}'  "
          f"# the ReplicaSet: its name less the last `-HASH` is the Deployment (here taken as {deploy})"]
    if argv is not None:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": c, "command": argv, "args": None}]}}}}
        do.append(f"kubectl -n {q(namespace)} patch {ref} -p {q(json.dumps(patch, separators=(',', ':')))}")
    if set_env or unset_env:
        kv = [f"{k}={v}" for k, v in (set_env or {}).items()] + [f"{k}-" for k in unset_env or []]
        do.append(f"kubectl -n {q(namespace)} set env {ref} -c {q(c)} " + " ".join(q(x) for x in kv))
    do.append(f"kubectl -n {q(namespace)} rollout status {ref}")
    undo = [f"kubectl -n {q(namespace)} rollout undo {ref}", f"kubectl -n {q(namespace)} rollout status {ref}"]
    return do, undo


# ---------------------------------------------------------------- the inspect's fields, as `run` takes them
def by_destination(values: list[str], destination: Callable[[str], str]) -> list[str]:
    """``values`` (mount options) by their destination's path, folder by folder: a parent before what is mounted
    inside it (``/a`` before ``/a/b``), the order an inspect lists them in (podman 4.3 gives no fixed one) kept
    only between mounts at the same destination."""
    return sorted(values, key=lambda v: tuple(p for p in destination(v).split("/") if p))


def _option(mount: str, key: str) -> str:
    """The value of ``key`` in a ``--mount`` value (``type=bind,src=/x,dst=/y,readonly``), else ""."""
    for part in mount.split(","):
        k, _, v = part.partition("=")
        if k == key:
            return v
    return ""


def _mounts(mounts: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in mounts:
        kind = m.get("Type") or "bind"
        if kind == "tmpfs":
            continue   # HostConfig.Tmpfs names them with their options
        src = m.get("Name") if kind == "volume" else m.get("Source")
        v = f"type={kind},src={src},dst={m['Destination']}"
        if m.get("RW") is False:
            v += ",readonly"
        out.append(v)
    return out


def _ports(bindings: dict[str, Any]) -> list[str]:
    out = []
    for cport, hosts in sorted(bindings.items()):
        for b in hosts or [{}]:
            ip, hp = (b or {}).get("HostIp") or "", (b or {}).get("HostPort") or ""
            ipw = f"[{ip}]" if ":" in ip else ip
            out.append(":".join(x for x in (ipw, hp) if x) + f":{cport}" if (ip or hp) else cport)
    return out


def _network(mode: str) -> str:
    return "" if mode in ("", "default") else mode


def _gpus(requests: list[dict[str, Any]]) -> str:
    for r in requests:
        if any("gpu" in caps for caps in r.get("Capabilities") or []):
            if r.get("DeviceIDs"):
                return '"device=' + ",".join(r["DeviceIDs"]) + '"'
            return "all" if int(r.get("Count") or 0) < 0 else str(r.get("Count"))
    return ""


def _ipc(mode: str, create: list[str]) -> str:
    for i, a in enumerate(create):   # podman's own record of what was given, where its IpcMode does not say
        if a == "--ipc" and i + 1 < len(create):
            return create[i + 1]
        if a.startswith("--ipc="):
            return a.split("=", 1)[1]
    return "" if mode in ("", "private", "shareable") else mode


def _ulimit_name(name: str) -> str:
    return name.lower().removeprefix("rlimit_")


def _restart(policy: dict[str, Any]) -> str:
    name = policy.get("Name") or ""
    if name in ("", "no"):
        return ""
    n = int(policy.get("MaximumRetryCount") or 0)
    return f"{name}:{n}" if name == "on-failure" and n else name


def _runtime(name: str) -> str:
    return "" if name in ("", "runc", "oci", "crun") else name


def _hostname(hostname: str, cid: str, network: str) -> str:
    """The hostname where it was given: not the runtime's default (the id's first 12 characters; the host's own on
    the host network)."""
    if not hostname or network == "host" or (cid and cid.startswith(hostname)):
        return ""
    return hostname


# ---------------------------------------------------------------- the recreate itself (--allow-container-recreate)
def aside_name(name: str) -> str:
    """The name the container as found keeps while its changed copy runs under its own."""
    return f"{name}.debugagent-found"


def _main_pid(rt: str, n: str, host_pid: bool = False) -> str:
    """Shell that prints ``started pid=N``: the container's main process as its own commands number it (1 in its
    pid namespace; the host's pid where it shares the host's, or where the commands run on the host)."""
    if host_pid:
        return f"echo \"started pid=$({rt} inspect --type container -f '{{{{.State.Pid}}}}' {n})\""
    return (f"mode=$({rt} inspect --type container -f '{{{{.HostConfig.PidMode}}}}' {n} 2>/dev/null); "
            f"if [ \"$mode\" = host ]; then pid=$({rt} inspect --type container -f '{{{{.State.Pid}}}}' {n}); else pid=1; fi; "
            "echo \"started pid=$pid\"")


def _check_run(run: list[str], runtime: str, name: str) -> None:
    if run[:5] != [runtime, "run", "-d", "--name", name]:
        raise ValueError(f"not `{runtime} run -d --name {name} …`: {command_line(run[:5])}")


class ContainerRecreate(BaseModel):
    """Replace the container by its changed copy, on the host it runs on: ``RUNTIME stop NAME``, ``RUNTIME rename
    NAME ASIDE``, ``RUNTIME run -d --name NAME …`` (``run``: built by ``ContainerSpec.run_argv`` from the container's
    own inspect with only the change). Refused, before anything changes, unless NAME is still the container found
    (``found_id``). Its undo (``container_restore``) is journalled first."""

    model_config = ConfigDict(extra="forbid")
    runtime: str = Field(pattern=r"^(docker|podman)$")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    found_id: str = Field(pattern=r"^[0-9a-f]{12,64}$")
    run: list[str]
    host_pid: bool = False   # the commands run on the container's host (not in the container): its pids are the host's

    @model_validator(mode="after")
    def _runs_that_container(self) -> ContainerRecreate:
        _check_run(self.run, self.runtime, self.name)
        return self

    def command(self) -> str:
        rt, n, a = self.runtime, shlex.quote(self.name), shlex.quote(aside_name(self.name))
        return (f"{OUTER}id=$({rt} inspect --type container -f '{{{{.Id}}}}' {n} 2>/dev/null); "
                f"[ \"$id\" = {shlex.quote(self.found_id)} ] || {{ echo \"{self.name} is not the container found "
                f"(id ${{id:-none}}); nothing changed\"; exit 1; }}; "
                f"{rt} stop {n} >/dev/null || exit 1; {rt} rename {n} {a} || exit 1; "
                f"{command_line(self.run)} || exit 1; " + _main_pid(rt, n, self.host_pid))

    def display_command(self) -> str:
        return (f"{OUTER}{self.runtime} stop {self.name}; {self.runtime} rename {self.name} {aside_name(self.name)}; "
                + command_line(self.run))


class ContainerRestore(BaseModel):
    """The undo of ``container_recreate``: the very container back under its name. Whatever runs under NAME that is
    not the container found is removed, the one set aside is renamed back, and it is started; where the container
    found is gone (removed by hand), it is made again from its journalled inspect (``found_run``: the same name,
    image, command, environment, mounts, ports). Re-runnable from any point: each command finds the host as it is."""

    model_config = ConfigDict(extra="forbid")
    runtime: str = Field(pattern=r"^(docker|podman)$")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    found_id: str = Field(pattern=r"^[0-9a-f]{12,64}$")
    found_run: list[str]                                # the container as found, as `run` would make it again
    argv: list[str] = Field(default_factory=list)       # the server as found (what the as-found check looks for)
    host_pid: bool = False                              # the commands run on the container's host: its pids

    @model_validator(mode="after")
    def _runs_that_container(self) -> ContainerRestore:
        _check_run(self.found_run, self.runtime, self.name)
        return self

    def command(self) -> str:
        rt, n, a = self.runtime, shlex.quote(self.name), shlex.quote(aside_name(self.name))
        fid = shlex.quote(self.found_id)
        idof = f"{rt} inspect --type container -f '{{{{.Id}}}}'"
        return (f"{OUTER}id=$({idof} {n} 2>/dev/null); "
                f"if [ -n \"$id\" ] && [ \"$id\" != {fid} ]; then {rt} rm -f {n} >/dev/null || exit 1; id=; fi; "
                f"if [ -z \"$id\" ] && [ \"$({idof} {a} 2>/dev/null)\" = {fid} ]; then {rt} rename {a} {n} || exit 1; id={fid}; fi; "
                f"if [ -z \"$id\" ]; then echo 'the container found is gone: made again from its inspect'; "
                f"{command_line(self.found_run)} || exit 1; else {rt} start {n} >/dev/null || exit 1; fi; "
                + _main_pid(rt, n, self.host_pid))

    def display_command(self) -> str:
        rt, n = self.runtime, self.name
        return f"{OUTER}{rt} rm -f {n}; {rt} rename {aside_name(n)} {n}; {rt} start {n}"


def inspect_fields(data: dict[str, Any], runtime: str) -> dict[str, Any]:
    """What the as-found check compares of a container: its id, whether it runs, and every field of its spec."""
    spec = ContainerSpec.of_inspect([data], runtime=runtime)
    state = data.get("State") or {}
    return {"id": str(data.get("Id") or ""), "running": bool(state.get("Running")),
            **{k: v for k, v in spec.model_dump().items() if k not in ("runtime", "id")}}
