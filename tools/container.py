"""``ContainerTransport``: every command run inside a container, through its runtime's exec, on an outer transport.

The outer transport is this machine (``--host docker:NAME``) or the SSH host the container runs on (``--host gpu-box
--container NAME``); each command becomes one exec of the runtime's CLI there:

::

    docker:NAME              docker exec -i NAME sh -c RUN sh COMMAND
    podman:NAME              podman exec -i NAME sh -c RUN sh COMMAND
    k8s:NS/POD[/CONTAINER]   kubectl exec -i -n NS POD [-c CONTAINER] -- sh -c RUN sh COMMAND
    nsenter:PID              nsenter --target PID --mount --uts --ipc --net --pid --root --wd -- sh -c RUN sh COMMAND

``RUN`` hands ``COMMAND`` (one positional argument, quoted once) to bash where the container has it (the probes'
commands are bash's, as over SSH and ``local``), else to its ``sh``. Timeouts, output caps, retries, redaction and
recording are the outer transport's and the run's, unchanged: a command's ``CommandResult`` names the command as the
probe wrote it and the container's host label, and ``display`` is the line a person would paste on the outer host.

``check`` (once, when the transport is opened) tells apart what would otherwise read as a probe's failure: the
runtime's CLI missing on the outer host (exit 4), no permission to use it (exit 4), no such container or pod
(exit 2), each with the fix; nothing is run in the container before it passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConnectError, TransportError, UsageError
from .recreate import OUTER
from .transport import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT_S, BaseTransport, CommandResult, EventSink, q

KINDS = ("docker", "podman", "k8s", "nsenter")
CLI = {"docker": "docker", "podman": "podman", "k8s": "kubectl", "nsenter": "nsenter"}
# bash where the container has it, else its sh; the command is $1, never pasted into this text
RUN = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; else exec sh -c "$1"; fi'
# a name as docker and podman allow ([a-zA-Z0-9][a-zA-Z0-9_.-]*) or a container id; a Kubernetes name (RFC 1123)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
FORMS = {"docker": "docker:NAME", "podman": "podman:NAME", "k8s": "k8s:NAMESPACE/POD[/CONTAINER]", "nsenter": "nsenter:PID"}


@dataclass(frozen=True)
class Target:
    """One container: its runtime (``KINDS``) and how that runtime names it."""

    kind: str
    name: str = ""            # docker/podman: the container's name or id; k8s: the pod
    namespace: str = ""       # k8s
    container: str = ""       # k8s: the pod's container ("" for its default one)
    pid: int = 0              # nsenter: a process of the container, as the outer host numbers it

    @property
    def label(self) -> str:
        if self.kind == "k8s":
            return f"k8s:{self.namespace}/{self.name}" + (f"/{self.container}" if self.container else "")
        return f"nsenter:{self.pid}" if self.kind == "nsenter" else f"{self.kind}:{self.name}"

    def exec_argv(self) -> list[str]:
        """The runtime's exec, up to the shell it starts in the container."""
        if self.kind in ("docker", "podman"):
            return [CLI[self.kind], "exec", "-i", self.name, "sh", "-c", RUN, "sh"]
        if self.kind == "k8s":
            return ["kubectl", "exec", "-i", "-n", self.namespace, self.name, *(["-c", self.container] if self.container else []),
                    "--", "sh", "-c", RUN, "sh"]
        return ["nsenter", "--target", str(self.pid), "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd",
                "--", "sh", "-c", RUN, "sh"]

    def wrap(self, command: str) -> str:
        """``command`` run in the container, as one command line of the outer host (every argument quoted)."""
        return " ".join(q(a) for a in [*self.exec_argv(), command])

    def list_hint(self) -> str:
        """The command that names the containers this form can reach."""
        if self.kind in ("docker", "podman"):
            return f"`{CLI[self.kind]} ps --format '{{{{.Names}}}}'` names the running ones"
        if self.kind == "k8s":
            return f"`kubectl get pods -n {q(self.namespace)}` names the pods" + (
                f", `kubectl get pod -n {q(self.namespace)} {q(self.name)} -o jsonpath='{{.spec.containers[*].name}}'` "
                "their containers" if self.container else "")
        return "`ps -eo pid,comm` on the host names the processes; give one of the container's (its server's)"


def parse_target(value: str, flag: str = "--host") -> Target:
    """``docker:NAME``, ``podman:NAME``, ``k8s:NS/POD[/C]`` or ``nsenter:PID`` (a bare NAME: docker); exit 2 with the fix."""
    kind, colon, rest = value.partition(":")
    if not colon:
        kind, rest = "docker", value
    if kind not in KINDS:
        kind, rest = "docker", value
    forms = ", ".join(FORMS.values())
    if kind == "nsenter":
        if not rest.isdigit() or int(rest) <= 0:
            raise UsageError(f"{flag} {value}: `{rest}` is not a process id", fix="give nsenter:PID, PID a process of the "
                             "container as the host numbers it (`docker inspect -f '{{.State.Pid}}' NAME` names the main one)")
        return Target("nsenter", pid=int(rest))
    if kind == "k8s":
        parts = rest.split("/")
        if len(parts) not in (2, 3) or not all(K8S_NAME.fullmatch(p) for p in parts):
            raise UsageError(f"{flag} {value}: not NAMESPACE/POD or NAMESPACE/POD/CONTAINER (lower-case names of "
                             "letters, digits, `-` and `.`)", fix="give k8s:NAMESPACE/POD[/CONTAINER], e.g. k8s:serving/vllm-0")
        return Target("k8s", name=parts[1], namespace=parts[0], container=parts[2] if len(parts) == 3 else "")
    if not NAME.fullmatch(rest):
        raise UsageError(f"{flag} {value}: `{rest}` is not a container name (letters, digits, `_`, `.`, `-`; not "
                         "starting with `-`)", fix=f"give {forms}")
    return Target(kind, name=rest)


class ContainerTransport(BaseTransport):
    """Runs each command inside ``target`` by its runtime's exec on ``outer`` (this machine or an SSH host)."""

    def __init__(self, target: Target, outer: BaseTransport, *, check: bool = True) -> None:
        self.target = target
        self.outer = outer
        self.host = target.label if outer.host == "local" else f"{outer.host}/{target.label}"
        self.max_parallel = outer.max_parallel
        self.supports_retry = outer.supports_retry
        if check:
            try:
                self.check()
            except BaseException:
                outer.close()
                raise

    # the outer transport's connection is this one's
    @property  # type: ignore[override]
    def reconnects(self) -> int:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.outer.reconnects

    @property
    def on_event(self) -> EventSink:
        return self.outer.on_event

    @on_event.setter
    def on_event(self, sink: EventSink) -> None:
        self.outer.on_event = sink

    def run(self, command: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT,
            **kw: object) -> CommandResult:
        sent = command if command.startswith(OUTER) else self.target.wrap(command)   # the container's host's own
        r = self.outer.run(sent, timeout=timeout, max_output=max_output, **kw)  # type: ignore[call-arg]
        return r.model_copy(update={"command": command, "host": self.host})

    def display(self, command: str) -> str:
        return self.outer.display(command[len(OUTER):] if command.startswith(OUTER) else self.target.wrap(command))

    def close(self) -> None:
        self.outer.close()

    # ------------------------------------------------------------ can it be used at all?
    def check(self) -> None:
        """The runtime's CLI is there, may be used, and reaches the container: else exit 4 or 2 with the fix."""
        t, where = self.target, ("this machine" if self.outer.host == "local" else self.outer.host)
        cli = CLI[t.kind]
        r = self.outer.run(f"command -v {q(cli)} >/dev/null 2>&1 || exit 127; " + t.wrap("exit 0"), timeout=60)
        if r.ok:
            return
        said = (r.stderr + "\n" + r.stdout).strip()
        tail = " ".join(said.splitlines()[-3:])[:400]
        if r.timed_out:
            raise ConnectError(f"{t.label}: `{cli}` did not answer within 60 s on {where}", host=self.host,
                               fix=f"check that {cli} works there (`{self.outer.display(cli + ' version')}`)")
        if r.exit_code == 127 and not said:
            raise TransportError(f"{t.label}: `{cli}` is not installed on {where} (not on its PATH)", host=self.host,
                                 fix=INSTALL[t.kind] + f"; or reach the container another way ({', '.join(FORMS.values())})")
        low = said.lower()
        if any(s in low for s in ("permission denied", "operation not permitted", "forbidden", "unauthorized")):
            raise TransportError(f"{t.label}: no permission to use {cli} on {where}: {tail}", host=self.host,
                                 fix=PERMISSION[t.kind])
        gone = t.kind == "nsenter" and "no such file or directory" in low
        if gone or any(s in low for s in ("no such container", "no such object", "not found", "no such process",
                                          "is not running", "no container with name or id", "does not exist")):
            raise UsageError(f"{t.label}: no such {'pod or container' if t.kind == 'k8s' else 'process' if t.kind == 'nsenter' else 'running container'} "
                             f"on {where}: {tail}", fix=f"check the name: {t.list_hint()}")
        if any(s in low for s in ("cannot connect", "connection refused", "is the docker daemon running", "unable to connect",
                                  "no such file or directory", "did you specify the right host or port")) and t.kind != "nsenter":
            raise ConnectError(f"{t.label}: {cli} cannot reach its {'cluster' if t.kind == 'k8s' else 'daemon'} on {where}: {tail}", host=self.host,
                               fix=DAEMON[t.kind])
        if r.exit_code in (126, 127):
            raise TransportError(f"{t.label}: the container has no `sh` to run commands in (exit {r.exit_code}): {tail}",
                                 host=self.host, fix="debugagent's commands need a shell in the container; use "
                                 "nsenter:PID with a process of it, which enters only its namespaces")
        raise TransportError(f"{t.label}: `{cli}` could not run a command in the container on {where} (exit {r.exit_code}): "
                             f"{tail}", host=self.host, fix=f"run `{self.outer.display(t.wrap('true'))}` by hand to see why")


INSTALL = {"docker": "install Docker's CLI there (apt-get install docker.io)",
           "podman": "install podman there (apt-get install podman)",
           "k8s": "install kubectl there and give it a kubeconfig (KUBECONFIG)",
           "nsenter": "install util-linux there (apt-get install util-linux)"}
PERMISSION = {"docker": "run debugagent as root or as a user of the `docker` group (its socket, /var/run/docker.sock, "
                        "admits no one else)",
              "podman": "run debugagent as the user who owns the container (rootless podman's containers are per user), "
                        "or as root for root's",
              "k8s": "give the kubeconfig's user the `pods/exec` permission in that namespace (`kubectl auth can-i create "
                     "pods/exec -n NAMESPACE` says whether it has it)",
              "nsenter": "run debugagent as root (entering another process's namespaces needs CAP_SYS_ADMIN and "
                         "CAP_SYS_PTRACE)"}
DAEMON = {"docker": "start the daemon (`systemctl start docker`) or point DOCKER_HOST at it",
          "podman": "check `podman info` there (its storage and runtime)",
          "k8s": "point kubectl at the cluster (KUBECONFIG, `kubectl config current-context`)",
          "nsenter": ""}
