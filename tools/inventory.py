"""Which hosts a fleet holds: an Ansible inventory (INI or YAML, as Ansible documents them), a plain host
list, or a comma list, narrowed by an Ansible ``--limit`` pattern.

What is read, from Ansible's "How to build your inventory":

* **INI**: hosts before any section are ungrouped; ``[group]`` lists hosts (``name[:port]``, then
  ``key=value`` variables, values in quotes allowed); ``[group:vars]`` gives a group's variables,
  ``[group:children]`` its child groups; ``#`` and ``;`` start comments; ``www[01:20].corp`` and
  ``db-[a:c].corp`` are ranges (a leading zero keeps the width).
* **YAML**: ``all:`` (or any top group) with ``hosts:`` (name -> variables or nothing), ``vars:``
  and ``children:``, nested.
* A **plain list**: one ``[user@]host[:port]`` (or ``sim:NAME``, ``local``) per line, ``#`` comments.
* ``-i 'a,b,'``: a comma list, as Ansible takes one.

Variables: a host's own, then its groups' (a child group's before its parent's, ``all`` last).
Of them ``ansible_host``, ``ansible_port``, ``ansible_user`` and ``ansible_ssh_private_key_file``
(``ansible_private_key_file``) say how to reach the host; the rest are kept.

``--limit``: names or groups, ``*`` wildcards, ``~REGEX``, separated by ``:`` or ``,``; ``&G`` keeps only
hosts also in G, ``!G`` drops G's hosts (as Ansible: unions first, then intersections, then exclusions).
Every error names the file and line, and says how to write it.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError

FIX_INI = "write `[group]`, then one host a line: `NAME [ansible_host=ADDR] [ansible_port=N] [ansible_user=U]`"
FIX_YAML = "write `all: {hosts: {NAME: {ansible_host: ADDR}}, children: {GROUP: {hosts: {...}}}}`"


@dataclass
class InventoryHost:
    """One host of the inventory: its name, groups and variables, and how to reach it."""

    name: str
    groups: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """The ``--host`` this host is reached as: ``user@address[:port]``, or the name as written."""
        addr = str(self.vars.get("ansible_host") or self.name)
        if addr.startswith(("sim:", "ssh:")) or addr == "local":
            return addr
        user = self.vars.get("ansible_user")
        port = self.vars.get("ansible_port")
        if ":" in addr and not addr.startswith("["):
            addr = f"[{addr}]" if port else addr   # an IPv6 address takes brackets before a port
        return (f"{user}@" if user else "") + addr + (f":{int(port)}" if port else "")

    @property
    def identity_file(self) -> str | None:
        key = self.vars.get("ansible_ssh_private_key_file") or self.vars.get("ansible_private_key_file")
        return str(Path(str(key)).expanduser()) if key else None


@dataclass
class Inventory:
    hosts: dict[str, InventoryHost] = field(default_factory=dict)
    groups: dict[str, set[str]] = field(default_factory=dict)   # group -> its own hosts
    children: dict[str, list[str]] = field(default_factory=dict)
    group_vars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def members(self, group: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The hosts of ``group`` and of its children, any depth."""
        if group in ("all", "*") and group not in self.groups:
            return set(self.hosts)
        out = set(self.groups.get(group, set()))
        for c in self.children.get(group, []):
            if c not in seen:
                out |= self.members(c, seen | {group})
        return out

    def add_host(self, name: str, group: str | None, hostvars: dict[str, Any]) -> None:
        h = self.hosts.setdefault(name, InventoryHost(name))
        h.vars.update(hostvars)
        if group:
            self.groups.setdefault(group, set()).add(name)

    def finish(self) -> list[InventoryHost]:
        """Each host with its groups (nearest first) and its variables merged as Ansible merges them."""
        parents: dict[str, list[str]] = {}
        for g, cs in self.children.items():
            for c in cs:
                parents.setdefault(c, []).append(g)

        def ancestors(g: str, seen: set[str]) -> list[str]:
            out: list[str] = []
            for p in parents.get(g, []):
                if p not in seen:
                    seen.add(p)
                    out += [p, *ancestors(p, seen)]
            return out

        for h in self.hosts.values():
            direct = sorted(g for g, hs in self.groups.items() if h.name in hs)
            chain: list[str] = []
            for g in direct:
                for x in [g, *ancestors(g, set())]:
                    if x not in chain:
                        chain.append(x)
            h.groups = [g for g in chain if g != "all"]
            merged: dict[str, Any] = {}
            for g in ["all", *reversed(chain)]:
                merged.update(self.group_vars.get(g, {}))
            merged.update(h.vars)
            h.vars = merged
        return list(self.hosts.values())


# ---------------------------------------------------------------- ranges
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\]")


def expand_range(name: str, where: str) -> list[str]:
    """``www[01:03].corp`` -> www01.corp, www02.corp, www03.corp (Ansible's host ranges, also ``[a:c]``)."""
    m = _RANGE.search(name)
    if not m:
        return [name]
    lo, hi, step = m.group(1), m.group(2), int(m.group(3) or 1)
    head, tail = name[:m.start()], name[m.end():]
    if lo.isdigit() and hi.isdigit():
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        if int(hi) < int(lo) or step < 1 or (int(hi) - int(lo)) // step > 10_000:
            raise UsageError(f"{where}: the range [{lo}:{hi}] in `{name}` is empty or too long",
                             fix="write [START:END] with START <= END, at most 10000 hosts")
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1, step)]
    elif len(lo) == 1 and len(hi) == 1 and lo in string.ascii_letters and hi in string.ascii_letters and lo <= hi:
        items = [chr(c) for c in range(ord(lo), ord(hi) + 1, step)]
    else:
        raise UsageError(f"{where}: `[{lo}:{hi}]` in `{name}` is not a range",
                         fix="write [01:20] (numbers) or [a:f] (one letter each)")
    return [n for i in items for n in expand_range(head + i + tail, where)]


# ---------------------------------------------------------------- INI
def _value(text: str) -> Any:
    """An INI variable's value: quotes removed, integers as integers (as Ansible reads them)."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return int(text) if text.isdigit() else text


def _host_line(line: str, where: str) -> tuple[list[str], dict[str, Any]]:
    try:
        words = shlex.split(line, comments=True, posix=True)
    except ValueError as exc:
        raise UsageError(f"{where}: cannot read `{line}` ({exc})", fix=FIX_INI) from None
    name, rest = words[0], words[1:]
    hostvars: dict[str, Any] = {}
    for w in rest:
        k, eq, v = w.partition("=")
        if not eq or not k:
            raise UsageError(f"{where}: `{w}` is not KEY=VALUE", fix=FIX_INI)
        hostvars[k] = _value(v)
    user, at, hostpart = name.rpartition("@")
    if at and "ansible_user" not in hostvars:   # a plain list's user@host
        hostvars["ansible_user"] = user
        name = hostpart
    name, port = split_port(name)
    if port is not None:
        hostvars.setdefault("ansible_port", port)
    return expand_range(name, where), hostvars


_PORT = re.compile(r"^([^:]+):([0-9]+)$")


def split_port(name: str) -> tuple[str, int | None]:
    """``host:2222`` -> host, 2222 (Ansible's ``name:port``); a range's ``[a:c]``, an IPv6 address or a
    ``sim:`` host keep their colons."""
    m = _PORT.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def parse_ini(text: str, path: str) -> Inventory:
    inv = Inventory()
    section, kind = None, "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        where = f"{path}:{n}"
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise UsageError(f"{where}: `{line}` is not a section header", fix="write [group], [group:vars] or [group:children]")
            name, _, kind = line[1:-1].strip().partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children") or not name or any(c.isspace() for c in name):
                raise UsageError(f"{where}: `{line}` is not a section header", fix="write [group], [group:vars] or [group:children]")
            section = name
            inv.groups.setdefault(name, set())
            continue
        if kind == "vars":
            k, eq, v = line.partition("=")
            if not eq or not k.strip():
                raise UsageError(f"{where}: `{line}` in [{section}:vars] is not KEY=VALUE", fix="write one KEY=VALUE a line")
            inv.group_vars.setdefault(str(section), {})[k.strip()] = _value(v.strip())
        elif kind == "children":
            inv.children.setdefault(str(section), []).append(line)
        else:
            names, hostvars = _host_line(line, where)
            for name in names:
                inv.add_host(name, section, hostvars)
    for g, cs in inv.children.items():
        for c in cs:
            if c not in inv.groups:
                raise UsageError(f"{path}: [{g}:children] names `{c}`, which is no group of the inventory",
                                 fix=f"add a [{c}] section, or remove it from [{g}:children]")
    return inv


# ---------------------------------------------------------------- YAML
def parse_yaml(text: str, path: str) -> Inventory:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{path}:{mark.line + 1 if mark else '?'}: not valid YAML ({getattr(exc, 'problem', exc)})",
                         fix=FIX_YAML) from None
    if data is None:
        return Inventory()
    if not isinstance(data, dict):
        raise UsageError(f"{path}: an inventory is a mapping of groups, not a {type(data).__name__}", fix=FIX_YAML)
    inv = Inventory()

    def group(name: str, body: Any, where: str) -> None:
        inv.groups.setdefault(name, set())
        if body is None:
            return
        if not isinstance(body, dict):
            raise UsageError(f"{where}: group `{name}` must be a mapping (hosts, vars, children)", fix=FIX_YAML)
        unknown = set(body) - {"hosts", "vars", "children"}
        if unknown:
            raise UsageError(f"{where}: group `{name}` has {', '.join(sorted(map(str, unknown)))}; a group holds "
                             "hosts, vars and children only", fix=FIX_YAML)
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise UsageError(f"{where}: `{name}.hosts` must map host names to their variables", fix=FIX_YAML)
        for h, hv in hosts.items():
            if hv is not None and not isinstance(hv, dict):
                raise UsageError(f"{where}: host `{h}` of `{name}`: its variables must be a mapping", fix=FIX_YAML)
            hostvars = dict(hv or {})
            base, port = split_port(str(h))
            if port is not None:
                hostvars.setdefault("ansible_port", port)
            for n in expand_range(base, where):
                inv.add_host(n, name, hostvars)
        gv = body.get("vars") or {}
        if not isinstance(gv, dict):
            raise UsageError(f"{where}: `{name}.vars` must be a mapping", fix=FIX_YAML)
        inv.group_vars.setdefault(name, {}).update(gv)
        kids = body.get("children") or {}
        if not isinstance(kids, dict):
            raise UsageError(f"{where}: `{name}.children` must map group names to groups", fix=FIX_YAML)
        for c, cb in kids.items():
            inv.children.setdefault(name, []).append(str(c))
            group(str(c), cb, where)

    for g, body in data.items():
        group(str(g), body, path)
    return inv


# ---------------------------------------------------------------- any of them
def load_inventory(source: str) -> list[InventoryHost]:
    """The hosts ``-i SOURCE`` names: a file (YAML by its suffix or its first word, else INI or a plain
    list), or a comma list of hosts."""
    p = Path(source)
    if not p.exists():
        if "," in source:
            return plain_list("\n".join(source.split(",")), f"-i {source!r}")
        raise UsageError(f"-i {source}: no such file", fix="give an Ansible inventory (INI or YAML), a file of hosts "
                         "one a line, or a comma list (`-i 'gpu-1,gpu-2,'`)")
    if p.is_dir():
        raise UsageError(f"-i {source}: is a folder", fix="give the inventory file itself")
    try:
        text = p.read_bytes().decode()
    except UnicodeDecodeError:
        raise UsageError(f"-i {source}: is not text (UTF-8)", fix="give an inventory file in INI or YAML") from None
    except OSError as exc:
        raise UsageError(f"-i {source}: cannot read it ({exc.strerror})", fix="check the path and its permissions") from None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", ";"))), "")
    yaml_like = p.suffix in (".yml", ".yaml") or first == "---" or bool(re.match(r"^[\w.-]+:\s*$", first))
    if not yaml_like and is_plain_list(text):
        hosts = plain_list(text, source)
    else:
        hosts = (parse_yaml(text, source) if yaml_like else parse_ini(text, source)).finish()
    if not hosts:
        raise UsageError(f"-i {source}: holds no host", fix=FIX_YAML if yaml_like else FIX_INI)
    return hosts


def is_plain_list(text: str) -> bool:
    """No section and no variable: one host a line."""
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    return not any(ln.startswith("[") or "=" in ln or " " in ln for ln in lines if ln)


def plain_list(text: str, path: str) -> list[InventoryHost]:
    """A file of hosts one a line, each named as written (``root@127.0.0.1:2201`` and ``:2202`` are two hosts)."""
    out: dict[str, InventoryHost] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line and line not in out:
            vars_: dict[str, Any] = {}
            if not line.startswith(("sim:", "ssh:")) and line != "local":
                vars_ = _host_line(line, f"{path}:{n}")[1]
                vars_["ansible_host"] = split_port(line.rpartition("@")[2])[0]
            out[line] = InventoryHost(line, vars=vars_)
    return list(out.values())


def _matches(term: str, h: InventoryHost, groups: dict[str, set[str]]) -> bool:
    if term.startswith("~"):
        try:
            return re.search(term[1:], h.name) is not None or any(re.search(term[1:], g) for g in h.groups)
        except re.error as exc:
            raise UsageError(f"--limit {term}: not a regular expression ({exc})", fix="write ~REGEX with a valid REGEX") from None
    if term in ("all", "*"):
        return True
    return fnmatch.fnmatchcase(h.name, term) or any(fnmatch.fnmatchcase(g, term) for g in h.groups)


def limit(hosts: list[InventoryHost], pattern: str | None) -> list[InventoryHost]:
    """The hosts an Ansible ``--limit`` pattern keeps, in inventory order."""
    if not pattern:
        return hosts
    terms = [t.strip() for t in re.split(r"[:,]", pattern) if t.strip()]
    groups: dict[str, set[str]] = {}
    plain = [t for t in terms if t[0] not in "!&"]
    keep = [h for h in hosts if any(_matches(t, h, groups) for t in plain)] if plain else list(hosts)
    for t in terms:
        if t.startswith("&"):
            keep = [h for h in keep if _matches(t[1:], h, groups)]
    for t in terms:
        if t.startswith("!"):
            keep = [h for h in keep if not _matches(t[1:], h, groups)]
    if not keep:
        raise UsageError(f"--limit {pattern}: matches no host of the inventory",
                         fix="name hosts or groups of the inventory (wildcards `*`, `~REGEX`, `!G` to drop, `&G` to keep only)")
    return keep
