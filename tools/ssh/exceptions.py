"""paramiko's exceptions translated into the project's, in one place (``translate``): every
paramiko exception class is mapped (a test checks none is missing), and a refused host key
becomes a ``HostKeyError`` that says why and what to do."""

from __future__ import annotations

import socket

import paramiko
from paramiko import ssh_exception as px

from .. import known_hosts
from ..errors import AuthError, ConnectError, HostKeyError, TransportError

# every paramiko exception class -> ours (a test checks none is missing)
EXCEPTION_MAP: dict[type[BaseException], type[TransportError]] = {
    px.BadHostKeyException: HostKeyError,
    px.AuthenticationException: AuthError,
    px.BadAuthenticationType: AuthError,
    px.PartialAuthentication: AuthError,
    px.PasswordRequiredException: AuthError,
    px.UnableToAuthenticate: AuthError,
    px.ChannelException: ConnectError,
    px.ConfigParseError: ConnectError,
    px.CouldNotCanonicalize: ConnectError,
    px.IncompatiblePeer: ConnectError,
    px.MessageOrderError: ConnectError,
    px.NoValidConnectionsError: ConnectError,
    px.ProxyCommandFailure: ConnectError,
    px.SSHException: ConnectError,
}
FIXES: dict[type[TransportError], str] = {
    AuthError: "give the private key with -i/--identity-file KEY, or load it into ssh-agent (ssh-add KEY); check the user",
    ConnectError: "check the address and port, that sshd runs there, and the network path (--connect-timeout)",
}


class HostKeyRefused(Exception):
    """The host key is not trusted: ``status`` is ``unknown``, ``changed`` or ``revoked`` (known_hosts.check)."""

    def __init__(self, host: str, key: paramiko.PKey, verdict: known_hosts.Verdict, ip: str | None = None) -> None:
        self.host, self.key, self.verdict, self.ip = host, key, verdict, ip   # ip: CheckHostIP's address refused it
        super().__init__(host)


def translate(exc: BaseException, host: str) -> TransportError:
    """paramiko, socket and OS errors -> the project's transport errors."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, HostKeyRefused):
        return host_key_error(exc, host)
    if isinstance(exc, px.BadHostKeyException):
        return HostKeyError(f"{host}: the host key CHANGED (got {exc.key.get_name()} {exc.key.fingerprint}, known "
                            f"{exc.expected_key.fingerprint}); refused: this may be an attack, or the host was reinstalled",
                            host=host, fix="if the change is expected, remove the old line: ssh-keygen -R HOST")
    if type(exc) is px.SSHException and "authentication" in str(exc).lower():
        # paramiko's plain SSHException for "No authentication methods available": no key was offered at all
        return AuthError(f"{host}: no key was offered that the host accepts ({exc}): none given with -i/--identity-file, "
                         "none in ssh-agent and none in ~/.ssh", host=host, fix=FIXES[AuthError])
    for cls in type(exc).__mro__:
        if cls in EXCEPTION_MAP:
            ours = EXCEPTION_MAP[cls]
            return ours(f"{host}: {type(exc).__name__}: {exc}", host=host, fix=FIXES.get(ours))
    if isinstance(exc, socket.gaierror):
        return ConnectError(f"{host}: cannot resolve the name ({exc.strerror})", host=host, fix=FIXES[ConnectError])
    if isinstance(exc, TimeoutError | socket.timeout):
        return ConnectError(f"{host}: timed out", host=host, fix=FIXES[ConnectError])
    if isinstance(exc, ConnectionRefusedError):
        return ConnectError(f"{host}: connection refused", host=host, fix=FIXES[ConnectError])
    if isinstance(exc, OSError | EOFError):
        return ConnectError(f"{host}: {type(exc).__name__}: {exc}", host=host, fix=FIXES[ConnectError])
    return ConnectError(f"{host}: {type(exc).__name__}: {exc}", host=host)


def host_key_error(exc: HostKeyRefused, host: str) -> HostKeyError:
    v, key = exc.verdict, exc.key
    got = f"{key.get_name()} {key.fingerprint}"
    where = f"{v.path}:{v.entry.line}" if v.path and v.entry else str(v.path)
    if v.status == "revoked":
        return HostKeyError(f"{host}: the host key {got} is REVOKED (@revoked in {where}); refused", host=host,
                            fix="the key must never be trusted again: find out why it was revoked; the host needs a new key")
    if v.status == "changed" and exc.ip:
        return HostKeyError(f"{host}: the host key {got} differs from the key for the IP address {exc.ip} "
                            f"({where}); refused, as ssh refuses it under CheckHostIP with strict checking", host=host,
                            fix=f"if the address moved to another host, remove its old line: ssh-keygen -R {exc.ip}")
    if v.status == "changed":
        return HostKeyError(f"{host}: the host key CHANGED (got {got}; {where} holds another key for this host); "
                            "refused: this may be an attack, or the host was reinstalled", host=host,
                            fix="if the change is expected, remove the old line: ssh-keygen -R HOST")
    return HostKeyError(f"{host}: unknown host key {got}; refused", host=host,
                        fix="check the fingerprint, then pass --accept-new-host-key to record it "
                            "(or add it to known_hosts: ssh-keygen -R / ssh-keyscan)")
