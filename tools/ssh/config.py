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
    known_hosts: list[str]          # UserKnownHostsFile (the first takes new keys); [] for `none`
    global_known_hosts: list[str]   # GlobalKnownHostsFile
    host_key_alias: str | None
    check_host_ip: bool
    hash_known_hosts: bool


DEFAULT_USER_FILES = ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]
DEFAULT_GLOBAL_FILES = ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]


def _home_of_account() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_dir
    except (KeyError, ImportError):
        return str(Path.home())


def _file_list(value: str | list[str] | None, default: list[str], tokens: dict[str, str]) -> list[str]:
    """A known-hosts file option as ssh holds it: space-separated paths, ``none`` for no file, ``~`` and
    ``%`` tokens expanded. ``ssh -G`` expands ``~`` with the account's home; where ``$HOME`` is another
    folder, debugagent's own ``~`` (the one ``--known-hosts`` and its state use) stands for it."""
    words = (" ".join(value) if isinstance(value, list) else value).split() if value else list(default)
    if words == ["none"]:
        return []
    home, account_home = str(Path.home()), _home_of_account().rstrip("/")
    out: list[str] = []
    for w in words:
        w = "".join(tokens.get(part, part) for part in _split_tokens(w))
        w = os.path.expanduser(w)
        if account_home and account_home != home and (w == account_home or w.startswith(account_home + "/")):
            w = home + w[len(account_home):]
        out.append(w)
    return out


def _split_tokens(word: str) -> list[str]:
    """``a%hb`` -> ``['a', '%h', 'b']``: the ``%`` tokens ssh expands in a file option."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i] == "%" and i + 1 < len(word):
            out.append(word[i:i + 2])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _yes(value: Any) -> bool:
    return str(value).lower() in ("yes", "true")


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
    if ssh:
        r = subprocess.run([ssh, *_config_args(config), "-G", *(["-p", str(port)] if port else []), host],
                           capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        if r.returncode == 0:
            for line in r.stdout.splitlines():
                k, _, v = line.partition(" ")
                if k in ("identityfile",):
                    cfg.setdefault(k, []).append(v)
                else:
                    cfg[k] = v
    elif config.is_file():
        c = paramiko.SSHConfig.from_path(str(config)).lookup(host)
        cfg = {k: v for k, v in c.items()}
    hostname = cfg.get("hostname", host)
    # identities as the user's own config names them (ssh -G lists its defaults too; without a config of
    # the user's, paramiko looks in ~/.ssh and asks ssh-agent, as before)
    ids = [os.path.expanduser(i) for i in cfg.get("identityfile", []) if os.path.isfile(os.path.expanduser(i))] \
        if config.is_file() else []
    if identity_file:
        if not os.path.isfile(identity_file):
            raise UsageError(f"--identity-file {identity_file}: no such file", fix="give the path of a private key")
        ids = [identity_file]
    jump = cfg.get("proxyjump")
    the_port = port or int(cfg.get("port", 22))
    the_user = user or cfg.get("user") or getpass.getuser()
    alias = cfg.get("hostkeyalias")
    alias = None if alias in (None, "none") else alias
    tokens = {"%%": "%", "%d": str(Path.home()), "%h": hostname, "%k": alias or host, "%n": host,
              "%p": str(the_port), "%r": the_user, "%u": getpass.getuser(), "%i": str(os.getuid())}
    return {"host": hostname, "port": the_port, "user": the_user,
            "identities": ids, "proxyjump": None if jump in (None, "none") else jump, "explicit_identity": bool(identity_file),
            "known_hosts": _file_list(cfg.get("userknownhostsfile"), DEFAULT_USER_FILES, tokens),
            "global_known_hosts": _file_list(cfg.get("globalknownhostsfile"), DEFAULT_GLOBAL_FILES, tokens),
            "host_key_alias": alias, "check_host_ip": _yes(cfg.get("checkhostip", "no")),
            "hash_known_hosts": _yes(cfg.get("hashknownhosts", "no"))}


def _config_args(user_config: Path) -> list[str]:
    """Which configuration ``ssh -G`` reads: ssh's own choice (``~/.ssh/config``, then
    ``/etc/ssh/ssh_config``) when ``$HOME`` is the account's home; where it is another folder,
    that folder's ``.ssh/config`` (or the system's file when it has none), as paramiko would read it."""
    if str(Path.home()) == _home_of_account():
        return []
    if user_config.is_file():
        return ["-F", str(user_config)]
    system = Path("/etc/ssh/ssh_config")
    return ["-F", str(system) if system.is_file() else "/dev/null"]
