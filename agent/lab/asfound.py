""""As found", checked: what each change touches is read before its first change and again after the undo.

The areas (``areas_of``): the server processes (every process the run's server pattern matches, each with its
process tree, command line, environment, folder, listening ports and who it runs as: uid, gid, groups, umask, nice,
resource limits), a checkout (HEAD, its branch, the worktrees
registered), a GPU's power limit, a GPU's idle clocks and clock reasons (a clock lock), the CPU governor, and the run's names under ``/tmp``. A reading is plain
data (``read``: one read-only command, its output parsed); command lines and environment values are kept only as
keyed digests (``journal.digest``: bytes, never decoded text, so a non-UTF-8 byte compares as itself) with the
names beside them. ``compare`` says each difference with the command that fixes it; "the host is as it was
found" is said only when every area read the same.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

from debugagent.tools.discovery import is_debugagent
from debugagent.tools.errors import ParseError
from debugagent.tools.mutate import Identity, LockClocks, parse_identity
from debugagent.tools.recreate import OUTER, inspect_fields
from debugagent.tools.transport import CommandResult, q
from pydantic import BaseModel

MARK = ": debugagent-read-found"
SHELLS = {"bash", "sh", "dash", "zsh", "ksh"}


class Difference(BaseModel):
    area: str
    text: str
    fix: str
    starting: bool = False   # only its ports or its workers differ: a server still loading may not have them yet

    def line(self) -> str:
        return f"{self.text} (fix: {self.fix})"


# ---------------------------------------------------------------- which areas a step's change touches

# variables systemd gives each start of a unit anew (systemd.exec(5)): a unit restarted as found still differs in them
PER_START_ENV = frozenset({"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"})

def ere_literal(text: str) -> str:
    """``text`` as a POSIX extended regular expression that matches it literally."""
    return "".join("\\" + c if c in "\\.[]()*+?{}|^$" else c for c in text)


def server_pattern(pattern: str | None, argv: list[str]) -> str:
    """The run's server pattern, or one made of the found command line's first plain arguments."""
    if pattern:
        return pattern
    plain = [a for a in argv[:3] if a.isascii() and a.isprintable()]
    return ere_literal(" ".join(plain)) if plain else ""


def areas_of(tool: str, inp: dict[str, Any], run_id: str, pattern: str | None) -> dict[str, dict[str, Any]]:
    """{area: how to read it} for the change a step undoes; the run's /tmp names always."""
    out: dict[str, dict[str, Any]] = {"tmp": {"run_id": run_id}}
    if tool in ("restart_server", "restart_hook", "stop_copy"):   # a shadow copy: the server it copies, untouched
        pat = server_pattern(pattern, list(inp.get("argv") or inp.get("found_argv") or []))
        if pat:
            out["server"] = {"pattern": pat}
    if tool in ("supervisor_restore", "systemd_dropin_remove", "container_restore"):
        pat = server_pattern(pattern, list(inp.get("argv") or []))
        if pat:
            out["server"] = {"pattern": pat}
        if tool == "container_restore":
            out[f"container:{inp['runtime']}:{inp['name']}"] = {"runtime": inp["runtime"], "name": inp["name"]}
        path = inp.get("file") or inp.get("path")
        if path:
            out[f"file:{path}"] = {"path": path}
    elif tool == "git_worktree_remove" and inp.get("repo"):
        out[f"repo:{inp['repo']}"] = {"repo": inp["repo"]}
    elif tool == "set_power_limit":
        out[f"gpu:{int(inp.get('gpu', 0))}"] = {"gpu": int(inp.get("gpu", 0))}
    elif tool == "set_governor":
        out["governor"] = {}
    elif tool == "lock_clocks":
        out[f"clocks:{int(inp.get('gpu', 0))}"] = {k: inp.get(k) for k in ("gpu", "sm_min", "sm_max", "mem_min", "mem_max")}
    return out


# ---------------------------------------------------------------- read-only commands (pure)
def read_command(area: str, how: dict[str, Any]) -> str:
    if area == "server":
        return server_command(str(how["pattern"]))
    if area.startswith("repo:"):
        r = q(how["repo"])
        return (f"export GIT_OPTIONAL_LOCKS=0; echo \"head=$(git -C {r} rev-parse HEAD 2>/dev/null)\"; "
                f"echo \"branch=$(git -C {r} symbolic-ref -q HEAD 2>/dev/null)\"; echo '== worktrees'; "
                f"git -C {r} worktree list --porcelain 2>/dev/null | sed -n 's/^worktree //p'; echo '== end'")
    if area.startswith("file:"):
        f = q(how["path"])
        return (f"if [ -e {f} ]; then echo \"sha=$(sha256sum < {f} | cut -d' ' -f1)\"; "
                f"echo \"stat=$(stat -c '%a %u %g %s %Y' {f})\"; else echo absent; fi; echo '== end'")
    if area.startswith("gpu:"):
        return (f"printf 'power_limit=%s\\n' \"$(nvidia-smi -i {int(how['gpu'])} --query-gpu=power.limit "
                "--format=csv,noheader,nounits 2>/dev/null)\"")
    if area.startswith("clocks:"):   # idle: a lock's MIN holds the clocks; the reasons as the driver gives them
        return (f"printf 'clocks=%s\\n' \"$(nvidia-smi -i {int(how['gpu'])} --query-gpu=clocks.sm,clocks.mem,"
                "clocks_throttle_reasons.active --format=csv,noheader,nounits 2>/dev/null)\"")
    if area == "governor":
        return ("printf 'governors=%s\\n' \"$(cat /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor "
                "2>/dev/null | sort | uniq -c | tr -s ' \\n' ' ')\"")
    if area.startswith("container:"):   # on the host the container runs on (``OUTER``), read-only
        return f"{OUTER}{how['runtime']} inspect --type container {q(how['name'])}"
    if area == "tmp":
        return (f"for f in /tmp/debugagent-*{q(how['run_id'])}*; do [ -e \"$f\" ] && printf 'tmp=%s\\n' \"$f\"; done; "
                "echo '== end'")
    raise ValueError(f"unknown area {area}")


def server_command(pattern: str) -> str:
    """Every process whose command line (its arguments joined by spaces) matches ``pattern``: its pid and parent,
    its command line, environment and folder as base64 of their bytes, its listening TCP ports; and each
    process's parent (the trees). Builtins only in the loop over /proc, as the discovery's process table."""
    return (
        f"{MARK}; export LC_ALL=C; pat={q(pattern)}; declare -A port; echo \"self $$\"; "
        "for f in /proc/net/tcp /proc/net/tcp6; do [ -r $f ] || continue; "
        "while read -r _ loc _ st _ _ _ _ _ ino _; do [ \"$st\" = 0A ] && port[$ino]=$((16#${loc##*:})); done < $f; done; "
        "for p in /proc/[0-9]*; do read -r s 2>/dev/null < $p/stat || continue; s=${s##*) }; set -- $s; "
        "echo \"ppid ${p#/proc/} $2\"; mapfile -d '' -t A 2>/dev/null < $p/cmdline || continue; "
        "[ ${#A[@]} -gt 0 ] || continue; m=\"${A[*]}\"; case \"$m\" in *debugagent-read-found*) continue;; esac; "
        "[[ $m =~ $pat ]] || continue; "
        "echo \"== pid ${p#/proc/}\"; echo \"argv $(base64 -w0 < $p/cmdline)\"; "
        "echo \"env $(base64 -w0 2>/dev/null < $p/environ)\"; echo \"cwd $(readlink $p/cwd 2>/dev/null | base64 -w0)\"; "
        "echo \"nice ${17}\"; echo \"status $(grep -E '^(Uid|Gid|Groups|Umask):' $p/status 2>/dev/null | base64 -w0)\"; "
        "echo \"limits $(base64 -w0 2>/dev/null < $p/limits)\"; echo \"cgroup $(base64 -w0 2>/dev/null < $p/cgroup)\"; "
        "for l in $(find $p/fd -lname 'socket:*' -printf '%l\\n' 2>/dev/null); do i=${l#socket:[}; i=${i%]}; "
        "[ -n \"${port[$i]}\" ] && echo \"port ${port[$i]}\"; done; done; echo '== end'"
    )


# ---------------------------------------------------------------- readings (pure)
def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text.strip() or b"", validate=False)
    except ValueError:
        return b""


def parse_server(text: str, digest: Callable[[bytes], str]) -> dict[str, Any] | None:
    """The server processes as trees: each matching process whose ancestors do not match, with its matching
    descendants folded in (workers) and the count of all its descendants."""
    if "== end" not in text:
        return None
    parent: dict[int, int] = {}
    procs: dict[int, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    me = 0
    for ln in text.splitlines():
        key, _, val = ln.partition(" ")
        if key == "self" and val.strip().isdigit():
            me = int(val)
        elif key == "ppid":
            a, _, b = val.partition(" ")
            if a.isdigit() and b.strip().isdigit():
                parent[int(a)] = int(b)
        elif ln.startswith("== pid "):
            pid = int(ln[7:].strip())
            cur = procs[pid] = {"pid": pid, "argv": b"", "env": None, "cwd": "", "ports": set(), "ident": []}
        elif cur is not None and key == "argv":
            cur["argv"] = _b64(val)
        elif cur is not None and key == "env":
            cur["env"] = _b64(val) if val.strip() else None
        elif cur is not None and key == "cwd":
            cur["cwd"] = _b64(val).decode(errors="replace").strip()
        elif cur is not None and key in ("status", "limits"):
            cur["ident"] += _b64(val).decode(errors="replace").splitlines()
        elif cur is not None and key == "cgroup":
            cur["ident"] += ["Cgroup: " + ln for ln in _b64(val).decode(errors="replace").splitlines() if ln.strip()]
        elif cur is not None and key == "nice":
            cur["ident"].append(f"Nice: {val.strip()}")
        elif cur is not None and key == "port" and val.strip().isdigit():
            cur["ports"].add(int(val))

    def ancestors(pid: int) -> list[int]:
        out, seen = [], set()
        while pid in parent and pid not in seen and parent[pid] > 0:
            seen.add(pid)
            pid = parent[pid]
            out.append(pid)
        return out

    def shell_c(argv: bytes) -> bool:
        parts = argv.split(b"\0")
        return len(parts) > 1 and parts[0].rsplit(b"/", 1)[-1].decode(errors="replace") in SHELLS and parts[1] == b"-c"

    def argv_of(p: dict[str, Any]) -> list[str]:
        return [a.decode(errors="replace") for a in p["argv"].split(b"\0") if a]

    # debugagent's own processes (the reading's shell, its ancestors, debugagent and what it runs) are no server,
    # nor a shell running a command line
    chain = {me, *ancestors(me)} if me else set()
    theirs = {me} | {p["pid"] for p in procs.values() if is_debugagent(argv_of(p))}   # what runs under these is theirs
    servers = [p for p in procs.values() if not shell_c(p["argv"]) and p["pid"] not in chain | theirs
               and not any(a in theirs for a in ancestors(p["pid"]))]
    ours = {p["pid"] for p in servers}
    roots = {p["pid"] for p in servers if not any(a in ours for a in ancestors(p["pid"]))}
    trees: list[dict[str, Any]] = []
    for pid in sorted(roots):
        p = procs[pid]
        members = [q_ for q_ in servers if q_["pid"] == pid or pid in ancestors(q_["pid"])]
        ports = sorted(set().union(*(m["ports"] for m in members)))
        descendants = sum(1 for c in parent if pid in ancestors(c))
        env = p["env"]
        entries = [kv for kv in (env or b"").split(b"\0") if kv]
        names = [kv.partition(b"=")[0].decode(errors="replace") for kv in entries]
        trees.append({
            "pid": pid, "argv": digest(p["argv"]),
            "argv_text": " ".join(argv_of(p))[:300],
            "cwd": p["cwd"], "ports": ports, "tree": descendants,
            "env_names": names if env is not None else None,
            "env_digests": [digest(kv.partition(b"=")[2]) for kv in entries] if env is not None else None,
            "identity": ident.model_dump() if (ident := parse_identity(p["ident"])) is not None else None,
        })
    return {"servers": trees}


def parse_reading(area: str, text: str, digest: Callable[[bytes], str]) -> dict[str, Any] | None:
    """An area's reading from its command's output; None when the output is not one (unreadable here)."""
    if area == "server":
        return parse_server(text, digest)
    if area.startswith("repo:"):
        if "== end" not in text:
            return None
        head = re.search(r"^head=(.*)$", text, re.M)
        branch = re.search(r"^branch=(.*)$", text, re.M)
        wts = text.split("== worktrees", 1)[-1].split("== end", 1)[0]
        if not head or not head.group(1).strip():
            return None
        return {"head": head.group(1).strip(), "branch": branch.group(1).strip() if branch else "",
                "worktrees": sorted(w.strip() for w in wts.splitlines() if w.strip())}
    if area.startswith("file:"):
        if "== end" not in text:
            return None
        if re.search(r"^absent$", text, re.M):
            return {"exists": False}
        sha = re.search(r"^sha=([0-9a-f]{64})$", text, re.M)
        st = re.search(r"^stat=(.*)$", text, re.M)
        return {"exists": True, "sha": sha.group(1), "stat": st.group(1).strip()} if sha and st else None
    if area.startswith("gpu:"):
        m = re.search(r"^power_limit=\s*([0-9.]+)", text, re.M)
        return {"power_limit": float(m.group(1))} if m else None
    if area.startswith("clocks:"):
        m = re.search(r"^clocks=\s*([0-9]+),\s*([0-9]+),\s*(0x[0-9A-Fa-f]+|[0-9]+)\s*$", text, re.M)
        if not m:
            return None
        mask = int(m.group(3), 0)
        return {"sm": int(m.group(1)), "mem": int(m.group(2)), "applications_clocks": bool(mask & 0x2)}
    if area == "governor":
        m = re.search(r"^governors=(.*)$", text, re.M)
        return {"governors": m.group(1).strip()} if m and m.group(1).strip() else None
    if area.startswith("container:"):
        return parse_container(text, area.split(":")[1], digest)
    if area == "tmp":
        if "== end" not in text:
            return None
        return {"names": sorted(ln[4:] for ln in text.splitlines() if ln.startswith("tmp="))}
    return None


def parse_container(text: str, runtime: str, digest: Callable[[bytes], str]) -> dict[str, Any] | None:
    """A container as its runtime's inspect says: its id, whether it runs, and each field ``run`` takes back (image,
    command, environment, mounts, ports, …) as a keyed digest (its values may hold secrets); the environment's
    variable names beside their digests."""
    try:
        data = json.loads(text)
        one = data[0] if isinstance(data, list) and len(data) == 1 else data
        if not isinstance(one, dict):
            return None
        fields = inspect_fields(one, runtime)
    except (ValueError, KeyError, TypeError, ParseError):
        return None
    env = [e.partition("=") for e in fields.pop("env")]
    return {"id": fields.pop("id"), "running": fields.pop("running"),
            "fields": {k: digest(json.dumps(v, sort_keys=True).encode()) for k, v in sorted(fields.items())},
            "env_names": [k for k, _, _ in env], "env_digests": [digest(v.encode()) for _, _, v in env]}


def read(run: Callable[[str], CommandResult], area: str, how: dict[str, Any],
         digest: Callable[[bytes], str]) -> dict[str, Any] | None:
    r = run(read_command(area, how))
    got = parse_reading(area, r.stdout, digest) if r.exit_code == 0 else None
    return None if got is None else {"how": how, **got}


# ---------------------------------------------------------------- comparison (pure)
def _server_key(s: dict[str, Any]) -> tuple[Any, ...]:
    env = tuple(zip(s.get("env_names") or [], s.get("env_digests") or [], strict=False))
    ident = json.dumps(s.get("identity"), sort_keys=True)
    return (s["argv"], s["cwd"], tuple(s["ports"]), s["tree"], tuple(sorted(env)) if s.get("env_names") is not None else None,
            ident)


def identity_difference(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str | None:
    """"it runs as uid 0, nice 0, found uid 65534, nice 5": who a server runs as, where it differs from who it was
    found running as (None where it is the same, or either reading lacks it: a journal from before it was read)."""
    if not before or not after:
        return None
    b, a = Identity.model_validate(before), Identity.model_validate(after)
    wrong = a.differs(b)
    return f"it runs as {a.describe(wrong)}, found {b.describe(wrong)}" if wrong else None


def _server_diffs(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[Difference]:
    left_b = list(before)
    left_a = list(after)
    for b in list(left_b):
        m = next((a for a in left_a if _server_key(a) == _server_key(b)), None)
        if m is not None:
            left_b.remove(b)
            left_a.remove(m)
    out: list[Difference] = []
    if len(after) != len(before):
        pids = ", ".join(str(a["pid"]) for a in after) or "none"
        out.append(Difference(area="server", text=f"{len(after)} server process tree(s) run where {len(before)} "
                              f"was found (pids {pids})",
                              fix="; ".join(f"kill {a['pid']}" for a in left_a) if left_a and len(after) > len(before)
                              else "start the server as found: " + "; ".join(f"cd {q(b['cwd'])} && {b['argv_text']}"
                                                                             for b in left_b)))
    for b in left_b:
        a = next((x for x in left_a if x["argv"] == b["argv"]), None) or (left_a[0] if len(left_a) == 1 else None)
        if a is None:
            if len(after) == len(before):
                out.append(Difference(area="server", text=f"the server as found ({b['argv_text'][:160]}) is not running",
                                      fix=f"start it: cd {q(b['cwd'])} && {b['argv_text']}"))
            continue
        left_a.remove(a)
        what = []
        if a["argv"] != b["argv"]:
            what.append(f"its command line is {a['argv_text'][:160]!r}, found {b['argv_text'][:160]!r}")
        if a["cwd"] != b["cwd"]:
            what.append(f"its folder is {a['cwd']}, found {b['cwd']}")
        if a["ports"] != b["ports"]:
            what.append(f"it listens on {a['ports'] or 'no port'}, found {b['ports'] or 'no port'}")
        if a["tree"] != b["tree"]:
            what.append(f"its tree has {a['tree']} descendant process(es), found {b['tree']}")
        who = identity_difference(b.get("identity"), a.get("identity"))
        if who:
            what.append(who)
        if b.get("env_names") is not None and a.get("env_names") is not None:
            eb = dict(zip(b["env_names"], b["env_digests"], strict=False))
            ea = dict(zip(a["env_names"], a["env_digests"], strict=False))
            changed = sorted(n for n in set(eb) | set(ea) if eb.get(n) != ea.get(n) and n not in PER_START_ENV)
            if changed:
                what.append("its environment differs in " + ", ".join(changed))
        if what:
            out.append(Difference(area="server", text=f"server pid {a['pid']}: " + "; ".join(what),
                                  starting=all(w.startswith(("it listens on", "its tree has")) for w in what),
                                  fix=f"kill {a['pid']}, then start the server as found in {b['cwd']}: {b['argv_text']} "
                                      "(with the environment it was found with"
                                      + (f", as {Identity.model_validate(b['identity']).describe()}" if who else "") + ")"))
    return out


def compare(area: str, before: dict[str, Any], after: dict[str, Any] | None) -> list[Difference]:
    """What differs in ``area`` from its reading before the first change; an unreadable area is a difference too
    (nothing says it is as found)."""
    if after is None:
        return [Difference(area=area, text=f"{describe(area)} could not be read again", fix="check it by hand")]
    if area == "server":
        return _server_diffs(before.get("servers", []), after.get("servers", []))
    if area.startswith("repo:"):
        repo = area[5:]
        out = []
        if after["head"] != before["head"] or after["branch"] != before["branch"]:
            back = (f"git -C {q(repo)} checkout {q(before['branch'].removeprefix('refs/heads/'))}" if before["branch"]
                    else f"git -C {q(repo)} checkout --detach {before['head']}")
            out.append(Difference(area=area, text=f"{repo}: HEAD is {after['head'][:12]} "
                                  f"({after['branch'] or 'detached'}), found {before['head'][:12]} "
                                  f"({before['branch'] or 'detached'})", fix=back))
        for w in sorted(set(after["worktrees"]) - set(before["worktrees"])):
            out.append(Difference(area=area, text=f"{repo}: the worktree {w} is registered",
                                  fix=f"git -C {q(repo)} worktree remove --force {q(w)}"))
        for w in sorted(set(before["worktrees"]) - set(after["worktrees"])):
            out.append(Difference(area=area, text=f"{repo}: the worktree {w} is gone", fix=f"git -C {q(repo)} worktree list"))
        return out
    if area.startswith("file:"):
        path = area[5:]
        if all(after.get(k) == before.get(k) for k in ("exists", "sha", "stat")):
            return []
        if not before.get("exists"):
            return [Difference(area=area, text=f"{path} exists, where it was not found", fix=f"rm -f {q(path)}")]
        if not after.get("exists"):
            return [Difference(area=area, text=f"{path} is gone", fix="restore it from a backup")]
        what = "its bytes differ" if after["sha"] != before["sha"] else f"its mode, owner, size or mtime ({after['stat']}) differ"
        return [Difference(area=area, text=f"{path}: {what} from the file as found ({before['stat']})",
                           fix="restore it from the copy the undo step names")]
    if area.startswith("gpu:"):
        g = int(area[4:])
        if abs(after["power_limit"] - before["power_limit"]) > 0.5:
            return [Difference(area=area, text=f"GPU {g}'s power limit is {after['power_limit']:.0f} W, found "
                               f"{before['power_limit']:.0f} W", fix=f"nvidia-smi -i {g} -pl {before['power_limit']:.2f}")]
        return []
    if area.startswith("clocks:"):
        g = int(area[7:])
        if (after["sm"], after["mem"], after["applications_clocks"]) != (before["sm"], before["mem"], before["applications_clocks"]):
            return [Difference(area=area, text=f"GPU {g}'s idle clocks are SM {after['sm']}, memory {after['mem']} MHz, "
                               f"found SM {before['sm']}, memory {before['mem']} MHz",
                               fix=LockClocks.model_validate(before["how"]).command() if before.get("how", {}).get("sm_max")
                               else f"nvidia-smi -i {g} -rgc")]
        return []
    if area == "governor":
        if after["governors"] != before["governors"]:
            gov = before["governors"].split()[-1] if before["governors"].split() else "?"
            return [Difference(area=area, text=f"the CPU governors are {after['governors']}, found {before['governors']}",
                               fix=f"echo {gov} | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")]
        return []
    if area.startswith("container:"):
        return _container_diffs(area, before, after)
    if area == "tmp":
        return [Difference(area=area, text=f"{n} is left in /tmp", fix=f"rm -rf {q(n)}")
                for n in sorted(set(after["names"]) - set(before["names"]))]
    return []


def _container_diffs(area: str, before: dict[str, Any], after: dict[str, Any]) -> list[Difference]:
    _, runtime, name = area.split(":", 2)
    what = []
    if after["id"] != before["id"]:
        what.append(f"it is another container (id {after['id'][:12]}, found {before['id'][:12]})")
    if after["running"] != before["running"]:
        what.append("it is " + ("running" if after["running"] else "not running") + ", found "
                    + ("running" if before["running"] else "not running"))
    fb, fa = before.get("fields") or {}, after.get("fields") or {}
    changed = sorted(k for k in set(fb) | set(fa) if fb.get(k) != fa.get(k))
    if changed:
        what.append("its " + ", ".join(changed) + " differ")
    eb = dict(zip(before.get("env_names") or [], before.get("env_digests") or [], strict=False))
    ea = dict(zip(after.get("env_names") or [], after.get("env_digests") or [], strict=False))
    env = sorted(n for n in set(eb) | set(ea) if eb.get(n) != ea.get(n))
    if env:
        what.append("its environment differs in " + ", ".join(env))
    if not what:
        return []
    return [Difference(area=area, text=f"the {runtime} container {name}: " + "; ".join(what),
                       fix=f"`{runtime} ps -a --filter name={q(name)}` names what runs; the container as found is "
                           f"`{runtime} rename {q(name + '.debugagent-found')} {q(name)}` where it is still set aside")]


def describe(area: str) -> str:
    if area == "server":
        return "the server processes"
    if area.startswith("repo:"):
        return f"the checkout {area[5:]}"
    if area.startswith("file:"):
        return f"the file {area[5:]}"
    if area.startswith("gpu:"):
        return f"GPU {area[4:]}'s power limit"
    if area.startswith("clocks:"):
        return f"GPU {area[7:]}'s clocks"
    if area == "governor":
        return "the CPU governor"
    if area.startswith("container:"):
        _, runtime, name = area.split(":", 2)
        return f"the {runtime} container {name} (its id, state and inspect)"
    return "the run's /tmp names"


def summary(before: dict[str, dict[str, Any]]) -> str:
    """What was checked, in a few words: "1 server process tree, the checkout /srv/repo, the run's /tmp names"."""
    parts = []
    for area in sorted(before):
        if area == "server":
            n = len(before[area].get("servers", []))
            parts.append(f"{n} server process tree{'s' if n != 1 else ''} (command line, environment, folder, ports, "
                         "who it runs as)")
        else:
            parts.append(describe(area))
    return ", ".join(parts)
