"""How the server is run (its shape): the launcher, where its engine is imported from, what supervises it, and
whether it runs in a container.

``server_shape`` is one read-only command: the server's cgroups (``/proc/PID/cgroup``), the container marks in its
own root (``/.dockerenv``, ``/run/.containerenv``), its ancestors up to pid 1 (a ``supervisord`` among them, with
the config it was started with), the ``SUPERVISOR_*`` variables supervisord gives its programs, and, for a Python
server, its own interpreter run in its cwd with its ``PYTHONPATH`` as its user (``host.as_owner_of``): how it was
launched (a console script such as ``vllm serve``, ``python -m MODULE``, a script) and where the engine's package
is found (``importlib.util.find_spec``: a venv's site-packages, a system Python's dist-packages, an editable
install, the cwd, ``PYTHONPATH``). ``parse_server_shape`` turns it into a ``ServerShape``.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import parser
from .transport import q, split_sections

SHAPE_SCRIPT = r"""
import importlib.util, json, os, re, sys, sysconfig
pid = sys.argv[1]
argv = open("/proc/%s/cmdline" % pid, "rb").read().decode("utf-8", "replace").split("\0")[:-1]
out = {"python": sys.executable, "prefix": sys.prefix, "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
       "launcher": "binary", "command": os.path.basename(argv[0]) if argv else "", "module": None, "script": None}
rest = argv[1:]
while rest and rest[0].startswith("-") and rest[0] != "-m":
    rest = rest[1 + (rest[0] in ("-W", "-X")):]
if rest and rest[0] == "-m" and len(rest) > 1:
    out.update(launcher="module", command=rest[1], module=rest[1])
elif rest:
    path = rest[0]
    out.update(launcher="script", command=path, script=os.path.realpath(path))
    try:
        head = open(path, "rb").read(4096).decode("utf-8", "replace")
    except OSError:
        head = ""
    m = re.search(r"^from ([A-Za-z_][\w.]*) import ([A-Za-z_][\w.]*)\s*$", head, re.M)
    if head.startswith("#!") and m and "sys.exit(" in head:
        out.update(launcher="console_script", command=os.path.basename(path), module=m.group(1),
                   function=m.group(2))
    elif path.endswith(".py") or head.startswith("#!"):
        out["module"] = None
cwd = os.path.realpath(os.getcwd())
pp = [os.path.realpath(x) for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
engine = None
top = (out["module"] or "").split(".")[0]
if top:
    engine = {"module": top}
    try:
        s = importlib.util.find_spec(top)
    except Exception as e:
        s = None
        engine["error"] = type(e).__name__ + ": " + str(e)[:160]
    if s is not None and (s.origin or s.submodule_search_locations):
        where = list(s.submodule_search_locations or [])[:1] or [s.origin]
        root = os.path.dirname(os.path.realpath(where[0]))
        engine.update(origin=s.origin, root=root)
        base = os.path.basename(root)
        if root == cwd:
            engine["how"] = "cwd"
        elif root in pp:
            engine["how"] = "PYTHONPATH"
        elif root in (os.path.realpath(sysconfig.get_paths()["stdlib"]), os.path.realpath(sysconfig.get_paths()["platstdlib"])):
            engine["how"] = "stdlib"
        elif base in ("site-packages", "dist-packages"):
            engine["how"] = base
        else:
            engine["how"] = "editable"
        try:
            import importlib.metadata as md
            names = md.packages_distributions().get(top) or []
            if names:
                d = md.distribution(names[0])
                engine.update(distribution=d.metadata["Name"], version=d.version)
                du = json.loads(d.read_text("direct_url.json") or "null")
                if du and du.get("dir_info", {}).get("editable"):
                    engine["how"] = "editable"
                    engine["editable"] = du.get("url", "").replace("file://", "")
        except Exception:
            pass
    elif "error" not in engine:
        engine["error"] = "not importable"
elif out["script"]:
    d = os.path.dirname(out["script"])
    engine = {"module": None, "origin": out["script"], "root": d, "how": "cwd" if d == cwd else "script"}
out["engine"] = engine
print(json.dumps(out))
"""


class ServerShapeInput(BaseModel):
    """Input of ``server_shape``: server ``pid``; ``python``, its interpreter (None: not a Python server)."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    python: str | None = None
    cwd: str = ""

    def command(self) -> str:
        from .host import as_owner_of
        from .mutate import SAME, TREE
        SAME_TICKS = SAME[SAME.index("ticks()"):]  # noqa: N806
        p = f"/proc/{int(self.pid)}"
        shell = (
            f"p={p}; [ -r $p/cmdline ] || {{ echo 'no such process'; exit 1; }}; "
            "echo '== cgroup'; cat $p/cgroup 2>/dev/null; "
            "echo '== marks'; for f in /.dockerenv /run/.containerenv; do [ -e $p/root$f ] && echo $f; done; "
            "[ \"$(readlink $p/ns/mnt 2>/dev/null)\" = \"$(readlink /proc/self/ns/mnt 2>/dev/null)\" ] && echo same-mnt-ns; "
            "echo '== self_cgroup'; cat /proc/self/cgroup 2>/dev/null; "
            "echo '== supervisor_env'; tr '\\0' '\\n' 2>/dev/null < $p/environ | grep -E '^SUPERVISOR_(PROCESS_NAME|GROUP_NAME|ENABLED)=' ; "
            "echo '== tree'; " + SAME_TICKS + TREE + f"for e in $(kids {int(self.pid)}); do k=${{e%%:*}}; "
            "s=$(cat /proc/$k/stat 2>/dev/null) || continue; s=${s##*) }; set -- $s; printf '%s\\t%s\\t' \"$k\" \"$2\"; "
            "tr '\\0' '\\037' 2>/dev/null < /proc/$k/cmdline | head -c 300; echo; done; "
            "echo '== ancestors'; a=$(awk '{print $4}' $p/stat 2>/dev/null); "
            "while [ -n \"$a\" ] && [ \"$a\" -gt 0 ] 2>/dev/null; do printf '%s\\t%s\\t' \"$a\" \"$(cat /proc/$a/comm 2>/dev/null)\"; "
            "tr '\\0' '\\037' 2>/dev/null < /proc/$a/cmdline | head -c 300; echo; [ \"$a\" = 1 ] && break; "
            "a=$(s=$(cat /proc/$a/stat 2>/dev/null) && s=${s##*) } && set -- $s && echo $2); done; "
        )
        if not self.python:
            return shell + "echo '== end'"
        return (shell + "echo '== python'; ( " + as_owner_of(self.pid)
                + (f"cd {q(self.cwd)} 2>/dev/null; " if self.cwd else "")
                + f"PYTHONPATH=$(tr '\\0' '\\n' < {p}/environ | sed -n 's/^PYTHONPATH=//p' | head -1) "
                + f"$R {q(self.python)} -c {q(SHAPE_SCRIPT.strip())} {int(self.pid)} 2>&1 | tail -3 ); echo '== end'")

    def display_command(self) -> str:
        return (f"cat /proc/{int(self.pid)}/cgroup; its ancestors; "
                + (f"{self.python} -c '<how it was launched; find_spec of its engine>'" if self.python else "(not Python)"))


class Engine(BaseModel):
    """Where the server's engine package is imported from."""

    module: str | None = None
    origin: str | None = None
    root: str | None = None
    how: str = ""     # site-packages | dist-packages | editable | cwd | PYTHONPATH | script
    distribution: str | None = None
    version: str | None = None
    editable: str | None = None
    error: str | None = None


class Ancestor(BaseModel):
    pid: int
    comm: str = ""
    argv: list[str] = Field(default_factory=list)


class Worker(BaseModel):
    """One process under the server (an engine core, a GPU worker, multiprocessing's resource tracker)."""

    pid: int
    ppid: int
    argv: list[str] = Field(default_factory=list)


class Supervisor(BaseModel):
    """What restarts the server when it exits: a systemd unit or a supervisord program (or another supervisor)."""

    kind: Literal["systemd", "supervisord", "other"]
    unit: str | None = None          # systemd: the unit from /proc/PID/cgroup
    pid: int | None = None           # the supervising process
    name: str = ""                   # its comm
    config: str | None = None        # supervisord: the config it runs with (-c), else the default it would read
    argv: list[str] = Field(default_factory=list)   # the supervising process's command line
    program: str | None = None       # supervisord: SUPERVISOR_PROCESS_NAME
    group: str | None = None         # supervisord: SUPERVISOR_GROUP_NAME
    evidence: str = ""


class Container(BaseModel):
    """The server runs in a container (detected only: the container transports reach into it)."""

    runtime: str                     # docker | podman | containerd | kubernetes | crio | lxc | unknown
    shared: bool = False             # debugagent's own shell runs in it too (the same mount namespace and marks)
    id: str | None = None
    pod_uid: str | None = None
    evidence: str = ""


class ServerShape(BaseModel):
    """How the server is run: launcher, Python layout, engine origin, parent chain, supervisor, container."""

    launcher: str = "unknown"        # console_script | module | script | binary | unknown
    command: str = ""                # the console script's name, the module, the script, the binary
    module: str | None = None        # the module a console script or ``-m`` runs
    python: str | None = None
    layout: str | None = None        # venv | system | other (None: not a Python server, or not read)
    engine: Engine | None = None
    tree: list[Worker] = Field(default_factory=list)          # every descendant: what a restart stops with it
    ancestors: list[Ancestor] = Field(default_factory=list)   # parent first, up to pid 1
    supervisor: Supervisor | None = None
    container: Container | None = None
    errors: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """One sentence for the transcript."""
        how = {"console_script": f"the console script `{self.command}`" + (f" (module `{self.module}`)" if self.module else ""),
               "module": f"`python -m {self.command}`", "script": f"the script `{self.command}`",
               "binary": f"the program `{self.command}`"}.get(self.launcher, "an unknown launcher")
        parts = [f"launched as {how}"]
        if self.tree:
            parts.append(f"a tree of {len(self.tree) + 1} processes (workers: pid "
                         + ", ".join(str(w.pid) for w in self.tree) + "), stopped and started as one")
        if self.layout:
            parts.append({"venv": "from a virtual environment", "system": "by a system Python"}.get(self.layout, "by a Python")
                         + (f" ({self.python})" if self.python else ""))
        e = self.engine
        if e is not None and (e.root or e.error):
            what = f"its engine `{e.module}`" if e.module else "its code"
            if e.error:
                parts.append(f"{what} could not be located ({e.error})")
            else:
                where = {"site-packages": "site-packages (installed, not editable)",
                         "dist-packages": "dist-packages (a system-Python layout)",
                         "editable": "an editable install" + (f" of {e.editable}" if e.editable else ""),
                         "cwd": "its working directory", "PYTHONPATH": "PYTHONPATH",
                         "script": "the script's folder", "stdlib": "the standard library"}.get(e.how, e.how)
                ver = f" ({e.distribution} {e.version})" if e.distribution and e.version else ""
                parts.append(f"{what}{ver} is imported from {where} ({e.root})")
        s = self.supervisor
        if s is not None:
            if s.kind == "systemd":
                parts.append(f"run by the systemd unit `{s.unit}` ({s.evidence})")
            elif s.kind == "supervisord":
                parts.append(f"run by supervisord (pid {s.pid}) as the program `{s.program or '?'}`"
                             + (f", config {s.config}" if s.config else ""))
            else:
                parts.append(f"supervised by `{s.name}` (pid {s.pid})")
        c = self.container
        if c is not None:
            parts.append(f"in a {c.runtime} container" + (f" {c.id[:12]}" if c.id else "")
                         + (f" of pod {c.pod_uid}" if c.pod_uid else "") + f" ({c.evidence}"
                         + ("; debugagent's shell runs in it too" if c.shared else "") + ")")
        return "; ".join(parts)


# cgroup paths: docker-<id>.scope, /docker/<id>, libpod-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope,
# kubepods…pod<uid>…
_CONTAINER_RE = [
    ("kubernetes", re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")),
    ("podman", re.compile(r"libpod-(?:conmon-)?([0-9a-f]{12,64})")),
    ("containerd", re.compile(r"cri-containerd-([0-9a-f]{12,64})")),
    ("crio", re.compile(r"crio-(?:conmon-)?([0-9a-f]{12,64})")),
    ("docker", re.compile(r"docker-([0-9a-f]{12,64})\.scope|/docker/([0-9a-f]{12,64})")),
    ("lxc", re.compile(r"/lxc(?:\.payload)?[./]([^/]+)")),
]
_ID_RE = re.compile(r"(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12,64})|/docker/([0-9a-f]{12,64})")


def container_of(cgroups: list[str], marks: list[str]) -> Container | None:
    """The container a process runs in, from its cgroup paths and the marks its root holds."""
    for line in cgroups:
        path = line.split(":", 2)[-1]
        for runtime, rx in _CONTAINER_RE:
            m = rx.search(path)
            if not m:
                continue
            if runtime == "kubernetes":
                cid = _ID_RE.search(path)
                return Container(runtime="kubernetes", pod_uid=m.group(1).replace("_", "-"),
                                 id=next((g for g in cid.groups() if g), None) if cid else None,
                                 evidence=f"/proc/PID/cgroup: {path}")
            return Container(runtime=runtime, id=next((g for g in m.groups() if g), None),
                             evidence=f"/proc/PID/cgroup: {path}")
    if "/.dockerenv" in marks:
        return Container(runtime="docker", evidence="/.dockerenv in its root")
    if "/run/.containerenv" in marks:
        return Container(runtime="podman", evidence="/run/.containerenv in its root")
    return None


def systemd_unit(cgroups: list[str]) -> tuple[str, str] | None:
    """(unit, path): the service a process runs in, from its unified or name=systemd cgroup (not a user@ manager)."""
    for line in cgroups:
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or parts[1] not in ("", "name=systemd"):
            continue
        for leaf in reversed(parts[2].strip("/").split("/")):
            if leaf.endswith(".service") and not leaf.startswith("user@"):
                return leaf, parts[2]
    return None


SUPERVISORD_DEFAULTS = ("/etc/supervisord.conf", "/etc/supervisor/supervisord.conf", "/usr/local/etc/supervisord.conf")


def supervisord_config(argv: list[str]) -> str | None:
    """The config a supervisord command line names (``-c PATH``, ``--configuration[=]PATH``), else None."""
    for i, a in enumerate(argv):
        if a in ("-c", "--configuration") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--configuration="):
            return a.split("=", 1)[1]
        if a.startswith("-c") and len(a) > 2 and not a.startswith("--"):
            return a[2:]
    return None


def _is_supervisord(a: Ancestor) -> bool:
    return a.comm == "supervisord" or any(x.rsplit("/", 1)[-1] == "supervisord" for x in a.argv[:3])


OTHER_SUPERVISORS = ("supervise", "s6-supervise", "runsv", "circusd", "pm2", "monit")


@parser("server_shape")
def parse_server_shape(pid: int, text: str) -> ServerShape:
    sections = split_sections(text, "server_shape", ["end"])
    cgroups = [c.strip() for c in sections.get("cgroup", []) if c.strip()]
    marks = [m.strip() for m in sections.get("marks", []) if m.strip()]
    ancestors = []
    for ln in sections.get("ancestors", []):
        f = ln.split("\t", 2)
        if len(f) >= 2 and f[0].isdigit():
            ancestors.append(Ancestor(pid=int(f[0]), comm=f[1], argv=[a for a in (f[2] if len(f) > 2 else "").split("\x1f") if a]))
    tree = []
    for ln in sections.get("tree", []):
        f = ln.split("\t", 2)
        if len(f) >= 2 and f[0].isdigit() and f[1].isdigit():
            tree.append(Worker(pid=int(f[0]), ppid=int(f[1]), argv=[a for a in (f[2] if len(f) > 2 else "").split("\x1f") if a]))
    senv = dict(ln.split("=", 1) for ln in sections.get("supervisor_env", []) if "=" in ln)
    mine = {c.split(":", 2)[-1] for c in sections.get("self_cgroup", []) if c.strip()}
    container = container_of(cgroups, marks)
    if container is not None:
        own = container_of([c for c in sections.get("self_cgroup", []) if c.strip()], marks)
        container.shared = "same-mnt-ns" in marks and (own is not None and own.id == container.id
                                                       or {c.split(":", 2)[-1] for c in cgroups} <= mine)
    shape = ServerShape(ancestors=ancestors, tree=tree, container=container)
    sup = next((a for a in ancestors if _is_supervisord(a)), None)
    unit = systemd_unit(cgroups)
    if sup is not None:
        shape.supervisor = Supervisor(kind="supervisord", pid=sup.pid, name="supervisord",
                                      config=supervisord_config(sup.argv), argv=sup.argv, program=senv.get("SUPERVISOR_PROCESS_NAME"),
                                      group=senv.get("SUPERVISOR_GROUP_NAME"),
                                      evidence=f"its ancestor pid {sup.pid} runs `{' '.join(sup.argv)[:160]}`")
    elif unit is not None and shape.container is None:
        shape.supervisor = Supervisor(kind="systemd", unit=unit[0], evidence=f"/proc/{pid}/cgroup: {unit[1]}")
    elif ancestors and ancestors[0].pid > 1 and ancestors[0].comm in OTHER_SUPERVISORS:
        a = ancestors[0]
        shape.supervisor = Supervisor(kind="other", pid=a.pid, name=a.comm, evidence=f"its parent pid {a.pid} `{a.comm}`")
    py = [ln for ln in sections.get("python", []) if ln.strip()]
    js = next((ln for ln in reversed(py) if ln.startswith("{")), None)
    if js is not None:
        try:
            d = json.loads(js)
        except ValueError:
            d = None
        if isinstance(d, dict):
            shape.launcher = str(d.get("launcher") or "unknown")
            shape.command = str(d.get("command") or "")
            shape.module = d.get("module")
            shape.python = d.get("python")
            prefix = str(d.get("prefix") or "")
            if d.get("engine"):
                shape.engine = Engine.model_validate(d["engine"])
            # a system Python: the distribution's own prefix, or one whose packages live in dist-packages (Debian's
            # site layout, as an image's /usr/bin/python3 copied under another prefix keeps it)
            dist = shape.engine is not None and shape.engine.how == "dist-packages"
            shape.layout = "venv" if d.get("venv") else "system" if prefix in ("/usr", "/usr/local") or dist else "other"
    elif py:
        shape.errors.append("the server's interpreter could not say how it runs: " + py[-1][:200])
    return shape
