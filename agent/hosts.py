"""``--host`` to a transport, through a table of schemes.

A ``--host`` value names its transport by a scheme before a colon (``sim:NAME``), by a bare word
(``local``), or by neither: then it is SSH (``user@host[:port]``, an ~/.ssh/config alias; ``ssh:`` in
front says so where a host's name would read as a scheme). Each ``HostScheme`` says how it is written
(the ``--host`` help is made from these), how a value is checked before anything connects (syntax only:
exit 2 with the fix) and how it is opened. A transport is added with one ``register`` call in the table
below (its module is imported only when a value of its scheme is opened)::

    register(HostScheme("docker", "docker:NAME", open=lambda rest, o: DockerTransport(rest)))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from debugagent.tools.errors import UsageError
from debugagent.tools.transport import BaseTransport, LocalTransport

from .config import SSHOptions

__all__ = ["SCHEMES", "HostScheme", "SSHOptions", "check_container", "check_host", "host_help", "open_transport", "register",
           "registered", "scheme_of"]

Opener = Callable[[str, SSHOptions], BaseTransport]


def no_check(rest: str) -> None:
    """Every value of the scheme is well formed (opening it says what is wrong)."""


@dataclass(frozen=True)
class HostScheme:
    """One kind of ``--host``.

    ``name``: the scheme, ``sim`` in ``sim:NAME``; with ``bare`` the whole value is the name (``local``).
    ``form``: how the ``--host`` help writes it. ``open(rest, ssh)``: the transport, open, for the value
    after ``name:`` (the whole value for the default scheme). ``check(rest)``: raise a ``UsageError`` (exit 2)
    for a value that can never work, before anything connects.
    """

    name: str
    form: str
    open: Opener
    check: Callable[[str], None] = no_check
    bare: bool = False
    sandbox: bool = False    # a simulated host: experiments need no consent (docs/security.md)


SCHEMES: dict[str, HostScheme] = {}
DEFAULT = "ssh"    # a value with no known scheme


def register(scheme: HostScheme) -> HostScheme:
    SCHEMES[scheme.name] = scheme
    return scheme


@contextmanager
def registered(scheme: HostScheme) -> Iterator[HostScheme]:
    """``scheme`` in the table for a while (a test's, a notebook's)."""
    before = SCHEMES.get(scheme.name)
    register(scheme)
    try:
        yield scheme
    finally:
        if before is None:
            SCHEMES.pop(scheme.name, None)
        else:
            SCHEMES[scheme.name] = before


def host_help() -> str:
    """The ``--host`` help: every scheme's form, the default first."""
    forms = [SCHEMES[DEFAULT].form] + [s.form for n, s in SCHEMES.items() if n != DEFAULT]
    return forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + ", or " + forms[-1]


def scheme_of(host: str) -> tuple[HostScheme, str]:
    """The scheme a ``--host`` value names, and the rest of the value it is opened with."""
    if not host or not host.strip():
        raise UsageError("--host is empty", fix=f"give {host_help()}")
    whole = SCHEMES.get(host)
    if whole is not None and whole.bare:
        return whole, ""
    name, colon, rest = host.partition(":")
    s = SCHEMES.get(name)
    if colon and s is not None and not s.bare:
        return s, rest
    return SCHEMES[DEFAULT], host


def check_host(host: str) -> HostScheme:
    """The value's scheme, once its syntax is checked (exit 2 with the fix); nothing connects."""
    scheme, rest = scheme_of(host)
    scheme.check(rest)
    return scheme


def open_transport(host: str, ssh: SSHOptions | None = None) -> BaseTransport:
    """The host's transport, open; with ``--container`` (``ssh.container``), each command runs in that container on it."""
    o = ssh or SSHOptions()
    scheme, rest = scheme_of(host)
    scheme.check(rest)
    if o.container:
        target = check_container(host, o.container)
        from debugagent.tools.container import ContainerTransport
        return ContainerTransport(target, scheme.open(rest, o))
    return scheme.open(rest, o)


def check_container(host: str, container: str | None) -> Any:
    """``--container`` checked against ``--host`` (syntax only, exit 2 with the fix): its ``Target``, None without it."""
    if not container:
        return None
    from debugagent.tools.container import parse_target
    scheme, _ = scheme_of(host)
    if scheme.name not in (DEFAULT, "local"):
        raise UsageError(f"--container {container} with --host {host}: a container is entered on an SSH host or on "
                         f"`local`, not on a {scheme.name}: host",
                         fix=f"give --host {container if ':' in container else 'docker:' + container} alone, or "
                         "--container with --host user@host / an ~/.ssh/config alias / local")
    return parse_target(container, "--container")


# ---------------------------------------------------------------- the table
def _open_ssh(rest: str, o: SSHOptions) -> BaseTransport:
    from debugagent.tools.ssh import SSHTransport
    return SSHTransport.from_spec(rest, identity_file=o.identity_file, known_hosts=o.known_hosts,
                                  accept_new=o.accept_new_host_key, connect_timeout=o.connect_timeout)


def _check_ssh(rest: str) -> None:
    from debugagent.tools.ssh.config import split_target
    split_target(rest)


def _open_sim(rest: str, o: SSHOptions) -> BaseTransport:
    from debugagent.tools.sim import SimTransport
    return SimTransport(f"sim:{rest}")


def _check_sim(rest: str) -> None:
    if not rest.strip() or rest.startswith("@"):
        raise UsageError(f"--host sim:{rest}: no scenario named",
                         fix="give sim:NAME (`debugagent sim list` names them), sim:NAME@good or sim:PATH.yaml")


register(HostScheme(DEFAULT, "user@host[:port], an ~/.ssh/config alias", _open_ssh, _check_ssh))
register(HostScheme("local", "`local`", lambda rest, o: LocalTransport(), bare=True))
register(HostScheme("sim", "sim:NAME[@good] / sim:PATH.yaml", _open_sim, _check_sim, sandbox=True))


def _container_scheme(kind: str, form: str) -> HostScheme:
    """``docker:NAME``, ``podman:NAME``, ``k8s:NS/POD[/C]``, ``nsenter:PID``: a container on this machine, entered by
    its runtime's exec (tools/container.py); ``--container`` enters one on an SSH host instead."""
    def check(rest: str) -> None:
        from debugagent.tools.container import parse_target
        parse_target(f"{kind}:{rest}")

    def open_(rest: str, o: SSHOptions) -> BaseTransport:
        from debugagent.tools.container import ContainerTransport, parse_target
        if o.container:
            raise UsageError(f"--host {kind}:{rest} with --container {o.container}: two containers named",
                             fix=f"give --host {kind}:{rest} alone, or --host SSH-HOST --container {o.container}")
        return ContainerTransport(parse_target(f"{kind}:{rest}"), LocalTransport())
    return HostScheme(kind, form, open_, check)


for _kind, _form in (("docker", "docker:NAME"), ("podman", "podman:NAME"), ("k8s", "k8s:NAMESPACE/POD[/CONTAINER]"),
                     ("nsenter", "nsenter:PID")):
    register(_container_scheme(_kind, _form))
