"""Mutating tools: used only by experiments, each one paired with the step that undoes it.

Also the read-only checks an experiment makes before it acts (how the server is run and
supervised, where it imports its code from, whether it is ready, which wheels are on the
host). Every argument reaches the shell through ``shlex.quote``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import ParseError, parser
from .session import ansi_c_quote
from .transport import q, split_sections

# the repository's hooks (post-checkout) never run for debugagent's own worktrees: what they did would not be undone
# (added after the kept recordings were made: ``replay.legacy_command``)
NO_HOOKS = "-c core.hooksPath=/dev/null "


class WorktreeAdd(BaseModel):
    """``git worktree add --detach PATH COMMIT``: a second checkout, with no hook run; the user's tree is untouched."""

    model_config = ConfigDict(extra="forbid")
    repo: str
    path: str
    commit: str

    def command(self) -> str:
        return f"git {NO_HOOKS}-C {q(self.repo)} worktree add --detach -f {q(self.path)} {q(self.commit)} 2>&1"


class WorktreeRemove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    path: str

    def command(self) -> str:
        return (f"git -C {q(self.repo)} worktree remove --force {q(self.path)} 2>&1; "
                f"git -C {q(self.repo)} worktree prune; rm -rf {q(self.path)}; echo removed")


DEFAULT_LOG = "$HOME/.local/state/debugagent/server.log"


def cmdline_key(argv: list[str]) -> str:
    """``/proc/PID/cmdline`` with its NULs as \\x1f: how a restart recognises the process it may stop."""
    return "".join(a + "\x1f" for a in argv)


def cmdline_match(argv: list[str]) -> str:
    """The arguments of the restart script's ``same PID …``: the command line's bytes, compared in the C locale.
    Where the command line was read with an undecodable byte (U+FFFD), the parts around it are compared as
    bytes, each replaced run by at least one byte: a non-UTF-8 argument still names its process."""
    return " ".join(ansi_c_quote(part) for part in cmdline_key(argv).split("\ufffd"))


# bash builtins only: the command line of $1 as its arguments joined by \x1f (and one after the last), then
# compared part by part with the arguments after the pid (see ``cmdline_match``)
SAME = (
    "keyof() { local A; mapfile -d '' -t A 2>/dev/null < /proc/$1/cmdline || return 1; [ ${#A[@]} -gt 0 ] || return 1; "
    "local IFS=$'\\037'; c=\"${A[*]}\"$'\\037'; }; "
    "same() { local c; keyof $1 || return 1; shift; if [ $# -eq 1 ]; then [ \"$c\" = \"$1\" ]; return; fi; "
    "[[ $c == \"$1\"* ]] || return 1; c=${c:${#1}}; shift; "
    "while [ $# -gt 1 ]; do [[ $c == ?*\"$1\"* ]] || return 1; c=${c#*?\"$1\"}; shift; done; [[ $c == ?*\"$1\" ]]; }; "
    "ticks() { local s; read -r s 2>/dev/null < /proc/$1/stat || return 1; s=${s##*) }; set -- $s; echo \"${20}\"; }; "
)


# ---------------------------------------------------------------- who a server runs as
# /proc/PID/limits' names -> prlimit's options (the units are the same: bytes, seconds, counts)
LIMITS = {"Max cpu time": "cpu", "Max file size": "fsize", "Max data size": "data", "Max stack size": "stack",
          "Max core file size": "core", "Max resident set": "rss", "Max processes": "nproc", "Max open files": "nofile",
          "Max locked memory": "memlock", "Max address space": "as", "Max file locks": "locks",
          "Max pending signals": "sigpending", "Max msgqueue size": "msgqueue", "Max nice priority": "nice",
          "Max realtime priority": "rtprio", "Max realtime timeout": "rttime"}
LIMIT_VALUE = r"^(unlimited|[0-9]{1,20})$"
IDENTITY_FIELDS = ("uid", "gid", "groups", "nice", "umask", "cgroup")
# a cgroup as /proc/PID/cgroup names it, less its hierarchy number: `CONTROLLERS:PATH` (`:/x` for cgroup v2)
CGROUP = r"^[a-z0-9_=,]*:/[A-Za-z0-9._@:=+,/-]*$"


def identity_lines(proc: str) -> str:
    """Shell that prints who the process of the folder ``proc`` (``$p``, ``/proc/$$``) runs as: its ``Uid:``,
    ``Gid:``, ``Groups:`` and ``Umask:`` lines, ``Nice: N`` (``/proc/PID/stat``'s field 19) and its limits."""
    return (f"grep -E '^(Uid|Gid|Groups|Umask):' {proc}/status 2>/dev/null; s=$(cat {proc}/stat 2>/dev/null); "
            f"s=${{s##*) }}; set -- $s; echo \"Nice: ${{17}}\"; cat {proc}/limits 2>/dev/null; "
            f"sed 's/^/Cgroup: /' {proc}/cgroup 2>/dev/null; ")


class Identity(BaseModel):
    """Who a process runs as: effective uid and gid, supplementary groups, umask (octal), nice, and each resource
    limit as prlimit names it (``nofile``: [soft, hard], each a number or ``unlimited``)."""

    uid: int
    gid: int
    groups: list[int] = Field(default_factory=list)
    umask: str | None = None
    nice: int | None = None
    limits: dict[str, list[str]] = Field(default_factory=dict)
    cgroup: list[str] | None = None   # `CONTROLLERS:PATH` per hierarchy (None: not read, an older journal)

    def value(self, field: str) -> Any:
        """``uid``, ``gid``, ``groups``, ``umask``, ``nice``, or a limit (``limit:nofile``: [soft, hard]). The groups
        are compared without the gid: a supplementary group that is also the gid grants nothing more (root's login
        shell has group 0, a server started by a program often none)."""
        if field == "groups":
            return self.extra_groups()
        if field == "cgroup":
            return sorted(self.cgroup) if self.cgroup is not None else None
        return self.limits.get(field[6:]) if field.startswith("limit:") else getattr(self, field, None)

    def extra_groups(self) -> list[int]:
        return sorted(set(self.groups) - {self.gid})

    def differs(self, other: Identity, fields: set[str] | None = None) -> set[str]:
        """The fields (all where None) in which ``other`` differs from this."""
        names = fields if fields is not None else {*IDENTITY_FIELDS, *(f"limit:{k}" for k in {*self.limits, *other.limits})}
        if self.cgroup is None or other.cgroup is None:   # one side read before cgroups were: nothing to compare
            names = set(names) - {"cgroup"}
        return {f for f in names if self.value(f) != other.value(f)}

    def describe(self, fields: set[str] | None = None) -> str:
        """``uid 65534, gid 65534, groups 65534, nice 5, umask 0027, nofile 4096:4096`` (only ``fields``, if given)."""
        out = []
        for name in IDENTITY_FIELDS:
            v = getattr(self, name)
            if (fields is None or name in fields) and v is not None:
                out.append(f"{name} {(','.join(map(str, v)) or 'none') if isinstance(v, list) else v}")
        out += [f"{'nice limit' if k == 'nice' else k} {':'.join(v)}" for k, v in sorted(self.limits.items())
                if fields is None or f"limit:{k}" in fields]
        return ", ".join(out)


def parse_identity(lines: list[str]) -> Identity | None:
    """The lines :func:`identity_lines` printed; None without ``Uid:`` and ``Gid:`` (nothing read)."""
    ids: dict[str, list[str]] = {}
    limits: dict[str, list[str]] = {}
    cgroups: list[str] = []
    for ln in lines:
        if ln.startswith("Cgroup: "):   # `N:CONTROLLERS:PATH`
            parts = ln[8:].strip().split(":", 2)
            if len(parts) == 3 and re.fullmatch(CGROUP, f"{parts[1]}:{parts[2]}"):
                cgroups.append(f"{parts[1]}:{parts[2]}")
            continue
        key, colon, rest = ln.partition(":")
        if colon and key in ("Uid", "Gid", "Groups", "Umask", "Nice"):
            ids[key] = rest.split()
            continue
        name = next((n for n in LIMITS if ln.startswith(n + " ")), None)
        vals = ln[len(name):].split() if name else []
        if name and len(vals) >= 2 and all(re.match(LIMIT_VALUE, v) for v in vals[:2]):
            limits[LIMITS[name]] = vals[:2]
    try:
        uid, gid = int(ids["Uid"][1]), int(ids["Gid"][1])
        groups = sorted(int(g) for g in ids.get("Groups", []))
    except (KeyError, IndexError, ValueError):
        return None
    umask = (ids.get("Umask") or [None])[0]
    nice = (ids.get("Nice") or [None])[0]
    return Identity(uid=uid, gid=gid, groups=groups, umask=umask if umask and re.fullmatch(r"[0-7]{3,4}", umask) else None,
                    nice=int(nice) if nice and re.fullmatch(r"-?[0-9]{1,2}", nice) else None, limits=limits,
                    cgroup=sorted(cgroups) if cgroups else None)


class RunAs(BaseModel):
    """What a restart sets so the server starts as it was found, where that differs from the restarting shell:
    ``uid``/``gid``/``groups`` (``setpriv``, all three or none), ``umask``, ``nice`` (absolute), ``limits``
    (``prlimit``, soft and hard). Empty: the server inherits the shell's, as it always did."""

    model_config = ConfigDict(extra="forbid")
    uid: int | None = Field(default=None, ge=0)
    gid: int | None = Field(default=None, ge=0)
    groups: list[Annotated[int, Field(ge=0)]] | None = None
    umask: Annotated[str, Field(pattern=r"^[0-7]{3,4}$")] | None = None
    nice: int | None = Field(default=None, ge=-20, le=19)
    limits: dict[Literal[tuple(LIMITS.values())], Annotated[list[Annotated[str, Field(pattern=LIMIT_VALUE)]],  # type: ignore[valid-type]
                                                          Field(min_length=2, max_length=2)]] = Field(default_factory=dict)
    cgroup: list[Annotated[str, Field(pattern=CGROUP)]] | None = None   # the found server's cgroups the shell is not in

    @classmethod
    def of(cls, found: Identity | None, shell: Identity | None) -> RunAs | None:
        """The found server's identity where it differs from the shell's; None where nothing differs (or either
        is unknown: an older recording)."""
        if found is None or shell is None:
            return None
        ids = (found.uid, found.gid, found.extra_groups()) != (shell.uid, shell.gid, shell.extra_groups())
        ra = cls(uid=found.uid if ids else None, gid=found.gid if ids else None, groups=found.groups if ids else None,
                 umask=found.umask if found.umask and found.umask != shell.umask else None,
                 nice=found.nice if found.nice is not None and shell.nice is not None and found.nice != shell.nice else None,
                 limits={k: v for k, v in found.limits.items() if shell.limits.get(k) != v},
                 cgroup=[c for c in found.cgroup if c not in shell.cgroup] or None
                 if found.cgroup is not None and shell.cgroup is not None else None)
        return ra if ra.fields() else None

    def fields(self) -> set[str]:
        """The names this sets (``uid``, ``umask``, ``limit:nofile``, …)."""
        out = {n for n in IDENTITY_FIELDS if getattr(self, n) is not None}
        return out | {f"limit:{k}" for k in self.limits}

    def needs_root(self, shell: Identity) -> list[str]:
        """What a shell that is not root cannot set: another user, a lower nice, a higher hard limit."""
        if shell.uid == 0:
            return []
        out = [f"uid {self.uid}"] if self.uid is not None and self.uid != shell.uid else []
        if self.cgroup:
            out.append(f"cgroup {', '.join(self.cgroup)}")
        if self.groups is not None and (self.gid != shell.gid or set(self.groups) - set(shell.groups)):
            out.append(f"gid {self.gid}, groups {','.join(map(str, self.groups)) or 'none'}")
        if self.nice is not None and shell.nice is not None and self.nice < shell.nice:
            out.append(f"nice {self.nice}")

        def big(v: str) -> float:
            return float("inf") if v == "unlimited" else float(v)
        out += [f"{k} hard limit {v[1]}" for k, v in sorted(self.limits.items())
                if k in shell.limits and big(v[1]) > big(shell.limits[k][1])]
        return out

    def wrap(self, start: str) -> str:
        """``start`` (the command that becomes the server) run as this: in a subshell that sets the umask, then
        ``prlimit``, ``nice`` and ``setpriv`` in turn, each exec'ing the next (the pid stays the server's)."""
        pre = "exec "
        if self.limits:
            pre += "prlimit " + " ".join(f"--{k}={v[0]}:{v[1]}" for k, v in sorted(self.limits.items())) + " -- "
        if self.nice is not None:
            pre += f"nice -n $(({int(self.nice)} - $(nic $$))) "
        if self.uid is not None and self.gid is not None:
            groups = f"--groups={','.join(str(int(g)) for g in self.groups)}" if self.groups else "--clear-groups"
            pre += f"setpriv --reuid={int(self.uid)} --regid={int(self.gid)} {groups} -- "
        mask = f"umask {self.umask}; " if self.umask else ""
        join = "".join(f"cg_join {q(c.split(':', 1)[0])} {q(c.split(':', 1)[1])} || exit 97; " for c in self.cgroup or [])
        return f"( {CG_JOIN if join else ''}{join}{mask}{pre}{start} )"


# joins this subshell ($BASHPID: the pid that becomes the server) to the cgroup CONTROLLERS:PATH, found under the
# mount of its hierarchy in /proc/self/mountinfo (cgroup2 for no controllers, else the cgroup mount holding them all)
CG_JOIN = ("cg_join() { local d; d=$(awk -v c=\"$1\" '{ for (i = 7; i <= NF && $i != \"-\"; i++); fs = $(i + 1); "
           "n = split($(i + 3), o, \",\"); if (c == \"\" && fs == \"cgroup2\") { print $5; exit } if (c == \"\" || fs != \"cgroup\") next; "
           "k = split(c, w, \",\"); ok = 1; for (j = 1; j <= k; j++) { f = 0; for (m = 1; m <= n; m++) if (o[m] == w[j]) f = 1; "
           "if (!f) ok = 0 } if (ok) { print $5; exit } }' /proc/self/mountinfo); "
           "[ -n \"$d\" ] && echo $BASHPID > \"$d$2/cgroup.procs\" || { echo \"cannot join the cgroup $1:$2\" >&2; return 1; }; }; ")
# the server's whole process tree (an API process and its workers): ``kids PID`` lists every descendant as
# ``PID:START`` (start ticks: a pid reused meanwhile is never signalled); ``reap PID:START …`` stops those still
# running (TERM, up to 10 s, then KILL); a zombie is gone already. Workers a SIGTERM'd parent leaves behind would keep its GPU memory and port.
TREE = ("kids() { local r=$1 all=() s d e q=\" $1 \" n=1; for d in /proc/[0-9]*; do read -r s 2>/dev/null < $d/stat || continue; "
        "s=${s##*) }; set -- $s; all+=(\"${d#/proc/} $2\"); done; while [ $n = 1 ]; do n=0; for e in \"${all[@]}\"; do "
        "[[ $q == *\" ${e#* } \"* && $q != *\" ${e% *} \"* ]] && { q=\"$q${e% *} \"; n=1; }; done; done; "
        "for e in ${q# $r }; do echo \"$e:$(ticks $e)\"; done; }; "
        "alive() { local e l= s; for e in \"$@\"; do read -r s 2>/dev/null < /proc/${e%%:*}/stat || continue; s=${s##*) }; "
        "[ \"${s%% *}\" != Z ] && [ \"$(ticks ${e%%:*})\" = \"${e#*:}\" ] && l=\"$l ${e%%:*}\"; done; echo $l; }; "
        "reap() { local k i; [ $# -gt 0 ] || return 0; for k in $(alive \"$@\"); do kill $k 2>/dev/null; done; "
        "for i in $(seq 1 100); do [ -z \"$(alive \"$@\")\" ] && return 0; sleep 0.1; done; "
        "for k in $(alive \"$@\"); do kill -9 $k 2>/dev/null; done; echo \"killed the workers left: $(alive \"$@\")\"; }; ")
KIDS = "K=$(kids $P); "
REAP = "reap $K; "


def port_check(ports: list[int], wait_s: float) -> str:
    """Shell that waits (up to ``wait_s``) until nothing listens on ``ports`` any more, else ends the script: a
    server is never started beside a process still holding its port."""
    if not ports:
        return ""
    ps = " ".join(str(int(p)) for p in sorted(set(ports)))
    busy = "grep -qE \"^ *[0-9]+: [0-9A-F]+$h [0-9A-F]+:[0-9A-F]+ 0A \" /proc/net/tcp /proc/net/tcp6 2>/dev/null"
    return (f"for pt in {ps}; do h=$(printf ':%04X' $pt); for i in $(seq 1 {int(wait_s * 10)}); do {busy} || break; "
            f"sleep 0.1; done; {busy} && {{ echo \"port $pt is still in use after the server's process tree was stopped: "
            "no second server is started beside what holds it\"; exit 1; }; done; : ports; ")


NICE = "nic() { local s; read -r s 2>/dev/null < /proc/$1/stat || return 1; s=${s##*) }; set -- $s; echo \"${17}\"; }; "


class RestartServer(BaseModel):
    """Stop one server process and start ``argv`` in ``cwd`` with its environment.

    The process to stop is ``pid``, or the pid written in ``stop_pid_file`` (an undo: the
    process the experiment started). It is stopped only if its command line is
    ``expect_argv`` (default ``argv``): a pid that died and was reused, or a server that
    died at start, is never signalled, and pid 0 never is. With ``keep_if_running``, an
    undo finds the original server still running as ``argv`` and does nothing.

    A restart that writes ``pid_file`` first notes ``busy SCRIPT_PID SERVER_PID`` there, then
    the started pid the moment it exists; an undo reading it (``stop_pid_file``) first waits
    while a restart of an interrupted run is still under way on the host, so it never races
    one, and removes the file once the server runs as found.

    The environment is read on the host from ``env_file`` (NUL-separated, as
    ``/proc/PID/environ``), minus ``unset``, plus ``set``, with ``path_first`` placed first
    on ``PYTHONPATH``: secrets in it never leave the host. With ``save_env`` (the
    experiment's first restart) the file is first written afresh from the running process,
    mode 600, and the process's command line (its bytes, NUL-separated) beside it (``argv_file``).
    The new process is detached (``setsid nohup``), its output appended to ``log``; its pid
    and start time (clock ticks after boot) are printed (the pid also written to ``pid_file``),
    with the log's size before the start (where a readiness line is looked for).

    The undo's form (``stop_pid_file`` with ``keep_if_running``) is idempotent from any point:
    without the pid file, the experiment's process is the one the journal names (``stop_pid``
    started at ``stop_start``, with the command line ``expect_argv``); once it is stopped, a
    process that already runs as found (the saved command line's bytes, the folder, the saved
    environment's bytes) is kept, not started twice; the server as found is started from the
    saved command line's bytes. Command lines are compared as bytes (``cmdline_match``).
    """

    model_config = ConfigDict(extra="forbid")
    pid: int = 0
    argv: list[str]
    cwd: str
    env_file: str
    unset: list[str] = Field(default_factory=list)
    set: dict[str, str] = Field(default_factory=dict)
    save_env: bool = False
    path_first: list[str] = Field(default_factory=list)
    stop_pid_file: str | None = None
    expect_argv: list[str] | None = None
    keep_if_running: int = 0
    pid_file: str | None = None
    log: str = DEFAULT_LOG
    wait_s: float = 10.0
    stop_pid: int = 0
    stop_start: int = 0
    run_as: RunAs | None = None   # the found server's uid, groups, umask, nice and limits, where not the shell's
    ports: list[int] = Field(default_factory=list)   # the server tree's ports: free before anything is started

    @property
    def argv_file(self) -> str:
        return self.env_file.removesuffix(".env") + ".argv"

    def command(self) -> str:
        pid = int(self.pid)
        argv = " ".join(q(a) for a in self.argv)
        drop = " ".join(q(n) for n in [*self.unset, *sorted(self.set), *(["PYTHONPATH"] if self.path_first else [])])
        add = " ".join(q(f"{k}={v}") for k, v in sorted(self.set.items()))
        first = ":".join(self.path_first)
        log = f'"$HOME"{q(self.log[5:])}' if self.log.startswith("$HOME") else q(self.log)
        want = cmdline_match(self.expect_argv or self.argv)  # printable: \x1f spelled out
        af = q(self.argv_file)
        undo = bool(self.stop_pid_file and self.keep_if_running)
        # a caught (not ignored) HUP/INT/TERM: a dropped connection cannot stop the script half-way, and the
        # server it starts still gets the default handlers; bytes compared as bytes (the C locale)
        parts = ["trap : HUP INT TERM; export LC_ALL=C; " + SAME, TREE]
        run_as = self.run_as if self.run_as is not None and self.run_as.fields() else None
        if run_as is not None and run_as.nice is not None:
            parts.append(NICE)
        spf = q(self.stop_pid_file) if self.stop_pid_file else ""
        if self.stop_pid_file:
            # an interrupted run's restart may still be running on the host ("busy SCRIPT_PID SERVER_PID" in the
            # file): wait for it to end, so this one sees the host as that one left it
            parts.append(f"for i in $(seq 1 {int(self.wait_s * 30)}); do read -r a b c < {spf} 2>/dev/null || break; "
                         f"[ \"$a\" = busy ] && [ \"$b\" != $$ ] && kill -0 \"$b\" 2>/dev/null || break; sleep 0.1; done; ")
        done = f"rm -f {q(self.stop_pid_file)}; " if self.stop_pid_file and self.stop_pid_file != self.pid_file else ""
        if undo:
            done += f"rm -f {af}; "
        if self.keep_if_running:
            k = int(self.keep_if_running)
            parts.append(f"if same {k} {cmdline_match(self.argv)}; then {done}echo \"running pid={k}\"; exit 0; fi; ")
        if self.stop_pid_file:
            parts.append(f"a=; b=; c=; read -r a b c < {spf} 2>/dev/null; [ \"$a\" = busy ] && a=$c; P=${{a//[^0-9]/}}; "
                         "P=${P:-0}; ")
            if self.stop_pid and self.stop_start:
                # no pid file (removed, or /tmp cleaned): the process the journal names, if it is still that one
                sp, ss = int(self.stop_pid), int(self.stop_start)
                parts.append(f"if [ $P = 0 ] && [ \"$(ticks {sp})\" = {ss} ] && same {sp} {want}; then P={sp}; fi; ")
        else:
            parts.append(f"P={pid}; [ $P -gt 0 ] && ! same $P {want} && {{ echo \"pid $P is not the server any more\"; exit 1; }}; ")
        if self.pid_file:
            # from here on an undo knows a restart is under way, and which server it may stop
            # (written whole and renamed: a reader never sees the file empty half-way through a write)
            parts.append(f"(umask 077; echo \"busy $$ $P\" > {q(self.pid_file)}.$$ && mv -f {q(self.pid_file)}.$$ "
                         f"{q(self.pid_file)}); ")
        if self.save_env:
            parts.append(f"(umask 077; cat /proc/{pid}/environ > {q(self.env_file)} && cat /proc/{pid}/cmdline > {af}) "
                         "|| exit 1; ")
        else:
            parts.append(f"[ -s {q(self.env_file)} ] || {{ echo 'the saved environment is missing'; exit 1; }}; ")
        parts.append(
            f"mapfile -d '' E < {q(self.env_file)}; N=(); OLDPP=; for kv in \"${{E[@]}}\"; do keep=1; "
            f"[ \"${{kv%%=*}}\" = PYTHONPATH ] && OLDPP=${{kv#*=}}; "
            f"for u in {drop}; do [ \"${{kv%%=*}}\" = \"$u\" ] && keep=0; done; [ $keep = 1 ] && N+=(\"$kv\"); done; "
            f"N+=({add}); "
        )
        if self.path_first:
            parts.append(f"N+=(\"PYTHONPATH={first}${{OLDPP:+:$OLDPP}}\"); ")
        parts.append(
            f"if [ $P -gt 0 ] && same $P {want}; then {KIDS}kill $P 2>/dev/null; "
            f"for i in $(seq 1 {int(self.wait_s * 10)}); do kill -0 $P 2>/dev/null || break; sleep 0.1; done; "
            f"kill -0 $P 2>/dev/null && kill -9 $P; {REAP}echo \"stopped pid=$P\"; else echo 'no process to stop'; fi; "
        )
        if undo:
            # a server already running as found (an interrupted undo started it): kept, never started twice
            found = cmdline_match(self.argv)
            parts.append(
                f"W=; if [ -s {af} ]; then mapfile -d '' -t WA < {af}; OIFS=$IFS; IFS=$'\\037'; W=\"${{WA[*]}}\"$'\\037'; "
                f"IFS=$OIFS; fi; mapfile -d '' -t SE < {q(self.env_file)}; "
                # the environment compared entry by entry (cmp would trust /proc's size of 0)
                "envis() { local A i; mapfile -d '' -t A 2>/dev/null < /proc/$1/environ || return 1; "
                "[ ${#A[@]} = ${#SE[@]} ] || return 1; for i in \"${!A[@]}\"; do [ \"${A[$i]}\" = \"${SE[$i]}\" ] || return 1; "
                "done; }; F=0; for d in /proc/[0-9]*; do f=${d#/proc/}; "
                f"[ \"$f\" = $$ ] && continue; if [ -n \"$W\" ]; then keyof $f || continue; [ \"$c\" = \"$W\" ] || continue; "
                f"else same $f {found} || continue; fi; [ \"$(readlink $d/cwd 2>/dev/null)\" = {q(self.cwd)} ] && "
                "envis $f && { F=$f; break; }; done; "
                f"if [ $F -gt 0 ]; then {done}echo \"running pid=$F\"; exit 0; fi; "
            )
            start = f"if [ -n \"$W\" ]; then set -- \"${{WA[@]}}\"; else set -- {argv}; fi; "
            run_argv = '"$@"'
        else:
            start, run_argv = "", argv
        launch = f"setsid nohup env -i \"${{N[@]}}\" {run_argv}"
        if run_as is not None:
            launch = run_as.wrap(launch)
        parts.append(port_check(self.ports, self.wait_s))
        parts.append(
            f"L={log}; mkdir -p \"$(dirname \"$L\")\"; echo \"log=$L size=$(stat -c %s \"$L\" 2>/dev/null || echo 0)\"; "
            f"{start}cd {q(self.cwd)} && {{ {launch} >> \"$L\" 2>&1 < /dev/null & }}; "
            "new=$!; "
        )
        note = ""
        if self.pid_file:
            pf = q(self.pid_file)
            # at once, before anything else: an undo after a crash still finds (and stops) what was started; still
            # "busy" while the new process may not yet have become the server (setsid, nohup and env exec in turn)
            parts.append(f"(umask 077; echo \"busy $$ $new\" > {pf}.$$ && mv -f {pf}.$$ {pf}); ")
            note = f"(umask 077; echo $new > {pf}.$$ && mv -f {pf}.$$ {pf}); "
        parts.append(f"sleep 0.3; {note}if kill -0 $new 2>/dev/null; then {done}echo \"started pid=$new start=$(ticks $new)\"; "
                     "else echo 'server exited at start:'; tail -5 \"$L\"; exit 1; fi")
        return f"bash -c {q(''.join(parts))}"  # mapfile and arrays: bash, whatever the login shell is


class Restarted(BaseModel):
    pid: int
    log: str = ""
    log_size: int = 0
    already_running: bool = False
    start: int = 0      # the started process's start time (clock ticks after boot); 0 when not said


def parse_restart(text: str) -> Restarted:
    m = re.search(r"(started|running) pid=(\d+)(?: start=(\d+))?", text)
    if not m:
        raise ParseError("no `started pid=N` line", tool="restart_server", excerpt=text[-120:])
    lg = re.search(r"^log=(.*) size=(\d+)$", text, re.M)
    return Restarted(pid=int(m.group(2)), log=lg.group(1) if lg else "", log_size=int(lg.group(2)) if lg else 0,
                     already_running=m.group(1) == "running", start=int(m.group(3) or 0))


class RestartHook(BaseModel):
    """Run the team's own restart command (``--restart-cmd`` or the host profile's ``restart_cmd``).

    Used where debugagent must not kill the server itself (a systemd unit, a container, a
    supervisor). The hook gets the state to start in environment variables:
    ``DEBUGAGENT_PHASE`` (``experiment`` or ``undo``), ``DEBUGAGENT_ARGV`` (the command
    line, shell-quoted), ``DEBUGAGENT_CWD``, ``DEBUGAGENT_SET_ENV`` (``VAR=VALUE`` lines),
    ``DEBUGAGENT_UNSET_ENV`` (names), ``DEBUGAGENT_PYTHONPATH_FIRST`` (folders to put first
    on ``PYTHONPATH``) and ``DEBUGAGENT_SERVER_PID`` (the pid it replaces; 0 at undo, where the hook
    restarts whatever its service runs).
    """

    model_config = ConfigDict(extra="forbid")
    cmd: str
    phase: str = "experiment"
    pid: int = 0
    argv: list[str]
    cwd: str
    set: dict[str, str] = Field(default_factory=dict)
    unset: list[str] = Field(default_factory=list)
    path_first: list[str] = Field(default_factory=list)

    def command(self) -> str:
        env = {"DEBUGAGENT_PHASE": self.phase, "DEBUGAGENT_ARGV": " ".join(q(a) for a in self.argv),
               "DEBUGAGENT_CWD": self.cwd, "DEBUGAGENT_SET_ENV": "\n".join(f"{k}={v}" for k, v in sorted(self.set.items())),
               "DEBUGAGENT_UNSET_ENV": " ".join(self.unset), "DEBUGAGENT_PYTHONPATH_FIRST": ":".join(self.path_first),
               "DEBUGAGENT_SERVER_PID": str(int(self.pid))}
        exports = " ".join(f"{k}={q(v)}" for k, v in env.items())
        return f"env {exports} bash -c {q(self.cmd)} 2>&1"


# ---------------------------------------------------------------- read-only checks experiments make before acting
# who the server and the shell run as (added after the kept recordings were made: ``replay.legacy_command``)
CONTROL_IDENTITY = "echo '== identity'; " + identity_lines("$p") + "echo '== self_identity'; " + identity_lines("/proc/$$")


class ServerControl(BaseModel):
    """How server ``pid`` runs: its cgroup, its parent, whether it is a container's main process, its stdout, and
    who it runs as (uid, groups, umask, nice, limits) beside who the shell runs as.

    The shell's own cgroup is read too: a cgroup the probing shell shares says nothing.
    """

    model_config = ConfigDict(extra="forbid")
    pid: int

    def command(self) -> str:
        p = f"/proc/{int(self.pid)}"
        return (
            f"p={p}; [ -r $p/cmdline ] || {{ echo 'no such process'; exit 1; }}; "
            "echo '== cgroup'; cat $p/cgroup 2>/dev/null; echo '== self_cgroup'; cat /proc/self/cgroup 2>/dev/null; "
            "echo '== parent'; pp=$(awk '{print $4}' $p/stat 2>/dev/null); echo \"$pp\"; cat /proc/$pp/comm 2>/dev/null; "
            "tr '\\0' ' ' 2>/dev/null < /proc/$pp/cmdline; echo; "
            "echo '== container_env'; tr '\\0' '\\n' 2>/dev/null < $p/environ | grep -E '^container=' ; "
            "echo '== stdout'; readlink $p/fd/1 2>/dev/null; " + CONTROL_IDENTITY + "echo '== end'"
        )


SUPERVISORS = ("supervisord", "supervise", "s6-supervise", "runsv", "circusd", "pm2", "monit", "systemd",
               "containerd-shim", "containerd-shim-runc-v2", "conmon", "docker-init", "tini", "dumb-init")
CONTAINER_MARKS = ("docker", "containerd", "kubepods", "libpod", "lxc", "crio", "machine.slice")


class Control(BaseModel):
    """The typed output of ``server_control``: who would notice a ``kill``."""

    kind: str = "plain"  # plain | systemd | container | supervisor
    unit: str | None = None
    parent_pid: int = 0
    parent: str = ""
    evidence: str = ""
    stdout: str | None = None  # the file the server writes its output to, if it is a file
    identity: Identity | None = None        # who the server runs as (None: not read, an older recording)
    shell_identity: Identity | None = None  # who the shell that would restart it runs as
    runtime: str | None = None              # a container's: its runtime and id, from the server's cgroup path
    container_id: str | None = None

    def run_as(self) -> RunAs | None:
        """What a restart must set for the server to start as found (None: it inherits the shell's, as found)."""
        return RunAs.of(self.identity, self.shell_identity)


def _cgroup_paths(lines: list[str]) -> list[str]:
    """The unified and name=systemd paths (other controllers may be per-process on some hosts)."""
    out = []
    for ln in lines:
        parts = ln.strip().split(":", 2)
        if len(parts) == 3 and parts[1] in ("", "name=systemd"):
            out.append(parts[2])
    return out


@parser("server_control")
def parse_server_control(pid: int, text: str) -> Control:
    sections = split_sections(text, "server_control", ["end"])
    mine = set(_cgroup_paths(sections.get("self_cgroup", [])))
    paths = [c for c in _cgroup_paths(sections.get("cgroup", [])) if c not in mine]
    par = [ln for ln in sections.get("parent", []) if ln.strip()]
    ppid = int(par[0]) if par and par[0].strip().isdigit() else 0
    pcomm = par[1].strip() if len(par) > 1 else ""
    pcmd = par[2].strip() if len(par) > 2 else ""
    out_file = next((s.strip() for s in sections.get("stdout", []) if s.strip().startswith("/")), None)
    if out_file and (out_file.startswith("/dev/") or " (deleted)" in out_file):
        out_file = None
    base = {"parent_pid": ppid, "parent": pcomm, "stdout": out_file,
            "identity": parse_identity(sections.get("identity", [])),
            "shell_identity": parse_identity(sections.get("self_identity", []))}
    for c in paths:
        mark = next((m for m in CONTAINER_MARKS if m in c), None)
        if mark:
            from .shape import container_of
            found = container_of([c], [])
            return Control(kind="container", evidence=f"/proc/{pid}/cgroup: {c}",
                           runtime=found.runtime if found else None, container_id=found.id if found else None, **base)
    if int(pid) == 1 or any(s.strip() for s in sections.get("container_env", [])):
        return Control(kind="container", evidence=f"pid {pid} is its container's main process" if int(pid) == 1
                       else f"its environment has {sections['container_env'][0].strip()}", **base)
    for c in paths:
        leaf = c.rstrip("/").rsplit("/", 1)[-1]
        if leaf.endswith(".service") and not leaf.startswith("user@"):
            return Control(kind="systemd", unit=leaf, evidence=f"/proc/{pid}/cgroup: {c}", **base)
    if ppid > 1 and pcomm in SUPERVISORS:
        return Control(kind="supervisor", evidence=f"its parent is pid {ppid} `{pcomm}` ({pcmd[:120]})", **base)
    return Control(**base)


IMPORT_ROOTS_SCRIPT = r"""
import importlib.util, json, os, sys
repo = os.path.realpath(sys.argv[1])
pp = [os.path.realpath(x) for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
cwd = os.path.realpath(os.getcwd())
out = {"repo": repo, "cwd": cwd, "cwd_in_repo": None, "modules": []}
def rel(p):
    p = os.path.realpath(p)
    return "" if p == repo else (os.path.relpath(p, repo) if p.startswith(repo + os.sep) else None)
out["cwd_in_repo"] = rel(cwd)
paths = [os.path.realpath(x or ".") for x in sys.path]
for m in [a for a in sys.argv[2:] if a]:
    rec = {"module": m}
    try:
        s = importlib.util.find_spec(m)
    except Exception as e:
        rec["error"] = type(e).__name__ + ": " + str(e)[:160]
        out["modules"].append(rec); continue
    if s is None or not (s.origin or s.submodule_search_locations):
        rec["error"] = "not importable"
        out["modules"].append(rec); continue
    where = list(s.submodule_search_locations or [])[:1] or [s.origin]
    root = os.path.dirname(os.path.realpath(where[0]))
    how = ("cwd" if root == cwd and sys.path and sys.path[0] in ("", ".") else "PYTHONPATH" if root in pp
           else "a .pth path" if root in paths else "an editable install's finder")
    rec.update(origin=s.origin, root=root, rel=rel(root), how=how)
    out["modules"].append(rec)
print(json.dumps(out))
"""


class ImportRoots(BaseModel):
    """Where server ``pid``'s interpreter imports ``modules`` from, run in its cwd with its PYTHONPATH, as the user
    the server runs as (``host.as_owner_of``).

    ``importlib.util.find_spec`` on top-level names finds a module without running it: the
    cwd, ``PYTHONPATH``, a ``.pth`` path or an editable install's finder, each with the
    folder relative to ``repo`` when it lies inside the checkout.
    """

    model_config = ConfigDict(extra="forbid")
    pid: int
    python: str
    cwd: str
    repo: str
    modules: list[str]

    def command(self) -> str:
        from .host import as_owner_of
        mods = " ".join(q(m) for m in self.modules)
        return (f"{as_owner_of(self.pid)}cd {q(self.cwd)} && PYTHONPATH=$(tr '\\0' '\\n' < /proc/{int(self.pid)}/environ | "
                f"sed -n 's/^PYTHONPATH=//p' | head -1) $R {q(self.python)} -c {q(IMPORT_ROOTS_SCRIPT.strip())} "
                f"{q(self.repo)} {mods}")

    def display_command(self) -> str:
        return f"cd {self.cwd} && {self.python} -c '<find_spec of {' '.join(self.modules)}>' {self.repo}"


class ImportRoot(BaseModel):
    module: str
    origin: str | None = None
    root: str | None = None
    rel: str | None = None  # relative to the repo; None: outside it
    how: str = ""
    error: str | None = None


class ImportMap(BaseModel):
    repo: str
    cwd: str
    cwd_in_repo: str | None = None
    modules: list[ImportRoot] = Field(default_factory=list)


@parser("import_roots")
def parse_import_roots(text: str) -> ImportMap:
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise ParseError("no JSON line in the output", tool="import_roots", excerpt=text[-120:])
    return ImportMap.model_validate(json.loads(line))


class ServerReady(BaseModel):
    """One readiness check of server ``pid``: a health ``url`` answers, or ``line`` appeared in ``log`` after ``offset``."""

    model_config = ConfigDict(extra="forbid")
    pid: int
    url: str | None = None
    log: str | None = None
    line: str | None = None
    offset: int = 0

    def command(self) -> str:
        s = f"kill -0 {int(self.pid)} 2>/dev/null || {{ echo state=dead; exit 0; }}; "
        if self.url:
            u = q(self.url)
            s += (f"if command -v curl >/dev/null; then curl -fsS -m 3 -o /dev/null {u}; else "
                  f"python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)' {u}; fi "
                  "2>/dev/null && echo state=ready || echo state=waiting")
        elif self.line and self.log:
            s += (f"tail -c +{int(self.offset) + 1} {q(self.log)} 2>/dev/null | grep -qF -- {q(self.line)} "
                  "&& echo state=ready || echo state=waiting")
        else:
            s += "echo state=ready"
        return s


class Readiness(BaseModel):
    state: str


@parser("server_ready")
def parse_server_ready(text: str) -> Readiness:
    m = re.search(r"state=(ready|waiting|dead)", text)
    if not m:
        raise ParseError("no `state=…` line", tool="server_ready", excerpt=text[-80:])
    return Readiness(state=m.group(1))


# ---------------------------------------------------------------- package overlays
class FindWheels(BaseModel):
    """Wheels of ``name`` ``version`` (every version where it is empty) on the host: in ``places`` (wheelhouses,
    wheel paths) and pip's cache."""

    model_config = ConfigDict(extra="forbid")
    name: str
    version: str = ""
    places: list[str] = Field(default_factory=list)

    def command(self) -> str:
        stem = re.sub(r"[-_.]+", "_", self.name)
        pat = q(f"{stem}-{self.version}-*.whl" if self.version else f"{stem}-*.whl")
        places = " ".join(q(p) for p in self.places)
        return (f"for d in {places} \"$HOME/.cache/pip/wheels\" \"$HOME/.cache/pip\"; do "
                f"if [ -f \"$d\" ]; then case \"${{d##*/}}\" in {pat}) echo \"$d\";; esac; "
                f"elif [ -d \"$d\" ]; then find \"$d\" -iname {pat} -type f 2>/dev/null; fi; done | sort -u; true")


class WheelList(BaseModel):
    wheels: list[str]


def wheel_version(path: str) -> str | None:
    """The version a wheel's file name gives (``NAME-VERSION-…whl``, PEP 427)."""
    parts = path.rsplit("/", 1)[-1].split("-")
    return parts[1] if len(parts) >= 5 and path.endswith(".whl") else None


def release_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A version's order, enough to find an older release: its release numbers, then pre-releases (``rc``, ``a``,
    ``b``, ``dev``) before the release and ``.postN`` after it; a local label (``+cu130``) is left out."""
    v = version.split("+", 1)[0].lower()
    m = re.match(r"^v?([0-9]+(?:\.[0-9]+)*)(.*)$", v)
    if not m:
        return ((), 0, 0)
    rel = tuple(int(x) for x in m.group(1).split("."))
    while len(rel) > 1 and rel[-1] == 0:
        rel = rel[:-1]
    rest = m.group(2)
    post = re.search(r"post([0-9]*)", rest)
    pre = re.search(r"(a|b|rc|dev)([0-9]*)", rest)
    return (rel, -1 if pre and not post else 0, int(post.group(1) or 0) if post else 0)


def parse_wheels(text: str) -> WheelList:
    """The wheel paths listed one a line; pip's own lines that name a wheel ("Saved /tmp/…whl", "File was
    already downloaded /tmp/…whl") are not paths, and each path is listed once."""
    wheels: list[str] = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.endswith(".whl") and not re.match(r"(Saved|File was already downloaded) ", ln) and ln not in wheels:
            wheels.append(ln)
    return WheelList(wheels=wheels)


class PipDownload(BaseModel):
    """``pip download NAME==VERSION --no-deps`` into ``dest``, when the host reaches an index."""

    model_config = ConfigDict(extra="forbid")
    python: str
    name: str
    version: str
    dest: str

    def command(self) -> str:
        return (f"{q(self.python)} -m pip download --no-deps --only-binary=:all: --disable-pip-version-check "
                f"--timeout 15 -d {q(self.dest)} {q(f'{self.name}=={self.version}')} 2>&1 | tail -3; "
                f"ls {q(self.dest)}/*.whl")


class OverlayInstall(BaseModel):
    """``pip install --no-deps --target OVERLAY WHEEL``: a build beside the environment, never in it."""

    model_config = ConfigDict(extra="forbid")
    python: str
    wheel: str
    overlay: str

    def command(self) -> str:
        return (f"rm -rf {q(self.overlay)} && {q(self.python)} -m pip install --no-deps --no-index --no-compile "
                f"--disable-pip-version-check -q --target {q(self.overlay)} {q(self.wheel)} 2>&1 | tail -5; "
                f"ls {q(self.overlay)} >/dev/null && echo installed")


class OverlayPackages(BaseModel):
    """The packages as the server would see them with ``overlay`` first on its path (versions, build hashes)."""

    model_config = ConfigDict(extra="forbid")
    python: str
    overlay: str

    def command(self) -> str:
        from .host import PACKAGES_SCRIPT
        return f"PYTHONPATH={q(self.overlay)} {q(self.python)} -c {q(PACKAGES_SCRIPT.strip())}"

    def display_command(self) -> str:
        return f"PYTHONPATH={self.overlay} {self.python} -c '<list distributions, hash compiled files>'"


class RemoveTree(BaseModel):
    """Remove a folder debugagent itself made on the host (a package overlay)."""

    model_config = ConfigDict(extra="forbid")
    path: str

    def command(self) -> str:
        p = self.path.rstrip("/")
        if not re.search(r"/debugagent-[^/]+$", p):
            return f"echo {q('refusing to remove ' + p + ': not a folder debugagent made')}; exit 1"
        return f"rm -rf {q(p)} && echo removed"


class SetPowerLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: int
    watts: float

    def command(self) -> str:
        return f"nvidia-smi -i {int(self.gpu)} -pl {float(self.watts):.2f}"


class ResetClocks(BaseModel):
    """``nvidia-smi -i N -rgc`` (and ``-rmc``): the GPU's clocks back to the driver's default."""

    model_config = ConfigDict(extra="forbid")
    gpu: int
    memory: bool = False

    def command(self) -> str:
        g = int(self.gpu)
        return f"nvidia-smi -i {g} -rgc" + (f" && nvidia-smi -i {g} -rmc" if self.memory else "")


class LockClocks(BaseModel):
    """``nvidia-smi -i N -lgc MIN,MAX`` (and ``-lmc MIN,MAX``): a GPU's clocks locked again as they were found."""

    model_config = ConfigDict(extra="forbid")
    gpu: int
    sm_min: int = Field(ge=0)
    sm_max: int = Field(ge=0)
    mem_min: int | None = Field(default=None, ge=0)
    mem_max: int | None = Field(default=None, ge=0)

    def command(self) -> str:
        g = int(self.gpu)
        out = f"nvidia-smi -i {g} -lgc {int(self.sm_min)},{int(self.sm_max)}"
        if self.mem_max:
            out += f" && nvidia-smi -i {g} -lmc {int(self.mem_min or self.mem_max)},{int(self.mem_max)}"
        return out


class SetGovernor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    governor: str

    def command(self) -> str:
        return (f"for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do echo {q(self.governor)} > \"$f\" || exit 1; done; "
                f"echo governor={q(self.governor)}")


class WorktreeCheckout(BaseModel):
    """Move debugagent's own worktree (never the user's) to another commit, for bisection."""

    model_config = ConfigDict(extra="forbid")
    path: str
    commit: str

    def command(self) -> str:
        return f"git {NO_HOOKS}-C {q(self.path)} checkout -q --detach {q(self.commit)} && git -C {q(self.path)} rev-parse HEAD"


class RemoveFile(BaseModel):
    """Remove a file debugagent itself left on the host (a saved environment)."""

    model_config = ConfigDict(extra="forbid")
    path: str

    def command(self) -> str:
        return f"rm -f {q(self.path)}"
