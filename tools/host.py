"""Host tools: the inference server process, Python packages, git, CPU, benchmarks.

Each tool is a pydantic input with ``command()`` (every argument through ``shlex.quote``)
and a pure ``parse_*`` function from the command's text to a pydantic output. The probes
(``tools.probes``: server, packages, git, host, driver, bench) declare them as tools.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from . import benchfmt
from .errors import ParseError, parser
from .redact import redact_env, redact_flags
from .shape import ServerShape
from .transport import q, split_lines, split_sections

SERVER_PATTERN = r"sglang\.launch_server|sglang\.srt\.|vllm\.entrypoints|vllm serve|text-generation-launcher|trtllm-serve"
SEP = "\x1f"
NL = "\x02"  # a newline inside an argument, in the process table's one-line rows


# ---------------------------------------------------------------- server processes
class FindServers(BaseModel):
    """Input of ``find_servers``: processes whose command line matches ``pattern``."""

    model_config = ConfigDict(extra="forbid")
    pattern: str = SERVER_PATTERN

    def command(self) -> str:
        # The match runs in bash itself (no grep process whose own arguments would match), and
        # the loop's shell and its subshells carry the marker token, so they skip themselves.
        return (
            f": debugagent-find-servers; pat={q(self.pattern)}; for p in /proc/[0-9]*; do "
            "c=$( { tr '\\0\\n' '\\037\\036' < \"$p/cmdline\"; } 2>/dev/null ) || continue; "
            "case \"$c\" in ''|*debugagent-find-servers*) continue;; esac; "
            "m=${c//$'\\037'/ }; [[ $m =~ $pat ]] && printf '%s\\t%s\\n' \"${p#/proc/}\" \"$c\"; done; true"
        )


class ProcessLine(BaseModel):
    pid: int
    argv: list[str]


@parser("find_servers")
def parse_find_servers(text: str) -> list[ProcessLine]:
    out = []
    for ln in split_lines(text):
        if not ln.strip():
            continue
        pid, _, rest = ln.partition("\t")
        if not pid.isdigit():
            raise ParseError("expected `PID<TAB>argv`", tool="find_servers", excerpt=ln)
        argv = rest.split(SEP)
        if argv and argv[-1] == "":   # the NUL that ends the last argument
            argv.pop()
        out.append(ProcessLine(pid=int(pid), argv=[a.replace("\x1e", "\n") for a in argv]))  # a newline inside an argument
    return sorted(out, key=lambda p: p.pid)


# ---------------------------------------------------------------- the process table (discovery)
class ProcessTableInput(BaseModel):
    """Input of ``process_table``: every process (pid, ppid, start, argv, exe) and the TCP listeners.

    One command, almost no forks: ``read`` and ``mapfile`` are bash builtins; one ``find``
    lists the executables and one the socket descriptors, matched to ``/proc/net/tcp*``'s
    listening sockets (``proc``, the default: every Linux has it, and a simulated host's
    sandbox maps it); ``ss`` has ``ss -Hltnp`` list them, ``auto`` uses ``ss`` when it is
    installed. The first line names the probe's own shell (``$BASHPID``), so the parser can
    leave out its ancestors and descendants: debugagent's own processes.
    """

    model_config = ConfigDict(extra="forbid")
    listeners: Literal["auto", "proc", "ss"] = "proc"

    def command(self) -> str:
        procfs = ("echo '== tcp'; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; echo '== sockets'; "
                  "find /proc/[0-9]*/fd -lname 'socket:*' -printf '%h %l\\n' 2>/dev/null; ")
        ss = "echo '== ss'; ss -Hltnp 2>/dev/null; "
        listen = {"proc": procfs, "ss": ss,
                  "auto": f"if command -v ss >/dev/null 2>&1; then {ss}else {procfs}fi; "}[self.listeners]
        return (
            ": debugagent-process-table; echo \"== self $BASHPID\"; echo '== procs'; IFS=$'\\037'; "
            "for p in /proc/[0-9]*; do { read -r s < \"$p/stat\" && mapfile -d '' -t a < \"$p/cmdline\"; } 2>/dev/null "
            "|| continue; [ ${#a[@]} -gt 0 ] || continue; c=\"${a[*]}\"; printf '%s\\t%s\\n' \"${s//$'\\n'/ }\" \"${c//$'\\n'/$'\\002'}\"; "
            "done; unset IFS; "
            "echo '== exe'; find /proc/[0-9]*/exe -maxdepth 0 -printf '%h %l\\n' 2>/dev/null; "
            + listen + "echo '== end'"
        )


class Proc(BaseModel):
    """One process: its parent, start time (clock ticks after boot), command line and executable."""

    pid: int
    ppid: int
    start: int = 0
    argv: list[str]
    exe: str = ""

    @property
    def line(self) -> str:
        return " ".join(self.argv)


class Listener(BaseModel):
    """A listening TCP socket: address, port and the pids that hold it (when they can be seen)."""

    address: str
    port: int
    pids: list[int] = Field(default_factory=list)


class ProcTable(BaseModel):
    self_pid: int | None = None
    procs: list[Proc]
    listeners: list[Listener] = Field(default_factory=list)

    def by_pid(self) -> dict[int, Proc]:
        return {p.pid: p for p in self.procs}

    def children(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for p in self.procs:
            out.setdefault(p.ppid, []).append(p.pid)
        return out

    def ancestors(self, pid: int) -> list[int]:
        """Parent, grandparent, … of ``pid`` (those in the table), nearest first."""
        procs = self.by_pid()
        out: list[int] = []
        cur = procs.get(pid)
        while cur is not None and cur.ppid not in out and cur.ppid != cur.pid:
            if cur.ppid not in procs:
                break
            out.append(cur.ppid)
            cur = procs.get(cur.ppid)
        return out

    def descendants(self, pid: int) -> list[int]:
        kids = self.children()
        out: list[int] = []
        todo = list(kids.get(pid, []))
        while todo:
            c = todo.pop()
            if c in out or c == pid:
                continue
            out.append(c)
            todo.extend(kids.get(c, []))
        return sorted(out)

    def ports_of(self, pids: set[int]) -> list[int]:
        return sorted({ln.port for ln in self.listeners if pids & set(ln.pids)})


def parse_stat(line: str) -> tuple[int, int, int]:
    """(pid, ppid, starttime) from a ``/proc/PID/stat`` line (the name in parentheses may hold anything)."""
    head, sep, rest = line.rpartition(")")
    pid = head.split(" (", 1)[0].strip()
    fields = rest.split()
    if not sep or not pid.isdigit() or len(fields) < 20:
        raise ParseError("not a /proc/PID/stat line", tool="process_table", excerpt=line[:80])
    return int(pid), int(fields[1]), int(fields[19])


def _hex_address(text: str) -> str:
    """``0100007F`` -> 127.0.0.1; a 32-digit IPv6 address (four little-endian words) -> its usual form."""
    if len(text) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(text)))
    words = [bytes.fromhex(text[i:i + 8])[::-1] for i in range(0, 32, 8)]
    raw = b"".join(words)
    return str(ipaddress.IPv6Address(raw))


@parser("proc_net_tcp")
def parse_proc_net_tcp(text: str) -> list[tuple[str, int, int]]:
    """(address, port, inode) of every socket in LISTEN state (``0A``) in ``/proc/net/tcp`` and ``tcp6``."""
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 10 or parts[0] == "sl" or not parts[0].endswith(":"):
            continue
        if parts[3] != "0A":
            continue
        addr, _, port = parts[1].partition(":")
        try:
            out.append((_hex_address(addr), int(port, 16), int(parts[9])))
        except ValueError as exc:
            raise ParseError(f"bad address or inode: {exc}", tool="process_table", excerpt=ln[:100]) from exc
    return out


@parser("fd_sockets")
def parse_fd_sockets(text: str) -> dict[int, list[int]]:
    """``/proc/PID/fd socket:[INODE]`` lines -> {inode: [pid, …]}."""
    out: dict[int, list[int]] = {}
    for ln in text.splitlines():
        m = re.fullmatch(r"/proc/(\d+)/fd socket:\[(\d+)\]", ln.strip())
        if m:
            out.setdefault(int(m.group(2)), []).append(int(m.group(1)))
    return out


@parser("ss_listen")
def parse_ss_listen(text: str) -> list[Listener]:
    """``ss -Hltnp`` rows -> listeners (pids only where ss could see the owner)."""
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        local = parts[3]
        addr, _, port = local.rpartition(":")
        if not port.isdigit():
            raise ParseError("a local address without a port", tool="process_table", excerpt=ln[:100])
        pids = sorted({int(x) for x in re.findall(r"pid=(\d+)", ln)})
        out.append(Listener(address=addr.strip("[]").split("%")[0], port=int(port), pids=pids))
    return out


@parser("process_table")
def parse_process_table(text: str) -> ProcTable:
    # split on "\n" only: str.splitlines() would also split on \x1c-\x1e and \x0b/\x0c inside an argv
    s = split_sections(text, "process_table", ["procs", "exe", "end"], lines=text.split("\n"))
    self_pid = None
    for ln in text.split("\n"):
        if ln.startswith("== self"):
            v = ln[len("== self"):].strip()
            self_pid = int(v) if v.isdigit() else None
            break
    exes: dict[int, str] = {}
    for ln in s["exe"]:
        m = re.match(r"/proc/(\d+) (.*)$", ln)
        if m:
            exes[int(m.group(1))] = m.group(2).removesuffix(" (deleted)")
    procs = []
    for ln in s["procs"]:
        if not ln.strip():
            continue
        stat, tab, rest = ln.partition("\t")
        if not tab:
            raise ParseError("expected `STAT<TAB>argv`", tool="process_table", excerpt=ln[:80])
        pid, ppid, start = parse_stat(stat)
        argv = [a.replace(NL, "\n") for a in rest.split(SEP) if a != ""]
        procs.append(Proc(pid=pid, ppid=ppid, start=start, argv=argv, exe=exes.get(pid, "")))
    listeners: list[Listener] = []
    if "ss" in s:
        listeners = parse_ss_listen("\n".join(s["ss"]))
    elif "tcp" in s:
        owners = parse_fd_sockets("\n".join(s.get("sockets", [])))
        listeners = [Listener(address=a, port=p, pids=sorted(owners.get(inode, [])))
                     for a, p, inode in parse_proc_net_tcp("\n".join(s["tcp"]))]
    return ProcTable(self_pid=self_pid, procs=sorted(procs, key=lambda p: p.pid), listeners=listeners)


class ServerDetails(BaseModel):
    """Input of ``server_details``: command line, environment, cwd and start time of one pid."""

    model_config = ConfigDict(extra="forbid")
    pid: int

    def command(self) -> str:
        p = f"/proc/{int(self.pid)}"
        # one line per NUL-separated entry, `+` first (an empty argument stays), `\\` and newlines escaped
        one = "sed -z 's/\\\\/\\\\\\\\/g; s/\\n/\\\\n/g; s/^/+/' < $p/{} | tr '\\0' '\\n'; echo"
        return (
            f"p={p}; echo '== cmdline'; {one.format('cmdline')}; echo '== environ'; "
            f"{one.format('environ')}; echo '== cwd'; readlink $p/cwd; echo '== end'"
        )


class ServerInfo(BaseModel):
    pid: int
    argv: list[str]
    python: str | None = None
    entry: str = ""  # module (-m) or script
    flags: dict[str, str | bool] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    kind: str = "unknown"  # sglang | vllm | unknown
    # filled in by discovery (tools.discovery): how the process was found and its structure
    ppid: int | None = None
    workers: list[int] = Field(default_factory=list)  # every descendant: the API process's workers
    ports: list[int] = Field(default_factory=list)
    found_by: str = ""
    shape: ServerShape | None = None   # how it is run: launcher, engine origin, supervisor, container (tools.shape)


@parser("flags")
def parse_flags(args: list[str], *, dashes: bool = True) -> dict[str, str | bool]:
    """``--tp 8 --disable-cuda-graph --x=y`` -> {tp: '8', disable-cuda-graph: True, x: 'y'}; with ``dashes``,
    ``--mem_fraction`` is read as ``mem-fraction`` (argparse servers take both spellings)."""
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and len(a) > 2:
            name, eq, val = a[2:].partition("=")
            name = name.replace("_", "-") if dashes else name
            if eq:
                flags[name] = val
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[name] = args[i + 1]
                i += 1
            else:
                flags[name] = True
        i += 1
    return flags


def split_argv(argv: list[str]) -> tuple[str | None, str, list[str]]:
    """(python, entry, rest) for ``python -m mod …`` / ``python script.py …`` / ``binary …``."""
    if not argv:
        return None, "", []
    first = argv[0]
    if re.search(r"python[0-9.]*$", first.rsplit("/", 1)[-1]):
        rest = argv[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]
        if rest and rest[0] == "-m" and len(rest) > 1:
            return first, rest[1], rest[2:]
        if rest:
            return first, rest[0], rest[1:]
        return first, "", []
    return None, first.rsplit("/", 1)[-1], argv[1:]


def unescape_entry(text: str) -> str:
    """One entry of ``server_details``' sections: ``\\n`` is a newline inside it, ``\\\\`` a backslash."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


@parser("server_details")
def parse_server_details(pid: int, text: str) -> ServerInfo:
    sections = split_sections(text, "server_details", ["cmdline", "end"], lines=text.split("\n"))
    argv = [unescape_entry(a[1:]) for a in sections["cmdline"] if a.startswith("+")]
    if not argv:
        raise ParseError(f"process {pid} has an empty command line (gone, or a kernel thread)", tool="server_details")
    env: dict[str, str] = {}
    for ln in sections.get("environ", []):
        if ln.startswith("+") and "=" in ln:
            k, _, v = unescape_entry(ln[1:]).partition("=")
            env[k] = v
    python, entry, rest = split_argv(argv)
    kind = "sglang" if "sglang" in entry else "vllm" if "vllm" in " ".join(argv[:3]) else "unknown"
    cwd = next((c for c in sections.get("cwd", []) if c.strip()), "")
    return ServerInfo(pid=pid, argv=argv, python=python, entry=entry, flags=redact_flags(parse_flags(rest)), env=redact_env(env), cwd=cwd, kind=kind)


# ---------------------------------------------------------------- python packages
PACKAGES_SCRIPT = r'''
import hashlib, importlib, importlib.metadata as md, json, os, subprocess, sys
want = [a for a in sys.argv[1:] if a]
def norm(n): return n.lower().replace("_", "-")
def sha(path):
    h = hashlib.sha256(); size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size <= 64 << 20:
            h.update(f.read())
        else:
            h.update(str(size).encode()); h.update(f.read(1 << 20)); f.seek(-(1 << 20), 2); h.update(f.read())
    return h.hexdigest()[:16]
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name and norm(name) not in dists:
        dists[norm(name)] = d
out = {"python": sys.executable, "python_version": sys.version.split()[0], "packages": []}
for key, d in sorted(dists.items()):
    name = d.metadata["Name"]
    rec = {"name": name, "version": d.version, "editable": None, "commit": None, "installed_at": None,
           "so_files": {}, "build_hash": None, "modules": []}
    try:
        meta = d._path  # the dist-info folder
        rec["installed_at"] = int(os.path.getmtime(meta))
    except Exception:
        pass
    try:
        du = json.loads(d.read_text("direct_url.json") or "null")
        if du and du.get("dir_info", {}).get("editable"):
            rec["editable"] = du["url"].replace("file://", "")
            r = subprocess.run(["git", "-C", rec["editable"], "rev-parse", "HEAD"], capture_output=True, text=True)
            rec["commit"] = r.stdout.strip() or None
    except Exception:
        pass
    top = (d.read_text("top_level.txt") or "").split()
    rec["modules"] = top
    # every package's compiled files are hashed: a rebuilt package need not be one anybody listed
    sos = {}
    for f in d.files or []:
        s = str(f)
        if s.endswith(".so") or ".so." in s:
            p = f.locate()
            if os.path.isfile(p):
                sos[s] = sha(p)
                try:
                    rec["installed_at"] = max(rec["installed_at"] or 0, int(os.path.getmtime(p)))
                except Exception:
                    pass
    rec["so_files"] = sos
    if sos:
        rec["build_hash"] = hashlib.sha256("".join(k + v for k, v in sorted(sos.items())).encode()).hexdigest()[:16]
    if key in map(norm, want):
        for mod in top[:1]:
            try:
                m = importlib.import_module(mod)
                rec["version_attr"] = getattr(m, "__version__", None)
                rec["module_file"] = getattr(m, "__file__", None)
            except Exception as e:
                rec["import_error"] = type(e).__name__ + ": " + str(e)[:200]
    out["packages"].append(rec)
print(json.dumps(out))
'''


AS_OWNER_END = 'R="setpriv --reuid=$u --regid=$g $G --"; fi; '


def as_owner_of(pid: int) -> str:
    """Shell that sets ``$R`` to what runs a command as the user process ``pid`` runs as, where this shell is root and
    that process is not (``setpriv --reuid --regid --groups``), and to nothing otherwise: the server's interpreter,
    with its path (its ``sitecustomize``, its ``.pth`` files), never runs with more privilege than the server has. A
    process that is gone, or a root shell without ``setpriv``, ends the command (exit 1) before anything runs."""
    p = f"/proc/{int(pid)}"
    field = "sed -n 's/^{}:[[:space:]]*\\([0-9]*\\).*/\\1/p' " + p + "/status"
    return (f"[ -r {p}/status ] || {{ echo 'the server (pid {int(pid)}) is gone'; exit 1; }}; R=; u=$({field.format('Uid')}); "
            "if [ \"$(id -u)\" = 0 ] && [ -n \"$u\" ] && [ \"$u\" != 0 ]; then command -v setpriv >/dev/null || "
            "{ echo \"the server runs as uid $u: its interpreter is run as that user, and setpriv is missing\"; exit 1; }; "
            f"g=$({field.format('Gid')}); G=$(sed -n 's/^Groups:[[:space:]]*//p' {p}/status | tr -s ' \\t' ','); "
            "G=${G%,}; if [ -n \"$G\" ]; then G=--groups=$G; else G=--clear-groups; fi; " + AS_OWNER_END)


class PythonPackages(BaseModel):
    """Input of ``python_packages``: every distribution in ``python``'s environment.

    Names in ``import_check`` are also imported, to read ``__version__`` (editable
    installs often lack it).
    """

    model_config = ConfigDict(extra="forbid")
    python: str
    import_check: list[str] = Field(default_factory=list)
    # the server's own PYTHONPATH ("" where it has none), so that the listing is what the server imports, not
    # what the shell running the probe would (a login shell's or debugagent's own); None: the shell's
    pythonpath: str | None = None
    # the server whose interpreter this is: run as the user it runs as, where this shell is root and it is not
    # (added after the kept recordings were made: ``replay.legacy_command``)
    pid: int = 0

    def _env(self) -> str:
        if self.pythonpath is None:
            return ""
        return "env -u PYTHONPATH " if self.pythonpath == "" else f"env PYTHONPATH={q(self.pythonpath)} "

    def command(self) -> str:
        args = " ".join(q(a) for a in self.import_check)
        owner = f"{as_owner_of(self.pid)}$R " if self.pid else ""
        return f"{owner}{self._env()}{q(self.python)} -c {q(PACKAGES_SCRIPT.strip())}" + (f" {args}" if args else "")

    def display_command(self) -> str:
        owner = f"<as the user pid {int(self.pid)} runs as> " if self.pid else ""
        return f"{owner}{self._env()}{self.python} -c '<list distributions, hash compiled files>'" + (
            " " + " ".join(self.import_check) if self.import_check else "")


class Package(BaseModel):
    name: str
    version: str
    editable: str | None = None
    commit: str | None = None
    installed_at: int | None = None
    so_files: dict[str, str] = Field(default_factory=dict)
    build_hash: str | None = None
    modules: list[str] = Field(default_factory=list)
    version_attr: str | None = None
    module_file: str | None = None
    import_error: str | None = None


class PackageSet(BaseModel):
    python: str
    python_version: str
    packages: list[Package]

    def get(self, name: str) -> Package | None:
        n = name.lower().replace("_", "-")
        return next((p for p in self.packages if p.name.lower().replace("_", "-") == n), None)


@parser("python_packages")
def parse_python_packages(text: str) -> PackageSet:
    line = next((ln for ln in reversed(split_lines(text)) if ln.startswith("{")), None)
    if line is None:
        raise ParseError("no JSON line in the output (is that a Python interpreter?)", tool="python_packages", excerpt=text[-120:])
    try:
        return PackageSet.model_validate(json.loads(line))
    except (ValueError, TypeError) as exc:
        raise ParseError(f"malformed JSON: {exc}", tool="python_packages", excerpt=line[:120]) from exc


# ---------------------------------------------------------------- git
# git reads take no optional lock: `git status` would otherwise refresh and rewrite .git/index (added after the kept
# recordings were made: ``replay.legacy_command``)
GIT_READ = "export GIT_OPTIONAL_LOCKS=0; "


class GitState(BaseModel):
    """Input of ``git_state``: HEAD, branch, dirty files, recent commits and the reflog."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    max_commits: int = 50

    def command(self) -> str:
        r = q(self.repo)
        n = int(self.max_commits)
        return (
            f"{GIT_READ}cd {r} && echo '== head' && git rev-parse HEAD && echo '== branch' && (git symbolic-ref --short -q HEAD || echo '(detached)') "
            f"&& echo '== status' && git status --porcelain --untracked-files=no && echo '== log' && "
            f"git log -n {n} --format='%H%x1f%h%x1f%cI%x1f%s' && echo '== reflog' && "
            f"git reflog -n 20 --date=iso-strict --format='%H%x1f%gd%x1f%gs' && echo '== end'"
        )


class Commit(BaseModel):
    sha: str
    short: str
    date: str
    subject: str


class ReflogEntry(BaseModel):
    sha: str
    when: str
    action: str


class GitInfo(BaseModel):
    repo: str
    head: str
    branch: str
    dirty: list[str]
    commits: list[Commit]
    reflog: list[ReflogEntry]

    def previous_head(self) -> str | None:
        """Where HEAD was before it last moved to a different commit (from the reflog)."""
        for e in self.reflog[1:]:
            if e.sha != self.head:
                return e.sha
        return None


@parser("git_state")
def parse_git_state(repo: str, text: str) -> GitInfo:
    s = split_sections(text, "git_state", ["head", "branch", "status", "log", "reflog", "end"])
    commits = []
    for ln in s["log"]:
        parts = ln.split(SEP, 3)   # the subject is last and may hold the separator itself
        if len(parts) != 4:
            raise ParseError("a log line without 4 fields", tool="git_state", excerpt=ln)
        commits.append(Commit(sha=parts[0], short=parts[1], date=parts[2], subject=parts[3]))
    reflog = []
    for ln in s["reflog"]:
        parts = ln.split(SEP, 2)
        if len(parts) != 3:
            raise ParseError("a reflog line without 3 fields", tool="git_state", excerpt=ln)
        when = parts[1][parts[1].find("{") + 1: -1] if "{" in parts[1] else parts[1]
        reflog.append(ReflogEntry(sha=parts[0], when=when, action=parts[2]))
    head = (s["head"] or [""])[0].strip()
    if not re.fullmatch(r"[0-9a-f]{7,64}", head):
        raise ParseError(f"HEAD is not a hash: {head!r}", tool="git_state")
    return GitInfo(repo=repo, head=head, branch=(s["branch"] or ["?"])[0].strip(),
                   dirty=[ln[3:] for ln in s["status"] if ln.strip()], commits=commits, reflog=reflog)


# ---------------------------------------------------------------- host
class HostInfo(BaseModel):
    """Input of ``host_info``: hostname, kernel, cores, load, CPU governors, host profile."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return (
            "echo '== hostname'; hostname; echo '== kernel'; uname -r; echo '== cores'; nproc; "
            "echo '== loadavg'; cat /proc/loadavg; echo '== governor'; "
            "cat /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor 2>/dev/null | sort | uniq -c; "
            "echo '== profile'; cat /etc/debugagent/host.json 2>/dev/null; echo; echo '== end'"
        )


class HostFacts(BaseModel):
    hostname: str
    kernel: str
    cores: int
    load1: float
    governors: dict[str, int]  # governor -> number of CPUs
    profile: dict[str, Any] = Field(default_factory=dict)

    @property
    def governor(self) -> str | None:
        if not self.governors:
            return None
        return max(self.governors.items(), key=lambda kv: kv[1])[0] if len(self.governors) == 1 else ",".join(sorted(self.governors))


@parser("host_info")
def parse_host_info(text: str) -> HostFacts:
    s = split_sections(text, "host_info", ["hostname", "kernel", "cores", "loadavg", "governor", "end"])
    try:
        cores = int(s["cores"][0].strip())
        load1 = float(s["loadavg"][0].split()[0])
    except (IndexError, ValueError) as exc:
        raise ParseError(f"bad cores or loadavg: {exc}", tool="host_info") from exc
    govs: dict[str, int] = {}
    for ln in s["governor"]:
        parts = ln.split()
        if len(parts) == 2 and parts[0].isdigit():
            govs[parts[1]] = int(parts[0])
    profile: dict[str, Any] = {}
    raw = "\n".join(s.get("profile", [])).strip()
    if raw:
        try:
            profile = json.loads(raw)
        except ValueError as exc:
            raise ParseError(f"/etc/debugagent/host.json is not JSON: {exc}", tool="host_info") from exc
    return HostFacts(hostname=s["hostname"][0].strip() if s["hostname"] else "", kernel=(s["kernel"] or [""])[0].strip(),
                     cores=cores, load1=load1, governors=govs, profile=profile)


# ---------------------------------------------------------------- benchmark
class Bench(BaseModel):
    """Input of ``bench``: run ``cmd`` once (in ``cwd``) and read ``metric`` from its output.

    A benchmark that writes a result file (``output_file``, else the one its command names: SGLang
    ``bench_serving --output-file``, vLLM ``bench serve --result-dir/--result-filename``) has that file printed
    after its output, behind a marker line, and read from there; a command that names none is sent as it is.
    """

    model_config = ConfigDict(extra="forbid")
    cmd: str
    metric: str
    cwd: str | None = None
    regex: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    output_file: str | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d = handler(self)
        if d.get("output_file") is None:   # recorded inputs stay as they were for a benchmark with no file
            d.pop("output_file", None)
        return d

    def result_file(self) -> str | None:
        """The file the benchmark writes its result to, or None."""
        return self.output_file or benchfmt.output_file_of(self.cmd)

    def command(self) -> str:
        env = " ".join(f"{k}={q(v)}" for k, v in sorted(self.env.items()))
        body = (f"env {env} " if env else "") + self.cmd
        path = self.result_file()
        if path is None:
            return f"cd {q(self.cwd)} && {body}" if self.cwd else body
        wrapped = benchfmt.with_output_file(body, path)   # a relative path is the benchmark's, in its cwd
        return f"cd {q(self.cwd)} && {{ {wrapped}\n}}" if self.cwd else wrapped


def parse_bench(text: str, metric: str, regex: str | None = None) -> tuple[float, str | None]:
    """``(value, unit)`` of ``metric`` in a benchmark's output (``benchfmt.read_bench``): the user's regex (group 1,
    last match), else the result file printed after the output, a JSON result line, the result table both
    engines print, then ``METRIC=VALUE UNIT`` (the last match wins: benchmarks print warm-up lines first)."""
    return benchfmt.read_bench(text, metric, regex)


# ---------------------------------------------------------------- driver files
class DriverFiles(BaseModel):
    """Input of ``driver_files``: the kernel module's version line and the user-space library's install time."""

    model_config = ConfigDict(extra="forbid")

    def command(self) -> str:
        return ("cat /proc/driver/nvidia/version 2>/dev/null; echo '== libs'; "
                "stat -c '%Y %n' /usr/lib/x86_64-linux-gnu/libcuda.so.*.* /usr/lib64/libcuda.so.*.* "
                "/usr/local/nvidia/lib64/libcuda.so.*.* /usr/lib/wsl/lib/libcuda.so.*.* 2>/dev/null; echo '== end'")


class DriverFacts(BaseModel):
    module_version: str | None = None
    library_version: str | None = None
    installed_at: int | None = None


@parser("driver_files")
def parse_driver_files(text: str) -> DriverFacts:
    m = re.search(r"Kernel Module\s+([0-9.]+)", text)
    libs = split_sections(text, "driver_files", ["libs", "end"])["libs"]
    newest = None
    version = None
    for ln in libs:
        parts = ln.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            ts = int(parts[0])
            if ts < 946684800:  # before 2000: a container's bind mount, not an install time
                ts = 0
            if newest is None or ts > newest:
                newest = ts or None
                mv = re.search(r"libcuda\.so\.([0-9.]+)$", parts[1])
                version = mv.group(1) if mv else None
    return DriverFacts(module_version=m.group(1) if m else None, library_version=version, installed_at=newest)


class GitRange(BaseModel):
    """Input of ``git_range``: the commits after ``good`` up to ``bad``, oldest first (for bisection)."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    good: str
    bad: str = "HEAD"

    def command(self) -> str:
        return (f"{GIT_READ}git -C {q(self.repo)} log --reverse --ancestry-path --format='%H%x1f%h%x1f%cI%x1f%s' "
                f"{q(self.good)}..{q(self.bad)}")


class CommitList(BaseModel):
    commits: list[Commit]


@parser("git_range")
def parse_git_range(text: str) -> CommitList:
    out = []
    for ln in split_lines(text):
        if not ln.strip():
            continue
        parts = ln.split(SEP, 3)   # the subject is last and may hold the separator itself
        if len(parts) != 4:
            raise ParseError("a log line without 4 fields", tool="git_range", excerpt=ln)
        out.append(Commit(sha=parts[0], short=parts[1], date=parts[2], subject=parts[3]))
    return CommitList(commits=out)
