"""``--host`` for SSH: ``user@host[:port]`` or an ~/.ssh/config alias, resolved as OpenSSH resolves it."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, TypedDict

import paramiko

from ..errors import UsageError


class Resolved(TypedDict):
    """Where ``--host`` leads, as ``resolve`` found it."""
    host: str
    port: int
    user: str
    identities: list[str]
    proxyjump: str | None
    explicit_identity: bool


def split_target(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (``[ADDRESS]:port`` for IPv6) -> user, host, port; a ``UsageError`` (exit 2)
    for one that cannot be a host, before anything connects."""
    user, rest = spec.rsplit("@", 1) if "@" in spec else (None, spec)
    p: str | None = None
    if rest.startswith("["):
        host, bracket, after = rest[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise UsageError(f"--host {spec!r}: " + ("`[` without its `]`" if not bracket else f"`{after}` after `]`"),
                             fix="write user@[ADDRESS]:PORT for an IPv6 address (user@[::1]:2222)")
        p = after[1:] if after else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
    else:
        host = rest
    if not host.strip() or host.startswith("-"):
        raise UsageError(f"--host {spec!r}: " + ("no host" if not host.strip() else "a host cannot start with `-`"),
                         fix="write user@host[:port] or an ~/.ssh/config alias")
    if p is None:
        return user, host, None
    if not p.isdigit():
        raise UsageError(f"--host {spec!r}: port `{p}` is not a number", fix="write user@host:PORT")
    if not 1 <= int(p) <= 65535:
        raise UsageError(f"--host {spec!r}: port {p} is out of range (1-65535)",
                         fix="write user@host:PORT with a PORT from 1 to 65535 (22 when left out)")
    return user, host, int(p)


def resolve(spec: str, identity_file: str | None) -> Resolved:
    """``user@host[:port]`` or an ~/.ssh/config alias -> host, port, user, identities, proxyjump.

    ``ssh -G`` (OpenSSH's own resolution, Include and all) when the client is installed;
    paramiko's SSHConfig otherwise.
    """
    user, host, port = split_target(spec)
    cfg: dict[str, Any] = {}   # ssh -G's output or paramiko's SSHConfig lookup: text as the user's config has it
    ssh = shutil.which("ssh")
    config = Path.home() / ".ssh" / "config"
    if ssh and config.is_file():
        r = subprocess.run([ssh, "-F", str(config), "-G", host], capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            for line in r.stdout.splitlines():
                k, _, v = line.partition(" ")
                if k in ("identityfile",):
                    cfg.setdefault(k, []).append(v)
                else:
                    cfg[k] = v
    elif Path.home().joinpath(".ssh", "config").is_file():
        c = paramiko.SSHConfig.from_path(str(Path.home() / ".ssh" / "config")).lookup(host)
        cfg = {k: v for k, v in c.items()}
    hostname = cfg.get("hostname", host)
    ids = [os.path.expanduser(i) for i in cfg.get("identityfile", []) if os.path.isfile(os.path.expanduser(i))]
    if identity_file:
        if not os.path.isfile(identity_file):
            raise UsageError(f"--identity-file {identity_file}: no such file", fix="give the path of a private key")
        ids = [identity_file]
    jump = cfg.get("proxyjump")
    return {"host": hostname, "port": port or int(cfg.get("port", 22)), "user": user or cfg.get("user") or getpass.getuser(),
            "identities": ids, "proxyjump": None if jump in (None, "none") else jump, "explicit_identity": bool(identity_file)}
