"""The inference server process: the process table discovery reads, a server's command line, environment
and working directory, and the plain search by command line.

Snapshot field ``server`` (found by ``tools.discovery``, which sends these tools); difference paths
``server.args.FLAG`` and ``server.env.VAR``; fact ``server``.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .. import host, shape
from .base import Add, Gathering, Probe, Tool
from .text import code, plural, table

if TYPE_CHECKING:
    from ..discovery import DiscoveryInput
    from ..snapshot import Snapshot


class ProcessList(BaseModel):
    processes: list[host.ProcessLine]


class Fields(BaseModel):
    server: host.ServerInfo | None = None


def render_process_table(parsed: dict[str, Any], inp: DiscoveryInput | None = None, gpu: list[Any] | None = None) -> list[str]:
    """``process_table``: evidence of which process is the server (found as ``inp`` says: the run's flags and
    the GPU processes it read; by default as discovery finds it with no override), so its row and the counts;
    every process (argv joined by spaces, not the probe's \\x1f) and the listeners in a collapsed block."""
    from ..discovery import DiscoveryInput, candidates, rank
    inp = inp or DiscoveryInput()
    try:
        t = host.ProcTable.model_validate(parsed)
    except ValueError:
        return ["Output: (a process table that could not be read; the raw text is in events.jsonl)"]
    try:
        found, own = candidates(t, list(gpu or []), inp)
    except re.error:   # a --server-pattern that is no regular expression: the run said so; no pattern here
        inp = DiscoveryInput()
        found, own = candidates(t, list(gpu or []), inp)
    found = rank(found, inp)
    head = (f"Output: {plural(len(t.procs), 'process', 'processes')} ({len(own & {p.pid for p in t.procs})} of them "
            f"debugagent's own probe), {plural(len(t.listeners), 'listening TCP port')}; ")
    if found:
        s = found[0]
        ports = f", listening on {', '.join(map(str, s.ports))}" if s.ports else ""
        workers = f", {plural(len(s.workers), 'worker')}" if s.workers else ""
        head += f"the server: pid {s.pid} (parent {s.ppid}{workers}{ports}) {code(shlex.join(s.argv))}"
        if len(found) > 1:
            head += f"; {plural(len(found) - 1, 'other server-like process', 'other server-like processes')}: " + ", ".join(
                f"pid {o.pid}" for o in found[1:])
    else:
        head += "no process whose command line looks like an inference server"
    rows = [[p.pid, p.ppid, code(p.exe) if p.exe else "", code(" ".join(p.argv)), "yes" if p.pid in own else ""]
            for p in t.procs]
    listen = ", ".join(f"{ln.address}:{ln.port}" + (f" (pid {', '.join(map(str, ln.pids))})" if ln.pids else "")
                       for ln in t.listeners) or "none"
    return [head, "<details><summary>every process and listener</summary>", "",
            *table(["pid", "ppid", "executable", "command line", "debugagent's own"], rows), "",
            f"TCP listeners: {listen}", "", "</details>"]


def _find_servers(ev: dict[str, Any]) -> list[str] | None:
    procs = (ev.get("output") or {}).get("processes")
    if procs is None:
        return None
    return table(["pid", "command line"], [[p["pid"], code(shlex.join(p["argv"]))] for p in procs], inline_one=True) if procs else [
        "Output: (no server process)"]


def _process_table(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    return render_process_table(parsed) if parsed.get("procs") is not None else None


def _server_details(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    if not parsed.get("argv"):
        return None
    env = " ".join(f"{k}={v}" for k, v in (parsed.get("env") or {}).items())
    return [f"Output: command line {code(shlex.join(parsed['argv']))}; cwd {code(parsed.get('cwd') or '?')}; "
            f"environment {code(env or '(empty)')}"]


def _server_shape(ev: dict[str, Any]) -> list[str] | None:
    parsed = ev.get("output") or {}
    if not parsed.get("launcher"):
        return None
    return ["Output: " + shape.ServerShape.model_validate(parsed).describe()]


def _fill(g: Gathering) -> dict[str, Any]:
    return {"server": g.discovery.server if g.discovery else None}


def _diff(a: Snapshot, b: Snapshot, add: Add) -> None:
    fa = a.server.flags if a.server else {}
    fb = b.server.flags if b.server else {}
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            add(f"server.args.{k}", fa.get(k), fb.get(k))
    ea = a.server.env if a.server else {}
    eb = b.server.env if b.server else {}
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k) != eb.get(k):
            add(f"server.env.{k}", ea.get(k), eb.get(k))


PROBE = Probe(
    "server",
    tools=(Tool("find_servers", host.FindServers, lambda i, r: ProcessList(processes=host.parse_find_servers(r.stdout)),
                summary=_find_servers, check=True),
           Tool("process_table", host.ProcessTableInput, lambda i, r: host.parse_process_table(r.stdout),
                summary=_process_table, check=True),
           Tool("server_details", host.ServerDetails, lambda i, r: host.parse_server_details(i.pid, r.stdout),
                summary=_server_details, check=True),
           Tool("server_shape", shape.ServerShapeInput, lambda i, r: shape.parse_server_shape(i.pid, r.stdout),
                summary=_server_shape, timeout=60.0)),
    fill=_fill, diff_paths=("server.args.FLAG", "server.env.VAR"), diff=_diff,
    facts=lambda snap, fx: {"server": snap.server.model_dump() if snap.server else None},
)
