"""known_hosts as OpenSSH reads it (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT", hostfile.c).

A line is ``[@marker] patterns keytype base64 [comment]``:

* ``patterns`` is a comma list of names with ``*`` and ``?`` wildcards and ``!negations``
  (a negated match excludes the line even if another pattern matches), or one hashed name
  ``|1|base64(salt)|base64(HMAC-SHA1(salt, name))``. A host on a port other than 22 is
  looked up as ``[host]:port``.
* ``@revoked``: that key is never accepted for the hosts the line matches, whichever
  lines also hold it.
* ``@cert-authority``: the key signs host certificates; it vouches for nothing else, so
  a plain host key is checked against the unmarked lines only (as OpenSSH does).

``verify`` adds OpenSSH's second look off port 22: a key unknown as ``[host]:port`` is
accepted when a line for plain ``host`` holds it (nothing is appended then).

``check_cert`` decides a host certificate: signed by a key that a matching
``@cert-authority`` line holds (and no matching ``@revoked`` line), a host certificate,
valid now, naming the host among its principals; otherwise ssh falls back to the plain
key inside it, and so does the caller.

``check`` gives OpenSSH's answer for a plain key: ``ok`` (a matching line holds it),
``changed`` (matching lines hold other keys only), ``revoked``, or ``unknown``.

``Files`` is the set of files ssh reads (``UserKnownHostsFile`` then ``GlobalKnownHostsFile``, as
``ssh -G`` names them): every line of every file counts, so a key ``@revoked`` in
``/etc/ssh/ssh_known_hosts`` is refused whatever the user's file says; a new key is appended to
the first user file only. Names are looked up in lower case, as ssh lowercases the host name
before it looks (a hashed name is the HMAC of the lowercased name).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["ok", "unknown", "changed", "revoked"]
Marker = Literal["", "@cert-authority", "@revoked"]


@dataclass(frozen=True)
class Entry:
    marker: Marker
    patterns: str
    keytype: str
    key: bytes          # the public key blob
    line: int
    path: Path | None = None   # the file that holds the line

    def matches(self, name: str) -> bool:
        return host_matches(self.patterns, name)


@dataclass(frozen=True)
class Verdict:
    status: Status
    entry: Entry | None = None      # the line that decided it (the known key for `changed`)
    path: Path | None = None


def lookup_name(host: str, port: int) -> str:
    """The name OpenSSH looks up: ``host`` (lowercased, as ssh does), or ``[host]:port`` off port 22."""
    host = host.lower()
    return host if port == 22 else f"[{host}]:{port}"


def _hashed_matches(field: str, name: str) -> bool:
    parts = field.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def hash_name(name: str, salt: bytes | None = None) -> str:
    """``|1|salt|hash``: the name as ssh writes it under ``HashKnownHosts yes``."""
    import os
    salt = salt if salt is not None else os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def _pattern_matches(pattern: str, name: str) -> bool:
    # OpenSSH's match_pattern: `*` and `?` only, case-insensitive for host names
    return fnmatch.fnmatchcase(name.lower(), pattern.lower().replace("[", "[[]"))


def host_matches(patterns: str, name: str) -> bool:
    """Whether ``name`` matches a known_hosts host field (hashed, or a pattern list)."""
    if patterns.startswith("|"):
        return _hashed_matches(patterns, name)
    positive = False
    for pat in patterns.split(","):
        if not pat:
            continue
        if pat.startswith("!"):
            if _pattern_matches(pat[1:], name):
                return False         # a negated match excludes the line
        elif _pattern_matches(pat, name):
            positive = True
    return positive


def parse(text: str, path: Path | None = None) -> list[Entry]:
    """Every usable line; comments, blank lines and lines OpenSSH would skip are skipped."""
    out: list[Entry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker: Marker = ""
        if fields[0].startswith("@"):
            if fields[0] not in ("@cert-authority", "@revoked"):
                continue
            marker = fields[0]  # type: ignore[assignment]
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        out.append(Entry(marker=marker, patterns=fields[0], keytype=fields[1], key=blob, line=n, path=path))
    return out


def load(path: Path) -> list[Entry]:
    if not path.is_file():
        return []
    return parse(path.read_text(errors="replace"), path)


@dataclass(frozen=True)
class Files:
    """The known_hosts files ssh reads for one host: ``user`` (UserKnownHostsFile, the first one
    takes new keys) and ``system`` (GlobalKnownHostsFile: read, never written)."""

    user: tuple[Path, ...]
    system: tuple[Path, ...] = ()

    def entries(self) -> list[Entry]:
        return [e for p in (*self.user, *self.system) for e in load(p)]

    @property
    def append_to(self) -> Path | None:
        return self.user[0] if self.user else None

    def __str__(self) -> str:
        return " ".join(str(p) for p in (*self.user, *self.system))


def check(entries: list[Entry], name: str, keytype: str, key: bytes) -> Verdict:
    """OpenSSH's answer for a plain host key ``key`` offered by ``name``."""
    for e in entries:   # @revoked: refused whatever else matches
        if e.marker == "@revoked" and e.key == key and e.matches(name):
            return Verdict("revoked", e)
    changed: Entry | None = None
    for e in entries:
        if e.marker or not e.matches(name):
            continue
        if e.key == key:
            return Verdict("ok", e)
        changed = changed or e
    return Verdict("changed", changed) if changed else Verdict("unknown")


def known_types(entries: list[Entry], name: str) -> list[str]:
    """Key types the file holds for ``name`` (unmarked lines), to prefer in the key exchange."""
    seen: list[str] = []
    for e in entries:
        if not e.marker and e.matches(name) and e.keytype not in seen:
            seen.append(e.keytype)
    return seen


def verify(entries: list[Entry], host: str, port: int, keytype: str, key: bytes, alias: str | None = None) -> Verdict:
    """``check`` under ``[host]:port``, then (where that is unknown) under plain ``host``, as ssh does;
    under ``alias`` alone where a ``HostKeyAlias`` is set (ssh adds no port to it and takes no second look)."""
    if alias:
        return check(entries, alias, keytype, key)
    v = check(entries, lookup_name(host, port), keytype, key)
    if v.status == "unknown" and port != 22:
        plain = check(entries, host, keytype, key)
        if plain.status == "ok":
            return plain
    return v


# ---------------------------------------------------------------- host certificates
@dataclass(frozen=True)
class HostCert:
    """The fields of an OpenSSH certificate (PROTOCOL.certkeys) that a host check reads."""

    cert_type: int          # 1 user, 2 host
    principals: list[str]
    valid_after: int
    valid_before: int
    critical: bytes
    ca_key: bytes           # the signature key's blob
    signature: bytes
    signed: bytes           # the blob up to the signature


_KEY_FIELDS = {"ssh-ed25519": "s", "ssh-rsa": "mm", "ecdsa-sha2-nistp256": "ss", "ecdsa-sha2-nistp384": "ss",
               "ecdsa-sha2-nistp521": "ss"}


def parse_cert(blob: bytes) -> HostCert | None:
    """An OpenSSH certificate blob, or None where it is not one this reader knows."""
    import paramiko
    m = paramiko.Message(blob)
    try:
        kind = m.get_text()
        plain = kind.replace("-cert-v01@openssh.com", "")
        if plain == kind or plain not in _KEY_FIELDS:
            return None
        m.get_string()                       # nonce
        for f in _KEY_FIELDS[plain]:
            m.get_mpint() if f == "m" else m.get_string()
        m.get_int64()                        # serial
        cert_type = m.get_int()
        m.get_string()                       # key id
        pm = paramiko.Message(m.get_string())
        principals: list[str] = []
        while pm.get_remainder():
            principals.append(pm.get_text())
        after, before = m.get_int64(), m.get_int64()
        critical = m.get_string()
        m.get_string()                       # extensions
        m.get_string()                       # reserved
        ca = m.get_string()
        signed = blob[:m.packet.tell()]
        sig = m.get_string()
    except Exception:  # noqa: BLE001 - a truncated or odd blob is no certificate
        return None
    return HostCert(cert_type, principals, after, before, critical, ca, sig, signed)


def _signature_ok(cert: HostCert) -> bool:
    import paramiko
    try:
        kind = paramiko.Message(cert.ca_key).get_text()
        ca = paramiko.PKey.from_type_string(kind, cert.ca_key)
        return bool(ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)))
    except Exception:  # noqa: BLE001 - an unknown CA key type or a bad signature: not valid
        return False


def check_cert(entries: list[Entry], host: str, port: int, blob: bytes, plain: bytes,
               now: float | None = None, alias: str | None = None) -> Verdict | None:
    """``ok`` or ``revoked`` for a host certificate (``plain``: the key it certifies); None where
    ssh would fall back to the plain key."""
    cert = parse_cert(blob)
    if cert is None:
        return None
    name = alias or lookup_name(host, port)
    host = alias or host.lower()
    for e in entries:   # the certified key or its authority revoked
        if e.marker == "@revoked" and e.key in (cert.ca_key, plain) and e.matches(name):
            return Verdict("revoked", e)
    ca = next((e for e in entries if e.marker == "@cert-authority" and e.key == cert.ca_key and e.matches(name)), None)
    t = int(time.time() if now is None else now)
    if ca is None or cert.cert_type != 2 or cert.critical or not (cert.valid_after <= t < cert.valid_before):
        return None
    if cert.principals and host not in cert.principals:
        return None
    return Verdict("ok", ca) if _signature_ok(cert) else None


def has_authority(entries: list[Entry], name: str) -> bool:
    """Whether a ``@cert-authority`` line matches ``name`` (then host certificates are asked for)."""
    return any(e.marker == "@cert-authority" and e.matches(name) for e in entries)
