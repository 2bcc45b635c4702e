"""``--host`` to a transport: ``local``, ``sim:NAME[@good]``, ``sim:PATH.yaml``, or SSH."""

from __future__ import annotations

from dataclasses import dataclass

from tools.errors import UsageError
from tools.transport import BaseTransport, LocalTransport


@dataclass
class SSHOptions:
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    connect_timeout: float = 10.0


def open_transport(host: str, ssh: SSHOptions | None = None) -> BaseTransport:
    if not host or not host.strip():
        raise UsageError("--host is empty", fix="give `user@host[:port]`, an ~/.ssh/config alias, `local` or `sim:NAME`")
    if host == "local":
        return LocalTransport()
    if host.startswith("sim:"):
        from tools.sim import SimTransport
        return SimTransport(host)
    from tools.ssh import SSHTransport
    o = ssh or SSHOptions()
    return SSHTransport.from_spec(host, identity_file=o.identity_file, known_hosts=o.known_hosts,
                                  accept_new=o.accept_new_host_key, connect_timeout=o.connect_timeout)
