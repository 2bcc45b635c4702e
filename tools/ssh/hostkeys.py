"""Host keys decided as OpenSSH decides them (``Policy``, over tools/known_hosts.py), and the paramiko
Transport that asks for the key types known_hosts holds (``fast_transport``)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
from typing import Any

import paramiko

from .. import known_hosts
from .exceptions import HostKeyRefused


class Policy(paramiko.MissingHostKeyPolicy):
    """Every host key is decided here, as OpenSSH decides it (tools/known_hosts.py): the client's
    own host-key table is left empty, so paramiko asks about every key. An unknown key is refused,
    or with accept_new appended as one line under a lock; a changed or revoked key always refused.

    ``files`` are the known_hosts files ssh would read (``UserKnownHostsFile`` and
    ``GlobalKnownHostsFile``); ``alias`` is ``HostKeyAlias``; ``check_ip`` is ``CheckHostIP``, which
    ssh applies only when the peer's address (``ip``, set once the socket is open) is not a loopback
    address, the host was not given as that address, and no proxy carries the connection: then a
    key that another line holds for the address is refused, as ssh's strict checking refuses it,
    and a new key is recorded under the address too. ``hash_names`` is ``HashKnownHosts``."""

    def __init__(self, files: known_hosts.Files, accept_new: bool, host: str, port: int, *, alias: str | None = None,
                 check_ip: bool = False, hash_names: bool = False) -> None:
        self.files, self.accept_new, self.host, self.port = files, accept_new, host, port
        self.alias, self.check_ip, self.hash_names = alias, check_ip, hash_names
        self.ip: str | None = None
        self.added: str | None = None

    @property
    def name(self) -> str:
        return self.alias or known_hosts.lookup_name(self.host, self.port)

    def ip_name(self) -> str | None:
        """The address ssh also checks under CheckHostIP, or None where it does not."""
        if not self.check_ip or not self.ip or self.alias:
            return None
        try:
            addr = ipaddress.ip_address(self.ip)
        except ValueError:
            return None
        if addr.is_loopback or self.host.strip("[]") == self.ip:
            return None
        return known_hosts.lookup_name(self.ip, self.port)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entries = self.files.entries()
        cert = getattr(key, "public_blob", None)
        if cert is not None and cert.key_type.endswith("-cert-v01@openssh.com"):
            decided = known_hosts.check_cert(entries, self.host, self.port, cert.key_blob, key.asbytes(), alias=self.alias)
            if decided is not None and decided.status == "ok":
                return
            if decided is not None:
                raise HostKeyRefused(self.name, key, self._where(decided))
        # a plain key, or a certificate no known authority vouches for: its plain key decides (as ssh)
        verdict = self._where(known_hosts.verify(entries, self.host, self.port, key.get_name(), key.asbytes(),
                                                 alias=self.alias))
        ip_name = self.ip_name()
        ip_verdict = known_hosts.check(entries, ip_name, key.get_name(), key.asbytes()) if ip_name else None
        if verdict.status in ("ok", "unknown") and ip_verdict is not None and ip_verdict.status == "changed":
            raise HostKeyRefused(self.name, key, self._where(ip_verdict), ip=ip_name)
        if verdict.status == "ok":
            return
        if verdict.status != "unknown" or not self.accept_new:
            raise HostKeyRefused(self.name, key, verdict)
        target = self.files.append_to
        if target is None:   # UserKnownHostsFile none: nowhere to record it
            raise HostKeyRefused(self.name, key, verdict)
        names = [self.name] + ([ip_name] if ip_name and ip_verdict is not None and ip_verdict.status == "unknown" else [])
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{known_hosts.hash_name(n) if self.hash_names else n} {key.get_name()} {key.get_base64()}\n"
                 for n in names]
        with open(target, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.writelines(lines)
            fcntl.flock(f, fcntl.LOCK_UN)
        self.added = lines[0].strip()

    def _where(self, v: known_hosts.Verdict) -> known_hosts.Verdict:
        """The verdict with the file that decided it (the first user file where no line did)."""
        path = v.entry.path if v.entry is not None and v.entry.path is not None else self.files.append_to
        return known_hosts.Verdict(v.status, v.entry, path)


# what paramiko.Transport opens over: an address, a socket, another transport's channel or a ProxyCommand
SocketLike = str | tuple[str, int] | socket.socket | paramiko.Channel | paramiko.ProxyCommand


def fast_transport(sock: SocketLike, known_types: list[str] | None = None, certs: bool = False,
                   **kw: Any) -> paramiko.Transport:
    """A paramiko Transport that prefers AES-GCM (one AEAD pass: ~20% faster on 1 MB here) when
    the server offers it, and falls back to paramiko's usual order otherwise. Host key types
    known_hosts holds for the host come first (OpenSSH orders them so too)."""
    t = paramiko.Transport(sock, **kw)
    opts = t.get_security_options()
    gcm = tuple(c for c in opts.ciphers if "gcm" in c)
    opts.ciphers = gcm + tuple(c for c in opts.ciphers if c not in gcm)
    if known_types:
        algs = [a for k in known_types for a in (["rsa-sha2-512", "rsa-sha2-256"] if k == "ssh-rsa" else [k])]
        first = [a for a in algs if a in opts.key_types]
        opts.key_types = tuple(first + [a for a in opts.key_types if a not in first])
    if certs:   # a known authority signs this host's certificates: ask for one first
        cert_types = [f"{a}-cert-v01@openssh.com" for a in opts.key_types if "cert" not in a]
        opts.key_types = tuple(cert_types) + tuple(a for a in opts.key_types if a not in cert_types)
    return t
